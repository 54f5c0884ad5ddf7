"""A real memory cgroup with a small limit, for the tests of the OOM killer's kills (the watch's and
the forked groups'): created below this process's own, removed afterwards."""

from __future__ import annotations

import errno
import os
import signal
import time
import uuid

import pytest

from pytest_nccl.core.oom import CgroupVersion, memory_cgroup

LIMIT = 64 << 20   # far below what a rank that imported torch holds: the allocation loop meets it at once


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.fixture
def small_memory_cgroup():
    """A memory cgroup of 64 MB below this process's own, removed afterwards (a process of the job
    still in it is killed first): its directory, its path as /proc/PID/cgroup says it, its counter's file."""
    own = memory_cgroup(read("/proc/self/cgroup"), read("/proc/self/mountinfo"))
    if own is None:
        pytest.skip("no memory cgroup is mounted where this process can see it")
    name = f"pytest-nccl-oom-{uuid.uuid4().hex[:8]}"
    directory = os.path.join(os.path.dirname(own.counter), name)
    limit = "memory.limit_in_bytes" if own.version is CgroupVersion.V1 else "memory.max"
    try:
        os.mkdir(directory)
    except OSError as exc:
        pytest.skip(f"a memory cgroup cannot be created here (root, or a delegated cgroup v2, is needed): {exc}")
    try:
        try:
            _write(os.path.join(directory, limit), str(LIMIT))
        except OSError as exc:
            pytest.skip(f"the memory cgroup's limit cannot be set here (cgroup v2 without the memory "
                        f"controller delegated to it): {exc}")
        yield directory, own.path.rstrip("/") + "/" + name, os.path.join(directory, own.version.counter_file)
    finally:
        _remove(directory)


def _remove(directory: str) -> None:
    """rmdir once the cgroup is empty: a rank of the job still in it (a test that failed early) is
    killed, and a task just killed leaves the cgroup a moment later (EBUSY until then)."""
    deadline = time.monotonic() + 15.0
    while True:
        try:
            pids = [int(p) for p in read(os.path.join(directory, "cgroup.procs")).split()]
        except OSError:
            pids = []
        for pid in pids:  # only this test's job could have joined a cgroup it created
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
