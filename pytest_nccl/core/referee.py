"""The referee: when is the outcome of a distributed call known, and what is it.

Pure (no torch, no processes, no sockets), like xdist's scheduling policies behind
``scheduler/protocol.py``: the forked groups (sockets and journal files) and the SPMD session (the
launcher's store) are transports that feed it what the ranks reported and the time, and do what it
says: keep waiting, or collect the stuck ranks' stacks and conclude. Every rule and the timing
constants of the rules live here, once, and are tested with a fake clock (tests/test_referee.py).

The rules, in the order they are applied:
1. every rank finished: completed;
2. the bound is reached: timeout;
3. a rank failed: give the others ``grace_after_failure`` to finish or fail on their own;
4. a live rank waits in a collective that a finished rank never completed, or on a transfer whose
   peer finished without the matching one: decided (it can never be matched), checked every ``poll``
   from the journals, and every ``flight_recorder_poll`` from the Flight Recorder (collectives
   issued from C++, such as DDP's reducer);
5. no journal grew for ``stall_check`` and every running rank waits on a mismatched collective
   (op, shape, dtype, root, reduce op or split sizes differ at the same position): decided (NCCL
   would hang there for good);
6. no journal grew for ``deadlock_quiet`` and some running ranks are in a certain deadlock
   (``waits.stuck_ranks``): point-to-point transfers nobody can pair (a tag, a peer that differs),
   or collectives of different groups, each waiting for a rank blocked in the other: decided.

A watched job (``pytest-nccl watch``, ``rolling=True``) is not one call but hours of them: there the
bound is for a stall, not for the whole run. It starts again whenever the transport's measure of
progress (``journal_sizes``) changes, and when it is reached while no running rank waits in a
collective (seen in the journals, else in the Flight Recorder; twice, ``poll`` apart): ranks that
compute, evaluate or write a checkpoint are busy, not stuck. So rule 2 reads: a rank has waited in
a collective for ``bound`` seconds and no rank made progress meanwhile (a hang, or a slow rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .diagnosis import first_divergence
from .groups import GroupId, members_of
from .records import RankView
from .states import MISMATCH_KINDS, WAITED_ON, RankState, Reason, Source
from .waits import P2PIndex, stuck_ranks

# -- the predicates of the rules, on the journals read so far (pure: tested on data) --------------

def _running_views(journals: dict, live: dict, views: dict | None = None) -> dict:
    return {r: RankView(r, status=RankState.RUNNING if r in live else
                        (views[r].status if views and r in views else RankState.PASSED), records=journals[r])
            for r in journals}


def waits_for_a_finished_rank(journals: dict, live: dict) -> bool:
    """True when a running rank sits in collective #k of a group while a finished or dead member of
    that group never completed its #k there, or waits on a transfer whose peer finished without the
    matching one: it can never be matched."""
    finished = [r for r in journals if r not in live]
    index = None
    for rank in live:
        current = RankView(rank, records=journals[rank]).current
        if current is None:
            continue
        if GroupId.parse(current.pg).p2p:
            if not current.p2p:
                continue
            index = index or P2PIndex(_running_views(journals, live))
            for p in current.blocking_p2p():
                if p.peer in finished and not index.has_counterpart(rank, current, p):
                    return True
            continue
        members = members_of(current.pg, len(journals))
        for other in finished:
            if other not in members:
                continue
            theirs = [r for r in journals[other] if r.pg == current.pg]
            if len(theirs) < current.seq:
                return True  # it never reached it
            # it left it without completing (raised or died inside); the Flight Recorder's own
            # completion flag is too late to trust for this
            if theirs[current.seq - 1].pending and theirs[current.seq - 1].source == Source.PYTHON:
                return True
    return False


def stuck_on_mismatch(journals: dict, views: dict, live: dict) -> bool:
    """True when every running rank waits in a collective and the first divergence is a mismatch
    (op, shape, dtype, root, reduce op or splits at the same position): it would hang there for good."""
    for rank in live:
        if not any(r.pending and (not r.async_op or r.state in WAITED_ON) for r in journals[rank]):
            return False
    trial = [RankView(r, status=views[r].status, records=journals[r]) for r in range(len(journals))]
    div = first_divergence(trial)
    return div is not None and div.kind in MISMATCH_KINDS


def deadlocked(journals: dict, live: dict) -> bool:
    """True when some running ranks wait on each other (or on finished ranks) in a way that can never
    resolve: transfers with no counterpart, collectives whose missing members are stuck elsewhere."""
    return bool(stuck_ranks(_running_views(journals, live)))


@dataclass(frozen=True)
class Timing:
    """Every timing constant of the rules (each transport's own waits live with it: ``forked/timing.py``,
    ``spmd/timing.py``, ``watch/timing.py``)."""
    grace_after_failure: float = 1.0   # a rank failed: for the others to finish or report their own error
    poll: float = 0.05                 # how often the journals are checked for an unmatchable wait
    stall_check: float = 0.5           # no journal grew for this long: look for a mismatched collective
    deadlock_quiet: float = 1.0        # no journal grew for this long: look for a certain deadlock
    flight_recorder_poll: float = 1.0  # with a rank finished, how often the Flight Recorder is consulted
    settle: float = 0.3                # once decided, for ranks outside any collective to finish too
    # The process group's own timeout is the bound plus this: no 30-minute default wait, and our
    # bound (which started earlier) still fires first, so the report is ours, not gloo's
    # "Timed out waiting 5000ms for send operation to complete".
    pg_timeout_margin: float = 10.0


TIMING = Timing()


class CallView(Protocol):
    """What a transport can tell the referee about the running call, read only when a rule needs it."""

    def journals(self) -> dict:
        """rank -> its collective records so far (every rank of the world)."""

    def journal_sizes(self) -> list:
        """A cheap measure of each rank's journal, to see whether any grew."""

    def flight_recorder_journals(self) -> dict | None:
        """The journals merged with every rank's Flight Recorder, or None when not every rank
        answered (or the transport has none)."""


