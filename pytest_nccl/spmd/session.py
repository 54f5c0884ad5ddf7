"""The SPMD session on this rank: the pytest hooks of a launched pytest process and the per-test
protocol (begin, run the body, publish this rank's report, take rank 0's verdict). Quiet ranks
(``quiet``), signals (``signals``), the verdict applied (``verdicts``) and rank 0's decider
(``decider``) live apart.

See ``spmd/__init__.py`` for the whole picture. Registered as a plugin object named ``nccl-spmd``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time

import pytest

from ..core.agreement import Digest
from ..core.messages import Collected, Verdict
from ..core.reports import RankReport
from ..core.states import Backend, Phase
from ..errors import NcclUsageError, RankSetupError
from ..exitcodes import crash_line
from ..interrupts import stop_message
from ..placement import place
from ..rank import libraries
from ..session import item_budget
from ..settings import MarkerArgs, parse_marker
from ..torch_gaps import gap_line
from .collection import collection_difference
from .group import LaunchedGroup
from .launch import Launch
from .outcomes import body_outcome, setup_outcome
from .quiet import silence
from .signals import BoundReached, RankSignals
from .store import COLLECT, DONE, poll, safe_set
from .testrun import TestRun, read_fd
from .timing import TIMING
from .verdicts import apply_verdict, setup_failure_report


def bound_of(item, nccl) -> float:
    """The test's bound as the plugin computes it (marker timeout, session timeout, pytest-timeout)."""
    timeout = nccl.settings.timeout
    try:
        args = parse_marker(item)
    except NcclUsageError:
        args = None
    if args is not None and args.timeout is not None:
        timeout = args.timeout
    return item_budget(item, timeout).bound()


