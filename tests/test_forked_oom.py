"""A marked test whose rank 1 the kernel's OOM killer takes says so (forked groups: the plugin's
``--nccl-world`` mode), and a plain SIGKILL of a rank in the same cgroup does not. Real rank processes,
a real memory cgroup with a small limit (``memcg_support``), the kernel's own OOM killer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from memcg_support import read

from pytest_nccl.core.oom import parse_oom_kills

INNER = """
import os, signal
import pytest, torch
import torch.distributed as dist


@pytest.mark.nccl(world=2)
def test_a_rank_1_moves_into_the_small_cgroup(rank):
    if rank == 1:  # the group is kept for the next test: its rank 1 stays there
        with open(os.path.join(os.environ["OOM_CGROUP"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    dist.barrier()


@pytest.mark.nccl(world=2)
def test_b_rank_1_ends(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 1 and os.environ["HOW"] == "oom":
        held = []
        while True:  # written, not only reserved: every page is charged to the cgroup
            held.append(b"\\x01" * (8 << 20))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)  # rank 0
"""


def _run(pytester, directory: str, how: str) -> str:
    pytester.makepyfile(test_inner=textwrap.dedent(INNER))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR"}
    env.update(OOM_CGROUP=directory, HOW=how)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_inner.py",
                           "--nccl-timeout=60"], cwd=pytester.path, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.stdout + proc.stderr


def test_a_rank_the_oom_killer_took_in_a_marked_test_is_said_so(pytester, small_memory_cgroup):
    directory, path, counter = small_memory_cgroup
    out = _run(pytester, directory, "oom")
    assert parse_oom_kills(read(counter)) == 1, out  # the kernel's own count: it was the OOM killer
    assert (f"RankDied: rank 1 killed by the kernel's OOM killer (SIGKILL; its memory cgroup {path} counted 1 "
            "OOM kill) after 1 collective in group default") in out, out
    assert "1 failed, 1 passed" in out, out


def test_a_plain_sigkill_in_a_marked_test_is_no_oom_kill(pytester, small_memory_cgroup):
    directory, _, counter = small_memory_cgroup
    out = _run(pytester, directory, "kill")
    assert "RankDied: rank 1 killed by SIGKILL after 1 collective in group default" in out, out
    assert "OOM" not in out and parse_oom_kills(read(counter)) == 0, out
