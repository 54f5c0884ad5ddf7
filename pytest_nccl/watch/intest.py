"""The helper process of a pytest session whose tests start ranks themselves (``launched.py``,
docs/launched.md). It follows each test's directory as ``pytest-nccl watch`` follows a job's: the
same ``cli.Watch`` (monitor, referee, judge, the launcher's attempts, peers that never appear), with
the test as the job and its call as the launcher. On a verdict it ends every process the test
started; when the call returns it judges what the journals show, ends what is left, and answers.

Why a process of its own and not a thread of pytest: a thread in pytest while a test forks makes
Python (3.12 on) warn about fork in a multi-threaded process and can leave a lock held in the child;
the referee's ticks never take the test's GIL; and it outlives a pytest killed by SIGKILL, and
then ends the test's processes (ranks also end themselves once pytest is gone: ``agent.py``).

A test's processes (``TestProcesses``): those carrying the test's directory in their environment
(every process the test executed, at any depth, also one its launcher left behind when it died),
and the pytest process's descendants started since the call began (the ones it forked: a forked
process keeps its parent's initial environment); never a helper of the pytest process that later
tests use too (multiprocessing's resource tracker and fork server, torch's shm manager).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from multiprocessing.connection import Connection

from ..core.judge import launcher_restarts
from ..core.messages import LaunchedVerdict, Quit, TestEnded, TestFollowed, TestStarted
from ..core.referee import TIMING
from ..errors import CollectiveTimeout
from . import control, present
from .cli import Watch
from .finding import Finding
from .jobdir import ENV_DIR, process_start
from .monitor import Monitor

#: processes of the pytest process that serve later tests too: spared (matched in their command line)
SHARED_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver", b"torch_shm_manager")
WAIT_FOR_DIR = 0.05     # seconds between two looks for the directory of the test that runs
IDLE = 1.0              # seconds between two checks that pytest still runs, while no test does
LAUNCHER_GRACE = 10.0   # seconds a launcher has to end its job itself after a rank raised or died


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _parent(pid: int) -> int | None:
    try:
        return int(_read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


class TestProcesses:
    """Every process one test started, found in /proc; ``end`` ends them."""

    __test__ = False

    def __init__(self, started: TestStarted):
        self.pytest_pid, self.since = started.pytest_pid, started.since
        self.marker = f"\0{ENV_DIR}={started.directory}\0".encode()
        self.spared = {os.getpid(), started.pytest_pid}

    def _shared_helper(self, pid: int) -> bool:
        if _parent(pid) != self.pytest_pid:
            return False
        command = _read(f"/proc/{pid}/cmdline")
        return any(name in command for name in SHARED_HELPERS)

    def find(self) -> list[int]:
        forked = {pid for pid in control.descendants(self.pytest_pid) if (process_start(pid) or -1) >= self.since}
        uid = os.getuid()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in self.spared:
                continue
            if pid not in forked:
                try:
                    if os.stat(f"/proc/{pid}").st_uid != uid:
                        continue
                except OSError:
                    continue
                if self.marker not in b"\0" + _read(f"/proc/{pid}/environ"):
                    continue  # a zombie's environment reads empty: never found
            if not self._shared_helper(pid):
                found.append(pid)
        return found

    def wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.find():
            if time.monotonic() >= deadline:
                return False
            time.sleep(TIMING.reap_poll * 4)
        return True

    def end(self, term_wait: float) -> None:
        """SIGTERM once to each (torchrun stops its workers on the first), SIGKILL after ``term_wait``."""
        signalled: set[int] = set()
        deadline = time.monotonic() + term_wait
        while True:
            left = self.find()
            if not left:
                return
            _signal([pid for pid in left if pid not in signalled], signal.SIGTERM)
            signalled.update(left)
            if time.monotonic() >= deadline:
                break
            time.sleep(TIMING.reap_poll)
        for _ in range(20):  # a process may fork while we kill its parent
            left = self.find()
            if not left:
                return
            _signal(left, signal.SIGKILL)
            time.sleep(TIMING.reap_poll)


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def test_words(text: str) -> str:
    """The watch's report names its option; in a test the bound is the plugin's."""
    return text.replace("--timeout", "--nccl-timeout")


class TestWatch(Watch):
    """One test's ranks, followed as the watch follows a command's: the test's call is the launcher,
    ending the job ends every process the test started."""

    __test__ = False

    def __init__(self, started: TestStarted, processes: TestProcesses):
        args = argparse.Namespace(timeout=started.bound, quiet=True, keep_running=False, trace_dir=None, json=None)
        super().__init__(args, [], started.directory)
        self.processes = processes
        self.monitor = Monitor(started.directory, started.bound)
        self.verdict: LaunchedVerdict | None = None   # decided while the test ran

    def tick(self, now: float) -> None:
        if self.verdict is not None:
            return
        self._next_attempt(now)
        if not self.attempt_done and self._step(None, now):
            assert self.finding is not None  # _step reported it
            self.verdict = self._verdict(self.finding, live=True)
        elif self.peers_missing:
            self.verdict = LaunchedVerdict(test_words(self.peers_missing.replace("; ending the job", "")),
                                           CollectiveTimeout.__name__, "", live=True, launcher_sees=False)

    def wake_at(self, now: float) -> float:
        return self.monitor.wake_at(now) if self.verdict is None and not self.attempt_done else now + 0.2

    def conclude(self, failed: bool) -> LaunchedVerdict | None:
        """The test's call returned (``failed``: it raised): the verdict of the run, if any."""
        if self.verdict is not None:
            return self.verdict
        finding = None
        if self.attempt_done:
            if self.earlier and self.earlier[-1][0].restart == self.attempt:  # the launcher gave up
                finding = self.earlier[-1][1]
        else:
            finding = self.monitor.after_exit(time.monotonic(), launcher_ok=not failed)
        return self._verdict(finding, live=False) if finding is not None else None

    def _verdict(self, finding: Finding, live: bool) -> LaunchedVerdict:
        timeout = self.args.timeout
        diag = finding.verdict
        report = test_words(present.report_text(finding, timeout))
        headline = test_words(present.headline(finding, timeout))
        present.to_absolute(finding, timeout)  # the trace with the ranks' own numbers
        diag.headline = headline
        return LaunchedVerdict(headline, diag.exception_name, report, live, launcher_restarts(diag), finding,
                               finding.backend)

    def _end_job(self, launcher, finding: Finding | None = None) -> None:
        if finding is not None and finding.diagnosis is not None and launcher_restarts(finding.diagnosis):
            # a rank raised or died: the test's launcher (mp.spawn's join, torchrun) ends the others and
            # tells the test in its own words (a test may expect them); ours only if it does not
            self.processes.wait_gone(LAUNCHER_GRACE)
        self.processes.end(TIMING.job_term_wait)

    def _report(self, finding, title=None) -> None:
        pass  # the verdict goes to pytest (``_verdict``), not to a terminal


