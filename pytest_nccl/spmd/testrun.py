"""One marked test on one launched rank: its store keys, its journal, the watchdog thread every rank
runs (push the journal, snapshot and release on request), and the wait for rank 0's verdict (rank 0's
decider, ``decider.py``, runs beside it there).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback

from ..core.messages import Verdict
from ..core.reports import CallResult, RankReport
from ..core.states import Kind, RankState
from ..rank.stacks import THREAD_PREFIX, format_stacks
from .decider import Decider
from .store import TestKeys, poll
from .timing import TIMING


def read_fd(path: str, offset: int = 0) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


def setup_verdict(headline: str, stop: str | None = None) -> Verdict:
    """The verdict of a test the harness itself could not decide (a failed decider, a silent rank 0)."""
    return Verdict(RankState.FAILED, kind=Kind.SETUP, exception="RankSetupError", recreate=True,
                   headline=headline, stop=stop)


class TestRun:
    """One marked test on this rank. ``group``: the ``LaunchedGroup`` (stores, release); ``trace``:
    the tracer runs; ``leaving()``: what the session does at its end here (this rank's failures
    published), called when this rank has to leave without getting there."""

    __test__ = False  # not a pytest test class

    def __init__(self, group, nodeid: str, key: str, bound: float, trace: bool, leaving=lambda: None,
                 poll_signals=lambda: None):
        self.group, self.nodeid, self.bound, self.trace = group, nodeid, bound, trace
        self.leaving, self.poll_signals = leaving, poll_signals
        self.keys = TestKeys(key)
        self.rank, self.world = group.rank, group.world
        # the journal lives in memory (memfd): nothing is left behind by a rank that dies or is stuck
        self.journal_fd = os.memfd_create(f"pytest-nccl-journal-{self.rank}")
        self.journal_path = f"/proc/self/fd/{self.journal_fd}"
        self.running = False                   # in the test's set-up or body on this rank
        self.user_depth = 0                    # > 0 while a fixture or the body runs (may be interrupted)
        self.tracing = False
        self.interrupt = False                 # the decider aborted the test: interrupt the body
        self.bound_reached = False             # the interrupt was raised in the body once
        self.interrupted_by = ""               # an ending signal this rank got during the test (its name)
        self.finished = threading.Event()      # the main thread has the verdict
        self.t0_wall = time.time()
        self.result: CallResult | None = None  # rank 0: what the decider concluded
        self.report = ""                       # rank 0: the failure's report text
        self.threads: list[threading.Thread] = []

    def start(self, decider: bool = True) -> None:
        self.t0_wall = time.time()
        self.group.store.set(self.keys.start(self.rank), repr(self.t0_wall))
        self.threads.append(threading.Thread(target=self._guard, args=(self._watch, False),
                                             name=THREAD_PREFIX + "watchdog", daemon=True))
        if self.rank == 0 and decider:
            self.threads.append(threading.Thread(target=self._guard, args=(Decider(self).decide, True),
                                                 name=THREAD_PREFIX + "decider", daemon=True))
        for t in self.threads:
            t.start()

    def _guard(self, fn, deciding: bool) -> None:
        try:
            fn()
        except BaseException:  # never let a harness thread die silently: rank 0 must publish a verdict
            text = traceback.format_exc()
            self.group.debug(f"{threading.current_thread().name} failed:\n{text}")
            if deciding:
                try:
                    self.group.dstore.set(self.keys.verdict, pickle.dumps(setup_verdict(
                        f"pytest-nccl: rank 0's decider failed: {text.strip().splitlines()[-1]}")))
                except Exception:  # already failing: the store's error, whatever it is, adds nothing
                    pass

    # -- every rank: push the journal, snapshot and abort on request ----------------------------------
    def _watch(self) -> None:
        store, keys = self.group.wstore, self.keys
        pushed = 0
        snapped = aborted = verdict_seen = told = False
        next_push = 0.0
        while not self.finished.is_set():
            self.poll_signals()
            if self.interrupted_by and not told:  # rank 0's decider concludes the call as interrupted
                told = True
                store.set(keys.interrupted, self.interrupted_by)
            now = time.monotonic()
            if now >= next_push:
                next_push = now + TIMING.journal_push
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
                    snap = pickle.dumps(RankReport(self.rank, RankState.RUNNING,
                                                   stack=format_stacks(cut_main_to_user=True),
                                                   journal=read_fd(self.journal_path).decode("utf-8", "replace")))
                store.set(keys.snapshot(self.rank), snap)
            if snapped and not aborted and store.check([keys.abort]):
                aborted = True
                self.group.abort(self)
            if aborted and not verdict_seen and store.check([keys.verdict]):
                verdict_seen = True
                decided: Verdict = pickle.loads(store.get(keys.verdict))
                if self.rank in decided.stuck and not self.finished.is_set():
                    self.group.abandon(self)  # does not return while the main thread is stuck
            self.finished.wait(0.02 if not snapped else 0.05)

    # -- main thread -----------------------------------------------------------------------------------
    def publish(self, report: RankReport) -> None:
        """This rank is done with the test: its report, for rank 0's decider."""
        self.group.set(self.keys.outcome(self.rank), pickle.dumps(report))

    def wait_verdict(self) -> Verdict:
        store = self.group.store
        limit = self.bound + TIMING.snapshot_wait + TIMING.release_wait + TIMING.verdict_margin
        if poll(lambda: store.check([self.keys.verdict]), time.monotonic() + limit):
            return pickle.loads(store.get(self.keys.verdict))
        return setup_verdict(f"pytest-nccl: rank {self.rank} got no verdict from rank 0 for {self.nodeid} "
                             f"within {limit:.0f} s", stop="pytest-nccl: rank 0 does not answer; the session stops")

    def close(self) -> None:
        self.finished.set()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=TIMING.release_wait + TIMING.snapshot_wait + 2)
