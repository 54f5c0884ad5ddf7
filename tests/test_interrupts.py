"""A pytest session interrupted while a test's ranks hang says where each rank was, in that test's
report, then stops as pytest does (interrupts.py, core/call.py): a marked test at world 4, a test
written for torch's ``MultiProcessTestCase`` (adopted), and a test that starts ``torchrun`` itself
(launched), and at world 2 every ending signal. Real signals to a real inner pytest; nothing it
started is left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import assert_no_leftovers, kill_tagged, processes_with_tag
from watch_support import line_in

REPO = Path(__file__).resolve().parents[1]
ENDINGS_JOB = REPO / "tests" / "watch" / "endings_job.py"
REPORT_WITHIN = 6.0  # seconds from the signal to pytest's end (the promise is 2 s; a loaded runner)
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
              "ROLE_RANK", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")

WORLD_2 = """
import time
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_hangs(rank):
    open(f"ready.{rank}", "w").close()
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    time.sleep(600)  # every rank
"""

MARKED = """
import time
import pytest, torch
import torch.distributed as dist


@pytest.mark.nccl(world=4)
def test_hangs(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    open(f"ready.{rank}", "w").close()
    if rank == 2:
        time.sleep(600)  # rank 2
    dist.all_reduce(t)
"""

ADOPTED = """
import time
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class HangTests(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_hangs(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")
        open(f"ready.{self.rank}", "w").close()
        if self.rank == 1:
            time.sleep(600)  # rank 1
        dist.all_reduce(torch.ones(1))
"""

LAUNCHED = f"""
import os, socket, subprocess, sys


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun(tmp_path):
    env = dict(os.environ, ENDINGS_READY=os.path.abspath("ready"))
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                    f"--master-port={{port()}}", {str(ENDINGS_JOB)!r}, "sleeps"], env=env, check=True)
"""


def torchrun(world: int) -> list[str]:
    """The launcher of an SPMD session (``torchrun -m pytest``) of ``world`` ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", "--master-addr=127.0.0.1",
            f"--master-port={port}"]


def interrupt(pytester, source: str, ready: int, sig: int = signal.SIGINT, group: bool = False,
              launcher: list[str] | None = None, to_rank: int | None = None) -> tuple[str, int, float]:
    """Run ``source`` in an inner pytest (under ``launcher``: SPMD mode), wait until ``ready`` ranks
    touched ``ready.R`` (which holds the rank's pid), send ``sig`` (``group``: to its whole process
    group, as a terminal's Ctrl-C or Slurm; ``to_rank``: to that rank alone); its output, exit status,
    and the seconds from the signal to its end."""
    pytester.makepyfile(test_inner=source)
    tag = uuid.uuid4().hex
    # not under this session's follower of the ranks tests start (launched.py): the inner one follows its own
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR" and k not in LAUNCH_ENV}
    env.update(PYTEST_NCCL_TEST_TAG=tag, PYTHONFAULTHANDLER="1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([*(launcher or [sys.executable]), "-m", "pytest", "-p", "no:cacheprovider",
                             "test_inner.py"], cwd=pytester.path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=group or launcher is not None)
    try:
        deadline = time.monotonic() + 120
        while sum((pytester.path / f"ready.{r}").exists() for r in range(ready)) < ready:
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.communicate()[0].decode(errors="replace") if proc.poll() is not None else ""
                pytest.fail(f"the ranks never got ready:\n{out}")
            time.sleep(0.1)
        time.sleep(1.0)
        sent = time.monotonic()
        if group:
            os.killpg(proc.pid, sig)
        elif to_rank is not None:
            os.kill(int((pytester.path / f"ready.{to_rank}").read_text()), sig)
        else:
            proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, _ = proc.communicate(timeout=30)
            pytest.fail(f"pytest outlived {signal.Signals(sig).name} by 60 s:\n{out.decode(errors='replace')}")
        took = time.monotonic() - sent
    except BaseException:
        kill_tagged(tag)  # a launcher's ranks run in sessions of their own: the failed test leaves none
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_no_leftovers(tag, wait=10)
    assert not processes_with_tag(tag)
    return out.decode(errors="replace"), proc.returncode, took


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupt_reports_where_each_rank_was_and_leaves_no_process(pytester, sig):
    """Ctrl-C, SIGTERM or SIGHUP of pytest while ranks hang: the test's report says where each rank
    was, pytest stops with the status it has without the plugin, and every rank and the fork server go
    away."""
    out, code, took = interrupt(pytester, WORLD_2, ready=2, sig=sig)
    line = line_in(pytester.path / "test_inner.py", "# every rank")
    assert f"({sig.name}): rank 1 is busy outside any collective at test_inner.py:{line}: time.sleep(600)" in out, out
    assert f"; rank 0 waits in all_reduce #1 of group default from test_inner.py:{line - 1}" in out, out
    assert f"Interrupted: {sig.name} while test_inner.py::test_hangs ran" in out, out
    # Ctrl-C: pytest's status for an interrupted session; another signal: the process ends by it
    assert code == (2 if sig == signal.SIGINT else -sig) and took < REPORT_WITHIN, (code, took, out)


