"""The processes one test started (``TestProcesses``), found in /proc by the helper (``intest.py``):
those carrying the test's directory in their environment (every process the test executed, at any
depth, also one its launcher left behind when it died), and the pytest process's descendants
started during the call (the ones it forked: a forked process keeps its parent's initial
environment); never a helper of the pytest process that later tests use too (multiprocessing's
resource tracker and fork server, torch's shm manager)."""

from __future__ import annotations

import os
import signal
import time

from ...core.jobdir import ENV_DIR, process_start
from ...core.messages import TestCall
from ..engine.control import _signal
from ..timing import TIMING

#: processes of the pytest process that serve later tests too: spared (matched in their command line)
SHARED_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver", b"torch_shm_manager")


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

    def __init__(self, call: TestCall, pytest_pid: int, every_test: bool = False):
        self.pytest_pid, self.since = pytest_pid, call.since
        # every_test: the processes of every test of the session (``call.directory`` is their parent)
        self.marker = f"\0{ENV_DIR}={call.directory}{'/' if every_test else chr(0)}".encode()
        self.spared = {os.getpid(), pytest_pid}
        self.until: int | None = None   # the call's end: a process pytest forks later is the next test's

    def _ours(self, pid: int) -> bool:
        start = process_start(pid)
        return start is not None and self.since <= start and (self.until is None or start <= self.until)

    def _shared_helper(self, pid: int) -> bool:
        if _parent(pid) != self.pytest_pid:
            return False
        command = _read(f"/proc/{pid}/cmdline")
        return any(name in command for name in SHARED_HELPERS)

    def find(self) -> list[int]:
        from ..engine import control

        forked = {pid for pid in control.descendants(self.pytest_pid) if self._ours(pid)}
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

    def end(self) -> None:
        """SIGTERM once to each (torchrun stops its workers on the first), then SIGKILL after the watch's
        ``WatchTiming.job_term_wait``."""
        term_wait = TIMING.job_term_wait
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
