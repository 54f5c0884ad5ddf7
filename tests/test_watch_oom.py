"""A watched torchrun job whose rank 1 the kernel's OOM killer takes is said so, with the rank's memory
cgroup and its last journaled place; a plain SIGKILL of a rank in the same cgroup is not. Real
processes, a real memory cgroup with a small limit, the kernel's own OOM killer."""

from __future__ import annotations

import errno
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from watch_support import JOBS, Running, line_in, run_watch, torchrun

from pytest_nccl.core.oom import CgroupVersion, memory_cgroup, parse_oom_kills

JOB = JOBS / "oom_job.py"
LIMIT = 64 << 20   # far below what a rank that imported torch holds: the allocation loop meets it at once
LAST_PLACE = f"the last all_reduce #3 of group default from {JOB}:{line_in(JOB, 'for _ in range(3)') + 1}"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.fixture
def small_memory_cgroup():
    """A memory cgroup of 64 MB below this process's own, removed afterwards (a process of the job
    still in it is killed first): its directory, its path as /proc/PID/cgroup says it, its counter's file."""
    own = memory_cgroup(_read("/proc/self/cgroup"), _read("/proc/self/mountinfo"))
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
            pids = [int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()]
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


def test_a_rank_the_oom_killer_took_is_said_so_with_its_cgroup_and_last_place(tmp_path, small_memory_cgroup):
    directory, path, counter = small_memory_cgroup
    run = run_watch(tmp_path, torchrun(str(JOB), "oom"), "--timeout", "300", OOM_CGROUP=directory,
                    ENDINGS_READY=str(tmp_path / "ready"))
    assert run.code == 3, run.text
    assert parse_oom_kills(_read(counter)) == 1, run.text  # the kernel's own count: it was the OOM killer
    assert f"rank 1 killed by the kernel's OOM killer (SIGKILL; its memory cgroup {path} counted 1 OOM kill) " \
           f"after 3 collectives in group default, {LAST_PLACE}; rank 0 waits in all_reduce #4" in run.stderr, \
        run.stderr


def test_a_plain_sigkill_of_a_rank_in_a_counted_cgroup_is_no_oom_kill(tmp_path, small_memory_cgroup):
    directory, _, counter = small_memory_cgroup
    run = Running(tmp_path, torchrun(str(JOB), "sleeps"), env={"OOM_CGROUP": directory})
    run.wait_ready()
    pid = int(Path(f"{run.ready}.1").read_text())
    assert str(pid) in _read(os.path.join(directory, "cgroup.procs")).split()  # its counter is readable
    os.kill(pid, signal.SIGKILL)
    assert run.end() == 3, run.text
    how = "killed by SIGKILL" if "rank 1 killed by SIGKILL" in run.text else \
        "ended without an exit record (killed by a signal, or os._exit)"
    assert f"rank 1 {how} after 3 collectives in group default, {LAST_PLACE}; rank 0 waits in all_reduce #4" \
           in run.text, run.text
    assert "OOM" not in run.text and parse_oom_kills(_read(counter)) == 0, run.text
