"""Where torch's harness decides an adopted test's outcome, and how: pure, tested on data.

The plugin's judge decides every failure (a rank raised, died, hangs, or ranks disagree on a
collective they wait in). Once every rank finished cleanly, torch's harness would have seen exit
codes only, and its rules decide, so that an adopted test passes or skips exactly where it did:

- ``MultiProcessTestCase._check_return_codes``: rank 0's exit code alone decides a skip (the other
  ranks' skip codes are not read); a test in ``skip_return_code_checks`` accepts any exit of its
  ranks, one in ``special_return_code_checks`` expects rank 0 to end with that code (a negative
  code is a signal, as ``multiprocessing`` reports it);
- ``MultiProcContinuousTest``: the first rank, in rank order, that skipped makes the test a skip.

What the plugin saw beyond that (ranks that finished but issued different collectives, which gloo
completes) does not change the outcome: it is a note the plugin shows as a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.exits import signal_name
from ..core.messages import Harness
from ..core.reports import CallResult
from ..core.states import RankState, Reason

#: a test in ``skip_return_code_checks``: any exit code of its ranks is accepted
ANY_EXIT = "any"


@dataclass(frozen=True)
class TorchOutcome:
    """The outcome torch's harness gives a test whose ranks all finished cleanly."""
    skipped: bool = False
    reason: str = ""     # the skip's reason
    note: str = ""       # what the plugin saw that torch's harness does not judge (a warning)


def _expected_exit(result: CallResult, expected) -> bool:
    """Every rank that did not pass ended its process, as the test expects (torch checks rank 0's
    code only; a rank that raised fails the test whatever the expectation)."""
    views = result.ranks
    if any(v.status not in (RankState.PASSED, RankState.DEAD) for v in views):
        return False
    if expected == ANY_EXIT:
        return True
    first = views[0]
    if first.status != RankState.DEAD:
        return expected == 0
    if expected < 0:
        return first.signal_name == signal_name(-expected)
    return first.exit_code == expected


def torch_outcome(result: CallResult, harness: Harness, expected_exit=0) -> TorchOutcome | None:
    """torch's harness's outcome where it decides it (every rank finished cleanly, or ended as the
    test expects), else None: the plugin's verdict stands. ``expected_exit``: 0, a code
    (``special_return_code_checks``) or ``ANY_EXIT`` (``skip_return_code_checks``)."""
    if result.reason != Reason.COMPLETED:
        return None
    views = result.ranks
    note = result.diagnosis.headline if result.diagnosis is not None else ""
    if expected_exit != 0 and harness == Harness.PROCESS and _expected_exit(result, expected_exit):
        return TorchOutcome(note="")
    if any(v.status not in (RankState.PASSED, RankState.SKIPPED) for v in views):
        return None
    if harness == Harness.PROCESS:
        first = views[0]
        if first.status == RankState.SKIPPED:
            return TorchOutcome(True, first.message, note)
        return TorchOutcome(note=note)
    skipped = next((v for v in views if v.status == RankState.SKIPPED), None)
    if skipped is not None:
        return TorchOutcome(True, skipped.message, note)
    return TorchOutcome(note=note)