def test_ctrl_c_during_a_marked_test_at_world_4_names_each_rank(pytester):
    out, code, took = interrupt(pytester, MARKED, ready=4)
    assert code == 2 and took < REPORT_WITHIN, (code, took, out)
    line = line_in(pytester.path / "test_inner.py", "# rank 2")
    assert "interrupted after " in out and f"(SIGINT): rank 2 is busy outside any collective at test_inner.py:" \
           f"{line}: time.sleep(600)" in out, out
    assert "ranks 0,1,3 wait in all_reduce #2 of group default" in out or "ranks 0,1,3 are" in out, out
    assert "Interrupted: SIGINT while test_inner.py::test_hangs ran" in out, out


def test_sigterm_during_an_adopted_multiprocesstestcase_test_names_the_rank_that_never_came(pytester):
    out, code, took = interrupt(pytester, ADOPTED, ready=2, sig=signal.SIGTERM)
    assert code == -signal.SIGTERM and took < REPORT_WITHIN, (code, took, out)
    line = line_in(pytester.path / "test_inner.py", "# rank 1")
    assert f"(SIGTERM): rank 1 is busy outside any collective at test_inner.py:{line}: time.sleep(600)" in out, out
    assert "rank 0 waits in all_reduce #1 of group default" in out, out


def test_ctrl_c_during_a_test_that_runs_torchrun_itself_names_each_rank(pytester):
    out, code, took = interrupt(pytester, LAUNCHED, ready=2)
    assert code == 2 and took < REPORT_WITHIN, (code, took, out)
    sleep, reduce = line_in(ENDINGS_JOB, "time.sleep(600)"), line_in(ENDINGS_JOB, "time.sleep(600)") + 1
    assert f"(SIGINT): rank 1 is busy outside any collective at {ENDINGS_JOB}:{sleep}: time.sleep(600), after 3 " \
           f"collectives in group default; rank 0 waits in all_reduce #4 of group default from " \
           f"{ENDINGS_JOB}:{reduce}" in out, out
    assert "Interrupted: SIGINT while test_inner.py::test_torchrun ran" in out, out


def test_a_terminals_ctrl_c_that_reaches_the_tests_torchrun_too_still_says_where_each_rank_was(pytester):
    """A terminal's Ctrl-C reaches the whole foreground process group: torchrun and its ranks get it as
    pytest does, and end at once. What they left (rank 1's KeyboardInterrupt at its sleep, rank 0 in
    the all_reduce) is the test's report all the same, and pytest stops."""
    out, code, took = interrupt(pytester, LAUNCHED, ready=2, group=True)
    assert code == 2 and took < REPORT_WITHIN, (code, took, out)
    sleep = line_in(ENDINGS_JOB, "time.sleep(600)")
    assert "rank 1 raised KeyboardInterrupt after 3 collectives in group default; rank 0 waits in all_reduce #4 " \
           f"of group default from {ENDINGS_JOB}:{sleep + 1}" in out, out
    assert f'line {sleep}, in run' in out and "Interrupted: SIGINT while test_inner.py::test_torchrun ran" in out, out