class SpmdSession:
    """Per launched pytest process: the store, the process group, the per-test protocol. Registered
    as a plugin object named ``nccl-spmd``."""

    def __init__(self, config: pytest.Config, nccl, launch: Launch):
        self.config, self.nccl, self.launch = config, nccl, launch
        self.rank, self.world = launch.rank, launch.world
        try:
            placement = place(nccl.settings.backend, launch.local_world, nccl.devices())
        except NcclUsageError as exc:
            raise pytest.UsageError(f"pytest-nccl SPMD mode: {exc}") from None
        # like plugin mode's auto: NCCL when this node has a CUDA device for every local rank
        self.backend, self.backend_why = placement.backend, placement.why
        os.environ.update(placement.library_env(os.environ))  # this process is the rank
        libraries.install()
        self.group = LaunchedGroup(launch, self.backend, self.debug, self.say)
        self.run: TestRun | None = None        # the marked test in progress on this rank
        self.last_nodeid: str | None = None
        self.counts: dict[str, int] = {}
        self.collected = False
        self.done_published = False
        self.signals = RankSignals(self)
        self.failed_here: list[str] = []       # unmarked tests that failed on this rank
        # every test that failed here -> its failure's first line: what is left to say of it when the
        # launcher stops the rank before pytest's summary
        self.failures: dict[str, str] = {}
        self.elsewhere: dict[str, list[int]] = {}  # rank 0: nodeid -> ranks where only they failed
        self.debug_on = os.environ.get("PYTEST_NCCL_DEBUG", "") not in ("", "0")
        self._err_fd = os.dup(2)               # the real stderr, also while pytest captures
        if nccl.settings.trace:
            from ..rank import tracer
            tracer.install()  # before the test modules bind the collectives
        if self.rank != 0:
            silence(config, nccl)
        self.signals.install()

    @contextlib.contextmanager
    def _user_code(self, run: TestRun):
        """Marks fixture set-up and the body: the only places the interrupt signal may raise."""
        if run.bound_reached or run.interrupt:
            run.interrupt = False
            raise BoundReached(f"pytest-nccl: the test's {run.bound:g} s bound was reached on rank {self.rank}")
        run.user_depth += 1
        try:
            yield
        finally:
            run.user_depth -= 1

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        run = self.run
        if run is None or not run.running:
            return (yield)
        with self._user_code(run):
            return (yield)

    def debug(self, text: str) -> None:
        if self.debug_on:
            self._write(f"[pytest-nccl rank {self.rank} debug] {text}")

    def say(self, text: str) -> None:
        self._write(f"[pytest-nccl rank {self.rank}] {text}")

    def _write(self, line: str) -> None:
        try:
            os.write(self._err_fd, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    # -- Mode (session.Mode) ----------------------------------------------------------------------------
    def session_started(self, session) -> None:
        pass  # this process is the rank: nothing to start ahead

    def collection_finished(self, session) -> None:
        pass

    def controller_world(self, request):
        pytest.skip("nccl_world drives a group the plugin starts; under a launcher (SPMD mode) there is none: "
                    "run this test with plain pytest, or mark it @pytest.mark.nccl")

    def run_item(self, item: pytest.Function) -> bool:
        return self.run_test(item)

    def close(self) -> None:
        pass  # the launcher owns the processes; pytest_unconfigure leaves with the others

    def fixture_value(self, name: str, request=None):
        """The rank-side fixtures, with their real values: this process is the rank."""
        if name == "rank":
            return self.rank
        if name == "world_size":
            return self.world
        if name == "backend":
            return self.backend
        if name == "device":
            import torch
            if self.backend == Backend.NCCL:
                return torch.device("cuda", self.launch.local_rank)
            return torch.device("cpu")
        raise KeyError(name)

    def header(self) -> str:
        launch = self.launch
        return (f"nccl: SPMD mode: rank {launch.rank} of {launch.world} launched by {launch.launcher}, "
                f"backend {self.backend} ({self.backend_why}), timeout {self.nccl.settings.timeout:g} s, "
                f"trace {'on' if self.nccl.settings.trace else 'off'}") + gap_line(self.backend)

    def pytest_sessionstart(self, session) -> None:
        self.group.connect()
        self.debug(f"connected to {self.launch.master_addr}:{self.launch.master_port} ({self.launch.launcher})")

    def pytest_collection_finish(self, session) -> None:
        """Every rank must run the same tests in the same order: publish this rank's test ids, compare;
        a difference stops the session on every rank (exit code 4, a usage error)."""
        store = self.group.store
        if store is None:
            return
        ids = [item.nodeid for item in session.items]
        self.group.set(COLLECT.format(self.rank), Collected(ids, session.testsfailed).to_json())
        self.collected = True
        lists: dict[int, Collected] = {}
        gone: list[int] = []
        waiting = set(range(self.world))

        def everyone_collected() -> bool:
            for r in sorted(waiting):
                if store.check([COLLECT.format(r)]):
                    collected = Collected.from_json(store.get(COLLECT.format(r)))
                    if collected.gone:
                        gone.append(r)
                    else:
                        lists[r] = collected
                    waiting.discard(r)
            return not waiting

        poll(everyone_collected, time.monotonic() + TIMING.collect_wait)
        message = collection_difference(lists, self.world, sorted(gone))
        if message:
            if self.rank != 0:
                self.say(message)
            pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)

    def pytest_runtest_setup(self, item):
        """A marked test starts here, before its fixtures: the group exists, the trace and the bound
        cover the set-up."""
        if item.get_closest_marker("nccl") is None or not isinstance(item, pytest.Function):
            return
        try:
            reason = self._runs_here(item)
            bound = bound_of(item, self.nccl)
        except NcclUsageError:
            return  # the plugin's pytest_pyfunc_call reports it, on every rank alike
        if reason:
            raise pytest.skip.Exception(reason, _use_item_location=True)
        self.group.ensure(bound)
        self._begin(item, bound)
        libraries.prepare()  # (after the start: a failure here is this rank's failed set-up, said as one)

    def _runs_here(self, item) -> str | None:
        """Why this test cannot run on the launched group (its world or backend differ), or None."""
        args = parse_marker(item) or MarkerArgs()  # asked only for marked items
        if args.world is not None:
            world = args.world
            if world != self.world:
                return (f"pytest-nccl: {item.name} needs world {world}; the launched group has {self.world} "
                        f"rank{'s' if self.world != 1 else ''}")
        if args.backend is not None:
            backend = args.backend
            if backend != Backend.AUTO and backend != self.backend:
                return f"pytest-nccl: {item.name} needs backend {backend}; the launched group runs {self.backend}"
        return None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        run = self.run
        phase = Phase(call.when)
        if run is not None and run.running and run.nodeid == item.nodeid and phase in (Phase.SETUP, Phase.CALL):
            if not (phase is Phase.SETUP and rep.passed):
                # this rank will not run the body (its set-up failed or skipped): it still takes part
                self._join_without_body(item, rep, run, call)
        return rep

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and "nccl" not in report.keywords and report.nodeid not in self.failed_here:
            self.failed_here.append(report.nodeid)
        if report.failed:
            self.failures.setdefault(report.nodeid, crash_line(report.longrepr) or "failed")
        if Phase(report.when) is Phase.TEARDOWN:
            self.last_nodeid = report.nodeid

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        """Publish what failed here; rank 0 waits for every rank to finish, to name in its summary the
        tests that failed only on other ranks."""
        if self.group.store is None:
            return
        self.signals.finishing = True
        self._publish_done()
        if self.rank != 0:
            return
        done = self.group.wait_done(self._finish_wait())
        mine = set(self.failed_here)
        for r, failed in sorted(done.items()):
            for nodeid in failed:
                if nodeid not in mine:
                    self.elsewhere.setdefault(nodeid, []).append(r)
        if self.elsewhere and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _finish_wait(self) -> float:
        """How long the session's end waits for the other ranks: briefly once interrupted (a rank may
        be gone, and the launcher's or the scheduler's kill follows)."""
        return TIMING.finish_wait if self.signals.got is None else TIMING.interrupted_finish_wait

    def _leaving(self) -> None:
        """This rank leaves before the session ends here (stuck in a test): what the end would do,
        from the watchdog thread (with its own store client: the main thread's may be in use)."""
        self.signals.finishing = True
        self.done_published = True
        safe_set(self.group.wstore, DONE.format(self.rank), json.dumps(self.failed_here))

    def _publish_done(self) -> None:
        if not self.done_published:
            self.done_published = True
            self.group.set(DONE.format(self.rank), json.dumps(self.failed_here))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        """Rank 0 names the tests that failed only on other ranks (unmarked tests run on every rank
        on their own; only rank 0 reports)."""
        if self.rank != 0 or not self.elsewhere:
            return
        terminalreporter.write_sep("=", "pytest-nccl: failed on other ranks only", red=True, bold=True)
        for nodeid, ranks in self.elsewhere.items():
            terminalreporter.write_line(f"FAILED {nodeid} on {'ranks' if len(ranks) > 1 else 'rank'} "
                                        f"{','.join(map(str, ranks))} (their output is not shown: run that "
                                        "test on its own to see it)")

    def pytest_unconfigure(self, config) -> None:
        """Ranks leave together, rank 0 last: the others wait until rank 0 has written its report
        (the launcher stops every rank when one exits with an error), rank 0 until they have left.
        SIGTERM from the launcher is ignored from here on, so that every rank's exit code is its own."""
        self.signals.ignore_sigterm()
        if self.group.store is None:
            return
        if not self.collected:
            self.group.set(COLLECT.format(self.rank), Collected(gone=True).to_json())
            self.collected = True
        self._publish_done()
        self.group.leave_together(self._finish_wait())
        self.group.destroy()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # at the session's end: a stream may be anything by now
                pass

    def _key(self, nodeid: str) -> str:
        n = self.counts[nodeid] = self.counts.get(nodeid, 0) + 1
        digest = hashlib.sha1(nodeid.encode("utf-8", "replace")).hexdigest()[:16]
        return f"t/{digest}/{n}"

    def _begin(self, item, bound: float) -> None:
        self.signals.drain()
        run = TestRun(self.group, item.nodeid, self._key(item.nodeid), bound, self.nccl.settings.trace,
                      leaving=self._leaving, poll_signals=self.signals.poll)
        run.running = True
        if run.trace:
            from ..rank import tracer
            tracer.start(run.journal_path)
            run.tracing = True
        self.run = run
        try:
            run.start()
        except Exception:  # cleanup for any error of the start, which is raised again
            self._end_trace(run)
            run.running = False
            self.run = None
            run.close()
            raise

    def _end_trace(self, run: TestRun) -> tuple[dict, int]:
        if not run.tracing:
            return {}, 0
        run.tracing = False
        from ..rank import tracer
        try:
            return tracer.stop()
        except Exception as exc:  # the tracer on torch's objects, any version: said
            self.debug(f"tracer.stop: {type(exc).__name__}: {exc}")
            return {}, 0

    def _end(self, run: TestRun, report: RankReport) -> Verdict:
        """This rank is done with the test: publish its report, wait for rank 0's verdict."""
        import torch.distributed as dist
        run.running = False
        digest, dangling = self._end_trace(run)
        report.digest = {pg: Digest(*d) for pg, d in digest.items()}
        report.dangling, report.ended, report.initialized = dangling, time.time(), dist.is_initialized()
        report.journal = read_fd(run.journal_path).decode("utf-8", "replace")
        run.publish(report)
        decided = run.wait_verdict()
        run.close()
        try:
            os.close(run.journal_fd)
        except OSError:
            pass
        self.run = None
        if decided.recreate or decided.failed or dangling:
            self.group.need_group = True
        if self.signals.got is not None and not decided.stop:  # got after rank 0 had decided
            decided.stop = stop_message(run.nodeid, signal.Signals(self.signals.got).name)
        return decided

    def run_test(self, item: pytest.Function) -> bool:
        """The body of a marked test on this rank (from the plugin's pytest_pyfunc_call)."""
        __tracebackhide__ = True
        run = self.run
        if run is None or run.nodeid != item.nodeid or not run.running:
            raise RankSetupError(f"pytest-nccl: rank {self.rank} has no distributed run for {item.nodeid} "
                                 "(its set-up did not start one)")
        report, exc = body_outcome(item, self.config, self._user_code(run), self.rank)
        decided = self._end(run, report)
        return apply_verdict(self, item, run, decided, exc)

    def _join_without_body(self, item, rep, run: TestRun, call=None) -> None:
        """This rank's set-up failed or skipped (or the body was never called): publish that as its
        report, wait for the verdict like the ranks that run the body, and report it."""
        decided = self._end(run, setup_outcome(item, rep, self.rank, call))
        setup_failure_report(self, item, rep, run, decided)