class Referee:
    """Watches one call of ``world`` ranks that started at ``t0`` with ``bound`` seconds."""

    def __init__(self, world: int, bound: float, t0: float, trace: bool = True, timing: Timing = TIMING,
                 flight_recorder: bool = False, rolling: bool = False):
        self.world, self.bound, self.t0, self.trace, self.timing = world, bound, t0, trace, timing
        self.flight_recorder = flight_recorder
        self.rolling = rolling                      # watch mode: the bound is for a stall (module doc)
        self._progress: list | None = None          # rolling: journal sizes at the last progress
        self._looked = False                        # rolling: a wait seen once at the deadline
        self.deadline = t0 + bound
        self.states: dict[int, RankState] = {}     # ranks that finished (outcome, or died)
        self.failed_at: float | None = None
        self.settle = False                         # give ranks outside collectives a moment first
        self._next_check = t0 + timing.poll
        self._next_stall = t0 + timing.stall_check
        self._next_flight_recorder = t0 + timing.flight_recorder_poll
        self._last_sizes: list | None = None
        self._quiet_since = t0

    # -- what the transport reports ------------------------------------------------------------------
    def finished(self, rank: int, state: RankState, now: float) -> None:
        """``rank`` has an outcome (or died): a failure starts the grace period."""
        self.states[rank] = state
        if state.failure and self.failed_at is None:
            self.failed_at = now

    @property
    def live(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.states]

    # -- what it decides -------------------------------------------------------------------------------
    def step(self, now: float, view: CallView) -> Reason | None:
        """None: keep waiting, at most until ``wake_at()``. A Reason: stop watching."""
        live = self.live
        if not live:
            return Reason.COMPLETED
        if self.rolling:
            self._roll(now, view, live)
        if now >= self.deadline:
            return Reason.TIMEOUT
        if self.failed_at is not None and now >= self.failed_at + self.timing.grace_after_failure:
            return Reason.DECIDED
        if not self.trace or now < self._next_check:
            return None
        self._next_check = now + self.timing.poll
        live_map = dict.fromkeys(live)
        finished_some = len(live) < self.world
        if finished_some and waits_for_a_finished_rank(view.journals(), live_map):
            self.settle = True
            return Reason.DECIDED
        if now >= self._next_stall:
            self._next_stall = now + self.timing.stall_check
            sizes = view.journal_sizes()
            if sizes != self._last_sizes:
                self._last_sizes, self._quiet_since = sizes, now
            else:
                journals = view.journals()
                if stuck_on_mismatch(journals, self._views(), live_map):
                    return Reason.DECIDED
                if now - self._quiet_since >= self.timing.deadlock_quiet - 1e-9 and deadlocked(journals, live_map):
                    return Reason.DECIDED
        if finished_some and self.flight_recorder and now >= self._next_flight_recorder:
            self._next_flight_recorder = now + self.timing.flight_recorder_poll
            merged = view.flight_recorder_journals()
            if merged is not None and waits_for_a_finished_rank(merged, live_map):
                return Reason.DECIDED
        return None

    def _roll(self, now: float, view: CallView, live: list) -> None:
        """Watch mode: progress, or nobody waiting in a collective at the deadline, restarts the bound.
        A wait counts when it is seen twice, ``poll`` apart, with no progress showing meanwhile (not
        a collective caught in the instant it completes; the Flight Recorder's answer may carry
        fresher progress than the transport had)."""
        sizes = view.journal_sizes()
        if sizes != self._progress:
            self._progress, self._looked = sizes, False
            self.deadline = now + self.bound
        elif now >= self.deadline:
            waits = self._someone_waits(view, live)
            if view.journal_sizes() != sizes:
                self._progress, self._looked = view.journal_sizes(), False
                self.deadline = now + self.bound
            elif not waits:
                self._looked = False
                self.deadline = now + self.bound
            elif not self._looked:
                self._looked = True
                self.deadline = now + self.timing.poll

    @staticmethod
    def _someone_waits(view: CallView, live: list) -> bool:
        """A running rank sits in a collective: in its journal, else in the Flight Recorder (issued
        from C++: DDP's reducer)."""
        def waits(journals) -> bool:
            return journals is not None and any(
                RankView(r, records=journals.get(r, [])).current is not None for r in live)
        return waits(view.journals()) or waits(view.flight_recorder_journals())

    def wake_at(self) -> float:
        """The latest time the transport should call ``step`` again, with no news from the ranks."""
        wake = self.deadline
        if self.trace:
            wake = min(wake, self._next_check)
        if self.failed_at is not None:
            wake = min(wake, self.failed_at + self.timing.grace_after_failure)
        return wake

    def _views(self) -> dict:
        return {r: RankView(r, status=self.states.get(r, RankState.RUNNING)) for r in range(self.world)}
