"""The release matrix's cells: what one row says on one release, all world sizes together.

Cells (:func:`cell`), per (row, release), combining the world sizes: ``pass`` (every world
passed), ``skip`` (skipped at every world), ``xfail``, ``·`` (no result yet, or the test was not
collected), ``—`` (the release's env could not be built: said once, under the table), else the
headline of the first failing world, cut to :data:`CELL_HEADLINE` characters, after the other
worlds' outcomes when they differ: ``w2 pass; w4: shape mismatch in all_gather #3 ...``.

The cell's :class:`CellStatus` is what the findings read. Pure, as :mod:`.results`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ...core.states import CaseOutcome, Word
from .results import Results, Run

CELL_HEADLINE = 60
RED_MARK = "\u274c"
NOT_RUN = "\u00b7"
NO_ENV = "\u2014"


class CellStatus(Word):
    """What one matrix cell (a row on a release, all world sizes together) says."""
    RED = "red"          # failed or errored at some world size
    GREEN = "green"      # passed (or failed as expected) at some world size, failed at none
    SKIP = "skip"        # skipped, and passed at no world size
    NONE = "none"        # no result: not run yet, or the test was not collected
    NO_ENV = "noenv"     # the release's env could not be built

    @property
    def verdict(self) -> bool:
        """Says whether the release is good or bad for the row (a red range is bounded by these)."""
        return self in (CellStatus.RED, CellStatus.GREEN)


@dataclass(frozen=True)
class Cell:
    status: CellStatus
    text: str  # for the table (short, | escaped)
    full: str = ""  # the whole headline, with its world prefix (red cells)


def shorten(text: str, n: int = CELL_HEADLINE) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "\u2026"


_MISMATCH = re.compile(r"\b(shape|dtype|op|reduce-op|root|split|p2p peer|p2p tag) mismatch(?: in (\w+))?")
_SKIPPED = re.compile(r"\bskipped (\w+) #")
_RAISED = re.compile(r"\braised (?:[\w.]+\.)?(\w+(?:Error|Exception|Mismatch|Timeout|Failure))\b")
_KILLED = re.compile(r"\b(killed by SIG\w+|exited with code -?\d+)")


def short_headline(headline: str) -> str:
    """The kind of a failure, in a few words, for a matrix cell: ``shape mismatch: all_gather``,
    ``rank skipped all_reduce``, ``hang``, ``AttributeError``; the full headline goes under Findings.
    Falls back to the headline cut to 40 characters."""
    text = " ".join((headline or "").split())
    m = _MISMATCH.search(text)
    if m:
        return f"{m.group(1)} mismatch" + (f": {m.group(2)}" if m.group(2) else "")
    m = _SKIPPED.search(text)
    if m:
        return f"rank skipped {m.group(1)}"
    if " left the test " in text and " wait" in text:
        return "hang: a rank left early"
    if "none completed within" in text or " wait in " in text or " waits in " in text:
        return "hang"
    m = _RAISED.search(text)
    if m:
        return m.group(1)
    m = _KILLED.search(text)
    if m:
        return m.group(1)
    return shorten(text, 40) or "failed"


def md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


PASS, SKIP, XFAIL = "pass", "skip", "xfail"
#: the word of an outcome in a cell; the others read as no result
_WORD = {CaseOutcome.PASSED: PASS, CaseOutcome.SKIPPED: SKIP, CaseOutcome.XFAILED: XFAIL}


def world_result(run: Run | None, nodeid: str) -> tuple[CaseOutcome | CellStatus, str]:
    """(outcome, headline) of one test in one run: its outcome, else ``CellStatus.NONE`` (no result:
    not run, not collected, an outcome this version does not know) or ``CellStatus.NO_ENV``."""
    if run is None:
        return CellStatus.NONE, ""
    if not run.env_ok:
        return CellStatus.NO_ENV, run.env_reason or ""
    rec = run.tests.get(nodeid)
    if rec is not None:
        return rec.outcome or CellStatus.NONE, rec.headline
    if run.problem:
        return CaseOutcome.ERROR, run.problem
    return CellStatus.NONE, ""


def _red(outcome: CaseOutcome | CellStatus) -> bool:
    return isinstance(outcome, CaseOutcome) and outcome.failed


def _word(outcome: CaseOutcome | CellStatus) -> str:
    return _WORD.get(outcome, NOT_RUN) if isinstance(outcome, CaseOutcome) else NOT_RUN


def cell(results: Results, nodeid: str, version: str, worlds: Sequence[int] | None = None) -> Cell:
    worlds = list(worlds if worlds is not None else results.worlds)
    got = [(w, *world_result(results.get(version, w), nodeid)) for w in worlds]
    if any(o is CellStatus.NO_ENV for _, o, _ in got):
        return Cell(CellStatus.NO_ENV, NO_ENV)
    red = [(w, h) for w, o, h in got if _red(o)]
    if red:
        head = red[0][1] or "failed"
        if len(red) == len(got):
            return Cell(CellStatus.RED, md_escape(f"{RED_MARK} {short_headline(head)}"), head)
        others = [f"w{w} {_word(o)}" for w, o, _ in got if not _red(o)]
        where = "/".join(f"w{w}" for w, _ in red)
        return Cell(CellStatus.RED, md_escape("; ".join(others + [f"{where}: {RED_MARK} {short_headline(head)}"])),
                    "; ".join(others + [f"{where}: {head}"]))
    words = [_word(o) for _, o, _ in got]
    status = CellStatus.GREEN if {PASS, XFAIL} & set(words) else (CellStatus.SKIP if SKIP in words else CellStatus.NONE)
    if len(set(words)) <= 1:
        return Cell(status, words[0] if words else NOT_RUN)
    return Cell(status, "; ".join(f"w{w} {word}" for (w, _, _), word in zip(got, words, strict=True)))


def skip_reason(results: Results, nodeid: str) -> str | None:
    """The row's skip reason when every skip of it (all releases, all worlds) gives the same one."""
    reasons = {run.tests[nodeid].headline for run in results.runs.values()
               if nodeid in run.tests and run.tests[nodeid].outcome is CaseOutcome.SKIPPED}
    return reasons.pop() if len(reasons) == 1 and "" not in reasons else None
