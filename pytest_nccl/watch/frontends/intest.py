"""The helper process of a pytest session whose tests start ranks themselves (``launched.py``,
docs/launched.md). It follows each test's directory as ``pytest-nccl watch`` follows a job's: the
same ``engine.Engine`` (monitor, referee, judge, the launcher's attempts, peers that never appear),
with the test as the job and its call as the launcher (``testwatch.TestWatch``: its front-end). On a
verdict it ends every process the test started; when the call returns it judges what the journals
show, ends what is left, and answers.

Why a process of its own and not a thread of pytest: a thread in pytest while a test forks makes
Python (3.12 on) warn about fork in a multi-threaded process and can leave a lock held in the child;
the referee's ticks never take the test's GIL; and it outlives a pytest killed by SIGKILL, and
then ends the test's processes (ranks also end themselves once pytest is gone: ``agent.py``).

A test's processes: ``testprocs.TestProcesses``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from ...core.messages import Quit, TestCall, TestEnded, TestFollowed
from .testprocs import TestProcesses

if TYPE_CHECKING:
    from .testwatch import TestWatch

# the watch itself (monitor, referee, judge: testwatch.py) is imported once a test's processes import
# torch: a session whose tests start none pays for an idle interpreter only
WAIT_FOR_DIR = 0.1      # seconds between two looks for a new test directory (pytest sends nothing per test)


class Helper:
    """The loop: the call whose directory appeared (``TestCall``), until pytest says it ended."""

    def __init__(self, conn: Connection, base: str):
        self.conn, self.base = conn, base
        self.pytest_pid = os.getppid()
        self.call: TestCall | None = None
        self.processes: TestProcesses | None = None
        self.watch: TestWatch | None = None
        self.last = 0              # the last call pytest said ended: its directory may linger

    def run(self) -> int:
        while True:
            message = None
            try:
                if self.conn.poll(self._timeout()):
                    message = self.conn.recv()
            except (EOFError, OSError):
                message = Quit()
            if os.getppid() != self.pytest_pid:  # pytest is gone (killed): so is its test
                message = Quit()
            if isinstance(message, Quit):
                self._abandon()
                # what a test left running before any process of it imported torch: at the latest now
                TestProcesses(TestCall(0, self.base, 1 << 62, 0.0), self.pytest_pid, every_test=True).end()
                # pytest removes the directory at its session's end; killed, it cannot
                shutil.rmtree(self.base, ignore_errors=True)
                return 0
            if isinstance(message, TestEnded):
                self._ended(message)
            self._scan()
            if self.watch is not None:
                self.watch.tick(time.monotonic())

    def _timeout(self) -> float:
        if self.watch is None:
            return WAIT_FOR_DIR
        now = time.monotonic()
        return min(0.2, max(0.02, self.watch.wake_at(now) - now))

    def _scan(self) -> None:
        """A directory of a call newer than the one followed: a process of that test imported torch."""
        try:
            names = os.listdir(self.base)
        except OSError:
            return
        newest = max((c for c in (TestCall.from_name(self.base, n) for n in names) if c is not None),
                     key=lambda c: c.n, default=None)
        if newest is None or newest.n <= self.last or (self.call is not None and newest.n <= self.call.n):
            return
        self._abandon()
        self._follow(newest)

    def _follow(self, call: TestCall) -> None:
        from .testwatch import TestWatch

        self.call, self.processes = call, TestProcesses(call, self.pytest_pid)
        self.watch = TestWatch(call, self.processes)

    def _ended(self, ended: TestEnded) -> None:
        call = ended.call
        self.last = max(self.last, call.n)
        if self.call is None or self.call.n != call.n:  # its directory appeared since the last scan
            self._abandon()
            self._follow(call)
        assert self.watch is not None and self.processes is not None
        watch, processes = self.watch, self.processes
        self.call = self.processes = self.watch = None
        processes.until = ended.until
        verdict = None
        try:
            verdict = watch.conclude(ended.failed, ended.interrupted)
        finally:
            watch.close()
        processes.end()
        self.conn.send(TestFollowed(call.n, verdict))

    def _abandon(self) -> None:
        """No answer will be read: end what the test started (pytest is gone, or moved on)."""
        if self.watch is not None:
            self.watch.close()
        if self.processes is not None:
            self.processes.end()
        self.call = self.processes = self.watch = None


def main(fd: int, base: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is pytest's: it tells us what to end
    helper = Helper(Connection(fd), base)
    try:
        return helper.run()
    except Exception as exc:  # pytest goes on without us: launched.py notices the closed connection
        sys.stderr.write(f"pytest-nccl: the helper that follows tests' own ranks failed: {type(exc).__name__}: {exc}; "
                         "the processes of the test it followed are ended\n")
        # a test whose ranks hang (a desync) would wait for ever: nothing else bounds them
        if helper.processes is not None:
            helper.processes.end()
        return 1
