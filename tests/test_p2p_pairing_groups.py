"""Crossed point-to-point pairs on real gloo groups: a pipeline stage pair (PP=2) exchanges an
activation and a gradient of the same numel and other shapes; the receiver posts its receives in
the other order. gloo pairs them by order and completes without an error (measured), so the ranks
pass with swapped tensors: a marked test fails with the pairing headline, the watch says it in a
line and the job goes on; the same exchange in the right order stays clean in both."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import uuid

from conftest import assert_no_leftovers, line_of, run_inner_once
from watch_support import free_port, job_env

EXCHANGE = """
import sys
import torch
import torch.distributed as dist


def exchange(rank, crossed, batched):
    # stage 0 sends its activation [4, 8], then a gradient [2, 16]; stage 1 receives both
    peer = 1 - rank
    if rank == 0:
        ops = [dist.P2POp(dist.isend, torch.ones(4, 8), peer), dist.P2POp(dist.isend, torch.zeros(2, 16), peer)]
    else:
        shapes = [(2, 16), (4, 8)] if crossed else [(4, 8), (2, 16)]
        ops = [dist.P2POp(dist.irecv, torch.empty(s), peer) for s in shapes]
    if batched:
        works = dist.batch_isend_irecv(ops)  # BATCH
    else:
        works = [op.op(op.tensor, op.peer) for op in ops]  # SINGLE
    for w in works:
        w.wait()
    return [tuple(op.tensor.shape) for op in ops]
"""

INNER = EXCHANGE + """
import pytest


@pytest.mark.nccl(world=2)
def test_crossed_batch(rank):
    exchange(rank, crossed=True, batched=True)


@pytest.mark.nccl(world=2)
def test_crossed_isend_irecv(rank):
    exchange(rank, crossed=True, batched=False)


@pytest.mark.nccl(world=2)
def test_in_order(rank):
    exchange(rank, crossed=False, batched=True)
    exchange(rank, crossed=False, batched=False)
"""

JOB = EXCHANGE + """
import time
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    exchange(rank, crossed=sys.argv[1] == "crossed", batched=True)
    dist.all_reduce(torch.ones(1))
time.sleep(3)  # the job goes on: the watch has said it by now
print(f"rank {rank} after the pause", file=sys.stderr, flush=True)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


def test_crossed_pair_fails_a_marked_test_and_a_right_order_passes(tmp_path_factory):
    inner = run_inner_once(tmp_path_factory, INNER, "--nccl-timeout=60")
    assert inner.result.parseoutcomes() == {"failed": 2, "passed": 1}, inner.text
    assert inner.elapsed < 60, inner.elapsed
    for name, marker in (("test_crossed_batch", "# BATCH"), ("test_crossed_isend_irecv", "# SINGLE")):
        headline = ("CollectiveMismatch: p2p pairing: rank 0's 1st send to rank 1 [4, 8] was received as rank 1's "
                    f"1st recv from rank 0 [2, 16] (from test_inner.py:{line_of(INNER, marker)}), and 1 more crossed "
                    "pair; the backend completed it without an error: the received tensor is wrong")
        assert headline in inner.section(name), inner.section(name)


def watch(tmp_path, case: str) -> subprocess.CompletedProcess:
    (tmp_path / "pp.py").write_text(textwrap.dedent(JOB).lstrip("\n"))
    tag = uuid.uuid4().hex
    command = [sys.executable, "-m", "pytest_nccl", "watch", "--timeout", "60", "--",
               sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", "pp.py", case]
    proc = subprocess.run(command, cwd=tmp_path, env=job_env(tag), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert_no_leftovers(tag, wait=10.0)
    return proc


def test_the_watch_says_a_crossed_pair_once_and_the_job_goes_on(tmp_path):
    proc = watch(tmp_path, "crossed")
    assert proc.returncode == 0, proc.stderr  # the job's own status: the crossed pair ended nothing
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if "p2p pairing" in ln]
    assert len(lines) == 1, proc.stderr  # once for the pair of ranks, not once per step
    # said while the job ran (the watch and the ranks write to one stderr), not at its end
    assert proc.stderr.index(lines[0]) < proc.stderr.index("after the pause"), proc.stderr
    assert re.fullmatch(
        r"pytest-nccl watch: p2p pairing: rank 0's 1st send to rank 1 \[4, 8\] was received as rank 1's 1st recv "
        rf"from rank 0 \[2, 16\] \(from pp.py:{line_of(JOB, '# BATCH')}\); the job goes on \(its tensors are wrong\)",
        lines[0]), lines[0]


def test_the_watch_is_silent_on_pairs_in_order(tmp_path):
    proc = watch(tmp_path, "in-order")
    assert proc.returncode == 0, proc.stderr
    assert "p2p pairing" not in proc.stderr and "diagnosed" not in proc.stderr, proc.stderr
