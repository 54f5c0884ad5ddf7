"""One marked test on one launched rank: its store keys, the watchdog thread every rank runs (push
the journal, snapshot and release on request), and rank 0's decider, which feeds what the ranks
published to the referee and publishes the verdict.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback

from ..diagnose import digests_agree, stack_top
from ..journal import parse_journal
from ..records import CallResult, RankState, RankView, Verdict
from ..referee import TIMING, Reason, Referee, is_clean, verdict
from ..report import format_report
from ..stacks import THREAD_PREFIX, format_stacks, harness_sites_stripped
from .store import JOURNAL_PUSH, VERDICT_MARGIN, TestKeys, naps, poll


def records(text: str, rank: int) -> list:
    return harness_sites_stripped(parse_journal(text or "", rank))


def read_fd(path: str, offset: int = 0) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


class TestRun:
    """One marked test on this rank."""

    __test__ = False  # not a pytest test class

    def __init__(self, sp, nodeid: str, key: str, bound: float):
        self.sp, self.nodeid, self.bound = sp, nodeid, bound
        self.keys = TestKeys(key)
        self.rank, self.world = sp.launch.rank, sp.launch.world
        # the journal lives in memory (memfd): nothing is left behind by a rank that dies or is stuck
        self.journal_fd = os.memfd_create(f"pytest-nccl-journal-{self.rank}")
        self.journal_path = f"/proc/self/fd/{self.journal_fd}"
        self.running = False                   # in the test's set-up or body on this rank
        self.user_depth = 0                    # > 0 while a fixture or the body runs (may be interrupted)
        self.tracing = False
        self.interrupt = False                 # the decider aborted the test: interrupt the body
        self.bound_reached = False             # the interrupt was raised in the body once
        self.finished = threading.Event()      # the main thread has the verdict
        self.t0_wall = time.time()
        self.result = None                     # rank 0: (CallResult, Diagnosis | None, report)
        self.threads: list[threading.Thread] = []
        self._journal_cache: dict = {}

    def start(self, decider: bool = True) -> None:
        self.t0_wall = time.time()
        self.sp.group.store.set(self.keys.start(self.rank), repr(self.t0_wall))
        self.threads.append(threading.Thread(target=self._guard, args=(self._watch,),
                                             name=THREAD_PREFIX + "watchdog", daemon=True))
        if self.rank == 0 and decider:
            self.threads.append(threading.Thread(target=self._guard, args=(self._decide,),
                                                 name=THREAD_PREFIX + "decider", daemon=True))
        for t in self.threads:
            t.start()

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException:  # never let a harness thread die silently: rank 0 must publish a verdict
            text = traceback.format_exc()
            self.sp.debug(f"{threading.current_thread().name} failed:\n{text}")
            if fn == self._decide:
                try:
                    self.sp.group.dstore.set(self.keys.verdict, pickle.dumps(Verdict(
                        RankState.FAILED, kind="setup", exception="RankSetupError", recreate=True,
                        headline=f"pytest-nccl: rank 0's decider failed: {text.strip().splitlines()[-1]}")))
                except Exception:
                    pass

    # -- every rank: push the journal, snapshot and abort on request ----------------------------------
    def _watch(self) -> None:
        store, keys = self.sp.group.wstore, self.keys
        pushed = 0
        snapped = aborted = verdict_seen = False
        next_push = 0.0
        while not self.finished.is_set():
            now = time.monotonic()
            if now >= next_push:
                next_push = now + JOURNAL_PUSH
                data = read_fd(self.journal_path, pushed)
                cut = data.rfind(b"\n") + 1  # whole lines only: the decider parses what it has
                if cut:
                    store.append(keys.journal(self.rank), data[:cut])
                    pushed += cut
                    store.set(keys.journal_length(self.rank), str(pushed))
            if not snapped and store.check([keys.decision]):
                snapped = True
                snap = b"-"
                if self.running:
                    snap = pickle.dumps({"stack": format_stacks(cut_main_to_user=True),
                                         "journal": read_fd(self.journal_path).decode("utf-8", "replace")})
                store.set(keys.snapshot(self.rank), snap)
            if snapped and not aborted and store.check([keys.abort]):
                aborted = True
                self.sp.group.abort(self)
            if aborted and not verdict_seen and store.check([keys.verdict]):
                verdict_seen = True
                decided = pickle.loads(store.get(keys.verdict))
                if self.rank in decided.stuck and not self.finished.is_set():
                    self.sp.group.abandon(self)  # does not return while the main thread is stuck
            self.finished.wait(0.02 if not snapped else 0.05)

    # -- rank 0: feed the referee, gather, diagnose, publish the verdict -------------------------------
    def _decide(self) -> None:
        store, world, keys = self.sp.group.dstore, self.world, self.keys
        t0 = time.monotonic()
        referee = Referee(world, self.bound, t0, trace=self.sp.nccl.settings.trace)
        view = _StoreCallView(self, {})
        outs = view.outs
        sleeps = naps()
        while True:
            for r in range(world):
                if r not in outs and store.check([keys.outcome(r)]):
                    outs[r] = pickle.loads(store.get(keys.outcome(r)))
                    referee.finished(r, RankState.of_outcome(outs[r]["status"]), time.monotonic())
            reason = referee.step(time.monotonic(), view)
            if reason is not None:
                break
            time.sleep(min(next(sleeps), max(0.0, referee.wake_at() - time.monotonic())))
        live = [r for r in range(world) if r not in outs]
        snaps: dict[int, dict] = {}
        stuck: list[int] = []
        if live:
            store.set(keys.decision, reason.value)
            waiting = set(live)

            def snapshots_in() -> bool:
                for r in sorted(waiting):
                    if store.check([keys.snapshot(r)]):
                        raw = store.get(keys.snapshot(r))
                        if raw != b"-":
                            snaps[r] = pickle.loads(raw)
                        waiting.discard(r)
                return not waiting

            poll(snapshots_in, time.monotonic() + TIMING.snapshot_wait)
            store.set(keys.abort, "1")

            def released() -> bool:
                for r in live:
                    if r not in outs and store.check([keys.outcome(r)]):
                        outs[r] = pickle.loads(store.get(keys.outcome(r)))
                return all(r in outs for r in live)

            poll(released, time.monotonic() + TIMING.release_wait)
            stuck = [r for r in live if r not in outs]
        self._conclude(outs, snaps, stuck, reason, time.monotonic() - t0)

    def journals(self, outs: dict) -> dict:
        """Every rank's records so far: from its outcome, else from what its watchdog appended
        (read again only when it grew)."""
        store, cache = self.sp.group.dstore, self._journal_cache
        result = {}
        for r in range(self.world):
            length = self.journal_length(r, outs)
            if cache.get(r, (None,))[0] != length:
                if r in outs:
                    text = outs[r]["journal"]
                elif length:
                    text = store.get(self.keys.journal(r)).decode("utf-8", "replace")
                else:
                    text = ""
                cache[r] = (length, records(text, r))
            result[r] = cache[r][1]
        return result

    def journal_length(self, r: int, outs: dict) -> int:
        if r in outs:
            return len(outs[r]["journal"]) + 1
        store = self.sp.group.dstore
        key = self.keys.journal_length(r)
        return int(store.get(key)) if store.check([key]) else 0

    def _views(self, outs: dict, snaps: dict) -> list[RankView]:
        store = self.sp.group.dstore
        views = []
        for r in range(self.world):
            view = RankView(r)
            out, snap = outs.get(r), snaps.get(r)
            if snap is not None:
                view.status = RankState.RUNNING
                view.stack = snap["stack"]
                view.records = records(snap["journal"], r)
            elif out is not None:
                view.status = RankState.of_outcome(out["status"])
                view.records = records(out["journal"], r)
                view.finished_at = max(0.0, out["t_end"] - self.t0_wall)
                view.exc_type, view.exc_text, view.message = out["exc_type"], out["exc_text"], out["message"]
            else:
                started = store.check([self.keys.start(r)])
                view.status = RankState.RUNNING if started else RankState.NOT_STARTED
                if store.check([self.keys.journal(r)]):
                    view.records = records(store.get(self.keys.journal(r)).decode("utf-8", "replace"), r)
                view.message = "" if started else "never started this test (still in an earlier one, or exited)"
            if out is not None:
                view.output = out.get("output", "")
            views.append(view)
        return views

    def _conclude(self, outs: dict, snaps: dict, stuck: list, reason: Reason, elapsed: float) -> None:
        views = self._views(outs, snaps)
        digests = {r: o.get("digest", {}) for r, o in outs.items()} if self.sp.nccl.settings.trace else None
        result = CallResult(ranks=views, reason=reason, outcomes=outs, elapsed=elapsed, bound=self.bound,
                            digests_agree=digests is None or digests_agree(digests, self.world))
        recreate = any(not o.get("initialized", True) for o in outs.values())
        if is_clean(views, reason, digests):
            decided = Verdict(views[0].status, message=views[0].message, recreate=recreate)
            self.result = (result, None, "")
        else:
            for r in stuck:
                views[r].message = "could not be released from the test after the bound"
            diag = verdict(views, reason, self.bound)
            report = format_report(views, diag, elapsed, self.bound, self.sp.backend)
            stop = None
            if stuck:
                where = "; ".join(f"rank {r} at {stack_top(views[r].stack) or 'unknown'}" for r in stuck)
                stop = (f"pytest-nccl: {'ranks' if len(stuck) > 1 else 'rank'} {','.join(map(str, stuck))} "
                        f"could not be released from {self.nodeid} within {TIMING.release_wait:g} s after its "
                        f"bound (stuck outside Python: {where}); the session stops here")
                report += "\n\n" + stop
            decided = Verdict(RankState.FAILED, kind=diag.kind, headline=diag.headline,
                              exception=diag.exception_name, stuck=stuck, stop=stop, recreate=True)
            self.result = (result, diag, report)
        self.sp.group.dstore.set(self.keys.verdict, pickle.dumps(decided))

    # -- main thread -----------------------------------------------------------------------------------
    def wait_verdict(self) -> Verdict:
        store = self.sp.group.store
        limit = self.bound + TIMING.snapshot_wait + TIMING.release_wait + VERDICT_MARGIN
        if poll(lambda: store.check([self.keys.verdict]), time.monotonic() + limit):
            return pickle.loads(store.get(self.keys.verdict))
        return Verdict(RankState.FAILED, kind="setup", exception="RankSetupError", recreate=True,
                       headline=f"pytest-nccl: rank {self.rank} got no verdict from rank 0 for {self.nodeid} "
                                f"within {limit:.0f} s",
                       stop="pytest-nccl: rank 0 does not answer; the session stops")

    def close(self) -> None:
        self.finished.set()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=TIMING.release_wait + TIMING.snapshot_wait + 2)


class _StoreCallView:
    """What the referee reads of a running SPMD test: the journals the watchdogs pushed."""

    def __init__(self, run: TestRun, outs: dict):
        self.run, self.outs = run, outs

    def journals(self) -> dict:
        return self.run.journals(self.outs)

    def journal_sizes(self) -> list:
        return [self.run.journal_length(r, self.outs) for r in range(self.run.world)]

    def flight_recorder_journals(self) -> dict | None:
        return None  # not collected in SPMD mode