class Helper:
    """The loop: one test at a time, as pytest says (``TestStarted``, ``TestEnded``)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.pytest_pid = os.getppid()
        self.started: TestStarted | None = None
        self.processes: TestProcesses | None = None
        self.watch: TestWatch | None = None

    def run(self) -> int:
        while True:
            timeout = self._timeout()
            message = None
            try:
                if self.conn.poll(timeout):
                    message = self.conn.recv()
            except (EOFError, OSError):
                message = Quit()
            if os.getppid() != self.pytest_pid:  # pytest is gone (killed): so is its test
                message = Quit()
            if isinstance(message, Quit):
                self._abandon()
                return 0
            if isinstance(message, TestStarted):
                self._abandon()
                self.started, self.processes = message, TestProcesses(message)
            elif isinstance(message, TestEnded):
                self._ended(message)
            self._tick()

    def _timeout(self) -> float:
        if self.started is None:
            return IDLE
        if self.watch is None:
            return WAIT_FOR_DIR
        now = time.monotonic()
        return min(0.2, max(0.02, self.watch.wake_at(now) - now))

    def _tick(self) -> None:
        if self.started is None:
            return
        if self.watch is None:
            if not os.path.isdir(self.started.directory):
                return
            assert self.processes is not None
            self.watch = TestWatch(self.started, self.processes)
        self.watch.tick(time.monotonic())

    def _ended(self, ended: TestEnded) -> None:
        started, processes, watch = self.started, self.processes, self.watch
        self.started = self.processes = self.watch = None
        if started is None or started.n != ended.n:
            return
        verdict = None
        if watch is not None or os.path.isdir(started.directory):
            if watch is None:
                assert processes is not None
                watch = TestWatch(started, processes)
            try:
                verdict = watch.conclude(ended.failed)
            finally:
                watch.monitor.close()
            assert processes is not None
            processes.end(TIMING.job_term_wait)
        self.conn.send(TestFollowed(ended.n, verdict))

    def _abandon(self) -> None:
        """No answer will be read: end what the test started (pytest is gone, or moved on)."""
        if self.watch is not None:
            self.watch.monitor.close()
        if self.processes is not None and self.started is not None and os.path.isdir(self.started.directory):
            self.processes.end(TIMING.job_term_wait)
        self.started = self.processes = self.watch = None


def main(fd: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is pytest's: it tells us what to end
    try:
        return Helper(Connection(fd)).run()
    except Exception as exc:  # pytest goes on without us: launched.py notices the closed connection
        sys.stderr.write(f"pytest-nccl: the helper that follows tests' own ranks failed: {type(exc).__name__}: {exc}\n")
        return 1
