"""One call, whatever carries its ranks: the driver every front-end runs.

The referee (``referee.py``) says when the outcome is known; the judge (``judge.py``) says what it
was. Between them, what happens around a call is the same for the forked groups, SPMD and the
watch, and is written here once:

1. the referee's loop: ``step``, and wait for news from the ranks until ``wake_at`` (the grace
   period after a failure is one of the referee's deadlines);
2. once decided on a wait a finished rank can never match, *settle*: ranks outside any collective
   get ``Timing.settle`` to finish too, so the report says "rank 2 left the test" rather than
   catching it mid-return;
3. the dumps of the ranks still running (stacks, their Flight Recorder), their RUNNING reports,
   ending or releasing them;
4. every rank's report to the judge, with the journals (Flight Recorder merged where it answered)
   read only when the call is not clean: one ``CallOutcome``.

A transport implements ``Transport``: the referee's ``CallView`` (journals, their sizes, the Flight
Recorder) plus news until a deadline, dumps, release, and the reports and journals it holds. Pure:
no process, socket or thread here; tested with a fake clock and a fake transport
(tests/test_call.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .diagnosis.wording import TEST, Words
from .flight import with_flight_recorder
from .judge import judge, settled
from .referee import CallView, Referee
from .reports import CallOutcome, RankReport
from .states import RankState, Reason


@dataclass
class Dumps:
    """What the ranks still running answered once the call was decided."""
    stacks: dict[int, str] = field(default_factory=dict)          # rank -> its stacks, every thread
    fr_json: dict[int, str] = field(default_factory=dict)         # rank -> Flight Recorder (JSON text)
    fr_pickle: dict[int, bytes] = field(default_factory=dict)     # rank -> dump in fr_trace's format
    reports: dict[int, RankReport] = field(default_factory=dict)  # a rank's own snapshot (SPMD)


class Transport(CallView, Protocol):
    """What a front-end does for the driver; everything else about a call is the driver's."""

    def receive(self, until: float) -> None:
        """Take what the ranks report until ``until`` at the latest (sooner once something came),
        telling the referee of each rank that finished (``Referee.finished``)."""

    def dumps(self, reason: Reason, live: list[int]) -> Dumps:
        """The call is decided: the stacks of ``live`` (still running) and every rank's Flight
        Recorder that can answer."""

    def release(self, live: list[int]) -> None:
        """The ranks still running leave the call: ended, released, or left to the job's owner."""

    def reports(self, reason: Reason, running: dict[int, RankReport]) -> dict[int, RankReport]:
        """Every rank's report: those that finished, and ``running`` (the live ranks' RUNNING
        reports), with what only the transport knows (output, exit statuses)."""

    def final_journals(self, reports: dict[int, RankReport], dumps: Dumps) -> dict:
        """rank -> its records, for the judge (asked only when the call is not clean)."""


def flight_recorder_merged(journals: dict, dumps: Dumps, world: int, since_ns: int = 0) -> dict:
    """The journals with the Flight Recorder merged in when every rank answered, else as they are."""
    if len(dumps.fr_json) != world or not all(dumps.fr_json.values()):
        return journals
    return with_flight_recorder(journals, dumps.fr_json, since_ns)


class CallDriver:
    """Runs one call of ``referee.world`` ranks through ``transport``; ``clock``: monotonic seconds."""

    def __init__(self, referee: Referee, transport: Transport, clock: Callable[[], float] = time.monotonic):
        self.referee, self.transport, self.clock = referee, transport, clock
        # True while the referee's loop runs: an interrupt a transport raises from ``receive`` is taken
        # only then (SPMD's decider; once decided, the conclusion is not cut short)
        self.watching = False

    def step(self, now: float) -> Reason | None:
        """One look by the referee (for a front-end that runs its own loop: the watch)."""
        return self.referee.step(now, self.transport)

    def watch(self) -> Reason:
        """The referee's loop: step, then news until it wants to look again."""
        while True:
            reason = self.referee.step(self.clock(), self.transport)
            if reason is not None:
                return reason
            self.transport.receive(self.referee.wake_at())

    def settle(self) -> None:
        """Ranks outside any collective get ``Timing.settle`` to finish; it ends as soon as every rank
        still running waits in a collective (nothing more will come)."""
        timing = self.referee.timing
        deadline = self.clock() + timing.settle
        while self.referee.live and self.clock() < deadline:
            if settled(self.transport.journals(), self.referee.live):
                return
            self.transport.receive(min(self.clock() + timing.poll, deadline))

    def conclude(self, reason: Reason, *, bound: float | None = None, elapsed: float | None = None,
                 backend: str = "", trace: bool | None = None, words: Words = TEST,
                 interrupted: str = "") -> CallOutcome:
        """Decided: settle (when the rule asks for it), dumps and RUNNING reports of the ranks still
        running, release them, and the judge (``interrupted``: the signal that ended the call first,
        ``Reason.INTERRUPTED``)."""
        referee, transport = self.referee, self.transport
        if reason == Reason.INTERRUPTED and elapsed is None:  # when it was ended, not once its ranks were released
            elapsed = self.clock() - referee.t0
        if reason == Reason.DECIDED and referee.settle:
            self.settle()
        live = referee.live
        dumps = transport.dumps(reason, live) if live else Dumps()
        running = {r: dumps.reports.get(r) or RankReport(r, RankState.RUNNING, stack=dumps.stacks.get(r, ""))
                   for r in live}
        if live:
            transport.release(live)
        reports = transport.reports(reason, running)
        bound = referee.bound if bound is None else bound
        outcome = judge(reports, referee.world, reason, bound, lambda: transport.final_journals(reports, dumps),
                        elapsed=self.clock() - referee.t0 if elapsed is None else elapsed,
                        trace=referee.trace if trace is None else trace, words=words, interrupted=interrupted)
        outcome.backend = backend
        outcome.fr_json, outcome.fr_pickle = dict(dumps.fr_json), dict(dumps.fr_pickle)
        return outcome

    def run(self, **conclude) -> CallOutcome:
        """The whole call: watch until decided, then conclude. Interrupted while it watches (Ctrl-C,
        or a front-end's ``Interrupted`` for SIGTERM/SIGHUP), the call is concluded on what is known
        then, said as interrupted; a second interrupt during that ends it at once."""
        self.watching, interrupted = True, ""
        try:
            reason = self.watch()
        except KeyboardInterrupt as exc:
            reason, interrupted = Reason.INTERRUPTED, signal_of(exc)
        finally:
            self.watching = False
        return self.conclude(reason, interrupted=interrupted, **conclude)


class Interrupted(KeyboardInterrupt):
    """A signal that ends a call as Ctrl-C does (SIGTERM, SIGHUP), raised by a front-end's handler in
    the thread that runs the call; ``signal``: its name."""

    def __init__(self, signal: str):
        super().__init__(signal)
        self.signal = signal


def signal_of(exc: KeyboardInterrupt) -> str:
    """The name of the signal behind an interrupt: a plain ``KeyboardInterrupt`` is SIGINT's."""
    return exc.signal if isinstance(exc, Interrupted) else "SIGINT"
