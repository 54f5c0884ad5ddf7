"""Rank 0's decider: a thread beside the test on rank 0 that feeds the referee what every rank
published in the launcher's store, collects the snapshots of the ranks still in the test once it
decides, releases them, asks the judge and publishes the verdict every rank applies."""

from __future__ import annotations

import pickle
import time

from ..core.call import CallDriver, Dumps, Interrupted
from ..core.journal import parse_journal
from ..core.messages import Verdict
from ..core.referee import Referee
from ..core.reports import CallOutcome, RankReport
from ..core.sites import stack_top
from ..core.states import RankState, Reason
from ..interrupts import stop_message
from ..rank.stacks import harness_sites_stripped
from ..views.report import format_report
from .store import naps, poll
from .timing import TIMING


def records(text: str, rank: int) -> list:
    return harness_sites_stripped(parse_journal(text or "", rank))


class Decider:
    """Rank 0's view of one marked test (``test``: this rank's ``testrun.TestRun``) on every rank."""

    def __init__(self, test):
        self.test = test
        self.store, self.keys, self.world = test.group.dstore, test.keys, test.world
        self.published: dict[int, RankReport] = {}    # ranks that published their report
        self.snaps: dict[int, RankReport] = {}      # snapshots of the ranks still in the test once decided
        self.stuck: list[int] = []                  # ranks that could not be released after the bound
        self.referee: Referee | None = None
        self.driver: CallDriver | None = None
        self._sleeps = naps()
        self._journal_cache: dict = {}
        self.gone: set[int] = set()                 # ranks whose process ended in the test (seen here)
        self._next_look = 0.0

    def decide(self) -> None:
        """Run the call's driver (``core.call``) on the store, then publish the verdict."""
        self.referee = Referee(self.world, self.test.bound, time.monotonic(), trace=self.test.trace)
        self._sleeps = naps()
        self.driver = CallDriver(self.referee, self)
        outcome = self.driver.run(backend=self.test.group.backend)
        self._conclude(outcome)

    def _take_reports(self) -> None:
        for r in range(self.world):
            if r not in self.published and self.store.check([self.keys.outcome(r)]):
                report = self.published[r] = pickle.loads(self.store.get(self.keys.outcome(r)))
                if self.referee is not None and r not in self.gone:
                    self.referee.finished(r, report.state.judged, time.monotonic())
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + TIMING.liveness_poll
            self._look_for_ended(now)

    def _look_for_ended(self, now: float) -> None:
        """A rank whose process ended without publishing its report died in the test: DEAD, at once
        (the launcher would stop every rank within its monitor interval, before any bound)."""
        for r in range(self.world):
            if r in self.published or r in self.gone:
                continue
            if self.test.group.ended(r, self.store) and not self.store.check([self.keys.outcome(r)]):
                self.gone.add(r)
                if self.referee is not None:
                    self.referee.finished(r, RankState.DEAD, now)

    # -- the driver's transport: news, snapshots, release --------------------------------------------------
    def receive(self, until: float) -> None:
        """News until ``until``; a rank that got an ending signal (Ctrl-C, the launcher's or Slurm's
        SIGTERM) interrupts the call here, as Ctrl-C does the forked groups' controller."""
        time.sleep(min(next(self._sleeps), max(0.0, until - time.monotonic())))
        self._take_reports()
        if self.driver is not None and self.driver.watching and self.store.check([self.keys.interrupted]):
            raise Interrupted(self.store.get(self.keys.interrupted).decode("ascii", "replace"))

    def dumps(self, reason: Reason, live: list[int]) -> Dumps:
        """Every rank still in the test publishes a snapshot of itself (its watchdog sees the decision)."""
        store, keys = self.store, self.keys
        store.set(keys.decision, reason.value)
        self._look_for_ended(time.monotonic())  # a rank that died answers nothing: not waited for
        waiting = set(live) - self.gone

        def snapshots_in() -> bool:
            for r in sorted(waiting):
                if store.check([keys.snapshot(r)]):
                    raw = store.get(keys.snapshot(r))
                    if raw != b"-":
                        self.snaps[r] = pickle.loads(raw)
                    waiting.discard(r)
            return not waiting

        poll(snapshots_in, time.monotonic() + TIMING.snapshot_wait)
        return Dumps(stacks={r: snap.stack for r, snap in self.snaps.items()}, reports=dict(self.snaps))

    def release(self, live: list[int]) -> None:
        """Abort the test on the ranks still in it; those that cannot leave it within TIMING.release_wait are
        stuck (outside Python): the session stops."""
        self.store.set(self.keys.abort, "1")

        def released() -> bool:
            self._take_reports()
            return all(r in self.published or r in self.gone for r in live)

        poll(released, time.monotonic() + TIMING.release_wait)
        self.stuck = [r for r in live if r not in self.published and r not in self.gone]

    # -- the referee's CallView: the journals the watchdogs pushed ----------------------------------------
    def journals(self) -> dict:
        """Every rank's records so far: from its report, else from what its watchdog appended (read
        again only when it grew)."""
        cache, result = self._journal_cache, {}
        for r in range(self.world):
            length = self._journal_length(r)
            if cache.get(r, (None,))[0] != length:
                if r in self.published:
                    text = self.published[r].journal
                elif length:
                    text = self.store.get(self.keys.journal(r)).decode("utf-8", "replace")
                else:
                    text = ""
                cache[r] = (length, records(text, r))
            result[r] = cache[r][1]
        return result

    def _journal_length(self, r: int) -> int:
        if r in self.published:
            return len(self.published[r].journal) + 1
        key = self.keys.journal_length(r)
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def journal_sizes(self) -> list:
        return [self._journal_length(r) for r in range(self.world)]

    def flight_recorder_journals(self) -> dict | None:
        return None  # not collected in SPMD mode

    # -- the verdict --------------------------------------------------------------------------------------
    def final_journals(self, reports: dict[int, RankReport], dumps: Dumps) -> dict:
        return {r: records(rep.journal, r) for r, rep in reports.items()}

    def reports(self, reason: Reason, running: dict[int, RankReport]) -> dict[int, RankReport]:
        """Every rank's report: a snapshot of a rank that was still in the test, else what it
        published, else where the store says it is (never started the test, or running)."""
        snaps, stuck = self.snaps, self.stuck
        out: dict[int, RankReport] = {}
        for r in range(self.world):
            published, snap = self.published.get(r), snaps.get(r)
            if r in self.gone:
                report = RankReport(r, RankState.DEAD)
                if self.store.check([self.keys.journal(r)]):
                    report.journal = self.store.get(self.keys.journal(r)).decode("utf-8", "replace")
            elif snap is not None:
                report = snap
            elif published is not None:
                report = published
                report.finished_at = max(0.0, published.ended - self.test.t0_wall)
            else:
                started = self.store.check([self.keys.start(r)])
                report = RankReport(r, RankState.RUNNING if started else RankState.NOT_STARTED)
                if self.store.check([self.keys.journal(r)]):
                    report.journal = self.store.get(self.keys.journal(r)).decode("utf-8", "replace")
                if not started:
                    report.message = "never started this test (still in an earlier one, or exited)"
            if published is not None:
                report.output = published.output
            if r in stuck:
                report.message = "could not be released from the test after the bound"
            out[r] = report
        return out

    def _conclude(self, result: CallOutcome) -> None:
        test, stuck = self.test, self.stuck
        test.result = result
        recreate = any(not rep.initialized for rep in self.published.values())
        diag = result.diagnosis
        # interrupted: every rank stops after this test, whatever its outcome (pytest's Ctrl-C)
        interrupted = stop_message(test.nodeid, result.interrupted) if result.interrupted else None
        if diag is None:
            decided = Verdict(result.views[0].status, message=result.views[0].message, recreate=recreate,
                              stop=interrupted)
        else:
            views = result.views
            test.report = format_report(views, diag, result.elapsed, test.bound, test.group.backend)
            stop = None
            if stuck:
                where = "; ".join(f"rank {r} at {stack_top(views[r].stack) or 'unknown'}" for r in stuck)
                stop = (f"pytest-nccl: {'ranks' if len(stuck) > 1 else 'rank'} {','.join(map(str, stuck))} "
                        f"could not be released from {test.nodeid} within {TIMING.release_wait:g} s after "
                        f"{'the interrupt' if result.interrupted else 'its bound'} (stuck outside Python: {where}); "
                        "the session stops here")
                test.report += "\n\n" + stop
            stop = stop or interrupted
            decided = Verdict(RankState.FAILED, kind=diag.kind, headline=diag.headline,
                              exception=diag.exception_name, stuck=stuck, stop=stop, recreate=True)
        self.store.set(self.keys.verdict, pickle.dumps(decided))
