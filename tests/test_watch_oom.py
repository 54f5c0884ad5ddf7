"""A watched torchrun job whose rank 1 the kernel's OOM killer takes is said so, with the rank's memory
cgroup and its last journaled place; a plain SIGKILL of a rank in the same cgroup is not. Real
processes, a real memory cgroup with a small limit, the kernel's own OOM killer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from memcg_support import read
from watch_support import JOBS, Running, line_in, run_watch, torchrun

from pytest_nccl.core.oom import parse_oom_kills

JOB = JOBS / "oom_job.py"
LAST_PLACE = f"the last all_reduce #3 of group default from {JOB}:{line_in(JOB, 'for _ in range(3)') + 1}"


def test_a_rank_the_oom_killer_took_is_said_so_with_its_cgroup_and_last_place(tmp_path, small_memory_cgroup):
    directory, path, counter = small_memory_cgroup
    run = run_watch(tmp_path, torchrun(str(JOB), "oom"), "--timeout", "300", OOM_CGROUP=directory,
                    ENDINGS_READY=str(tmp_path / "ready"))
    assert run.code == 3, run.text
    assert parse_oom_kills(read(counter)) == 1, run.text  # the kernel's own count: it was the OOM killer
    assert f"rank 1 killed by the kernel's OOM killer (SIGKILL; its memory cgroup {path} counted 1 OOM kill) " \
           f"after 3 collectives in group default, {LAST_PLACE}; rank 0 waits in all_reduce #4" in run.stderr, \
        run.stderr


def test_a_plain_sigkill_of_a_rank_in_a_counted_cgroup_is_no_oom_kill(tmp_path, small_memory_cgroup):
    directory, _, counter = small_memory_cgroup
    run = Running(tmp_path, torchrun(str(JOB), "sleeps"), env={"OOM_CGROUP": directory})
    run.wait_ready()
    pid = int(Path(f"{run.ready}.1").read_text())
    assert str(pid) in read(os.path.join(directory, "cgroup.procs")).split()  # its counter is readable
    os.kill(pid, signal.SIGKILL)
    assert run.end() == 3, run.text
    how = "killed by SIGKILL" if "rank 1 killed by SIGKILL" in run.text else \
        "ended without an exit record (killed by a signal, or os._exit)"
    assert f"rank 1 {how} after 3 collectives in group default, {LAST_PLACE}; rank 0 waits in all_reduce #4" \
           in run.text, run.text
    assert "OOM" not in run.text and parse_oom_kills(read(counter)) == 0, run.text


def test_where_says_a_rank_the_oom_killer_took(tmp_path, small_memory_cgroup):
    """``pytest-nccl where`` (SIGUSR1) words a dead rank as a verdict does: the OOM killer's, here a
    real process in the small cgroup that the kernel killed, followed as the watch follows a rank."""
    from pytest_nccl.core.jobdir import RankInfo, process_start
    from pytest_nccl.core.states import RankState
    from pytest_nccl.watch.engine.follow import Followed, LocalRank
    from pytest_nccl.watch.engine.where import place_of

    directory, path, _ = small_memory_cgroup
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); held = []\n"
                              "while True: held.append(b'\\x01' * (8 << 20))"], stdin=subprocess.PIPE)
    try:
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        rank = Followed(1, LocalRank(1, RankInfo(rank=1, pid=child.pid, start=process_start(child.pid)), str(tmp_path)))
        child.stdin.write(b"go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 60
        while not rank.source.gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        rank.state = RankState.DEAD
        line = place_of(rank, "", time.time()).line()
        assert line.startswith(f"rank 1: killed by the kernel's OOM killer (SIGKILL; its memory cgroup {path} "
                               "counted 1 OOM kill)"), line
    finally:
        child.kill()
        child.wait()