SPMD = """
import os, time
import pytest, torch
import torch.distributed as dist


@pytest.mark.nccl
def test_hangs(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    with open(f"ready.{rank}", "w") as f:
        f.write(str(os.getpid()))
    if rank == world_size - 1:
        time.sleep(600)  # the last rank
    dist.all_reduce(t)


@pytest.mark.nccl
def test_never_runs():
    dist.barrier()
"""


@pytest.mark.parametrize("world", [2, 4])
def test_spmd_a_terminals_ctrl_c_reaching_torchrun_and_every_rank_says_where_each_rank_was(pytester, world):
    """``torchrun -m pytest``: the terminal's SIGINT reaches every rank, and torchrun forwards its own to
    each; rank 0's report says where each rank was, and every rank stops after the test."""
    out, code, took = interrupt(pytester, SPMD, ready=world, launcher=torchrun(world), group=True)
    line = line_in(pytester.path / "test_inner.py", "# the last rank")
    last = world - 1
    assert f"(SIGINT): rank {last} is busy outside any collective at test_inner.py:{line}: time.sleep(600)" in out, out
    waits = "rank 0 waits" if world == 2 else "ranks 0-2 wait"
    assert f"{waits} in all_reduce #2 of group default from test_inner.py:{line + 1}" in out, out
    assert "Interrupted: SIGINT while test_inner.py::test_hangs ran" in out and "1 failed in" in out, out
    assert "passed" not in out.split("short test summary info")[-1], out  # test_never_runs did not run
    assert code != 0 and took < REPORT_WITHIN, (code, took, out)


def test_spmd_sigterm_to_torchrun_alone_is_forwarded_and_each_rank_is_named(pytester):
    """A scheduler that signals only the launcher (Kubernetes' SIGTERM to the pod's first process)."""
    out, code, took = interrupt(pytester, SPMD, ready=2, sig=signal.SIGTERM, launcher=torchrun(2))
    line = line_in(pytester.path / "test_inner.py", "# the last rank")
    assert "interrupted after " in out and f"(SIGTERM): rank 1 is busy outside any collective at " \
           f"test_inner.py:{line}: time.sleep(600)" in out, out
    assert "Interrupted: SIGTERM while test_inner.py::test_hangs ran" in out, out
    assert code != 0 and took < REPORT_WITHIN, (code, took, out)


def test_spmd_sigterm_to_one_rank_stuck_in_cxx_is_read_from_the_wakeup_fd(pytester):
    """The rank that gets the signal waits in C++ (its Python handler cannot run): its watchdog reads
    the signal from the wakeup fd, and the report still says where each rank was."""
    source = SPMD.replace("time.sleep(600)", "torch.futures.Future().wait()")
    out, code, took = interrupt(pytester, source, ready=2, sig=signal.SIGTERM, launcher=torchrun(2), to_rank=1)
    line = line_in(pytester.path / "test_inner.py", "# the last rank")
    assert f"(SIGTERM): rank 1 is busy outside any collective at test_inner.py:{line}: " \
           "torch.futures.Future().wait()" in out, out
    assert "Interrupted: SIGTERM while test_inner.py::test_hangs ran" in out, out
    # rank 1 cannot be released from its C++ wait (TIMING.release_wait, 5 s): it is said, and it goes
    assert "rank 1 could not be released" in out and code != 0 and took < REPORT_WITHIN + 5, (code, took, out)


def test_spmd_ctrl_c_in_an_unmarked_test_stops_every_rank_at_the_users_line(pytester):
    """Outside a marked test a rank's Ctrl-C is pytest's own: said at the user's line, the session
    stopped on every rank, the launcher's forward of it taking nothing further."""
    source = """
import os, time


def test_sleeps():
    with open(f"ready.{os.environ['RANK']}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)  # the user's line


def test_never_runs():
    pass
"""
    out, code, took = interrupt(pytester, source, ready=2, launcher=torchrun(2), group=True)
    line = line_in(pytester.path / "test_inner.py", "# the user's line")
    assert f"test_inner.py:{line}: KeyboardInterrupt" in out and "no tests ran" in out, out
    assert "Traceback" not in out.split("no tests ran")[0], out  # no second interrupt's (torchrun's own follows)
    assert code != 0 and took < REPORT_WITHIN, (code, took, out)
