"""Every way a rank group can go wrong becomes a bounded failure of that one test, with the right
headline; the session goes on and the next test gets a healthy group; no process is left."""

import re

import pytest
from conftest import line_of, run_inner_once

FAILURES = """
import os, signal, time
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_a_raises(rank):
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 1:
        raise ValueError("boom on one rank")
    dist.all_reduce(t)  # the second

@pytest.mark.nccl(world=2)
def test_b_exit3(rank):
    dist.barrier()
    if rank == 0:
        os._exit(3)
    dist.barrier()

@pytest.mark.nccl(world=2)
def test_c_sigkill(rank):
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()

@pytest.mark.nccl(world=2)
def test_d_sigsegv(rank):
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()

@pytest.mark.nccl(world=2)
def test_e_never_enters(rank):
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 1:
        return
    dist.all_gather([torch.zeros(2), torch.zeros(2)], t)

@pytest.mark.nccl(world=2)
def test_f_passes_after_failures(rank, world_size):
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0, 3.0]

@pytest.mark.nccl(world=2, timeout=3)
def test_g_true_hang(rank):
    # both ranks wait to receive from each other: every rank inside a collective, none completes
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)

@pytest.mark.nccl(world=2, timeout=3)
def test_h_slow_rank(rank):
    if rank == 1:
        time.sleep(60)
    dist.all_reduce(torch.ones(1))

@pytest.mark.nccl(world=2)
def test_i_shape_mismatch_abort(rank):
    # each rank sizes the gather by its own length, like gather_for_metrics on padded batches:
    # on gloo the receiving rank aborts (SIGABRT, gloo::EnforceNotMet)
    n = 3 if rank == 0 else 5
    dist.all_gather([torch.zeros(n) for _ in range(2)], torch.ones(n))

@pytest.mark.nccl(world=2)
def test_j_op_mismatch(rank):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)

@pytest.mark.nccl(world=2)
def test_k_silent_mismatch(rank):
    # gloo completes a broadcast of different sizes without an error; the sequences still differ
    dist.broadcast(torch.ones(3 if rank == 0 else 5), src=0)

@pytest.mark.nccl(world=2)
def test_l_last_passes(rank):
    dist.barrier()
"""


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    return run_inner_once(tmp_path_factory, FAILURES, "--nccl-timeout=60")


def test_failures_session_is_bounded(failures):
    outcomes = failures.result.parseoutcomes()
    assert outcomes.get("passed") == 2 and outcomes.get("failed") == 10, failures.text
    # one session: 2 hangs of 3 s each, the rest fail within 2 s each, plus start-up
    assert failures.elapsed < 60, failures.elapsed
    failures.result.stdout.fnmatch_lines(["*PASSED test_inner.py::test_f_passes_after_failures*",
                                          "*PASSED test_inner.py::test_l_last_passes*"])


# scenario -> what its failure section must show (regular expressions)
EXPECTED = {
    "test_a_raises": [
        re.escape("rank 1 raised ValueError: boom on one rank after 1 collective in group default; rank 0 waits "
                  f"in all_reduce #2 of group default from test_inner.py:{line_of(FAILURES, '# the second')}"),
        re.escape("-- traceback of rank 1 --"), re.escape('raise ValueError("boom on one rank")')],
    "test_b_exit3": [re.escape("rank 0 exited with code 3 after 1 collective in group default; rank 1 waits in "
                               "barrier #2")],
    "test_c_sigkill": [re.escape("rank 1 killed by SIGKILL after 1 collective")],
    "test_d_sigsegv": [re.escape("rank 1 killed by SIGSEGV after 1 collective")],
    "test_e_never_enters": [re.escape(
        "rank 1 left the test (passed) after 1 collective in group default; rank 0 waits in all_gather #2 of "
        f"group default from test_inner.py:{line_of(FAILURES, 'dist.all_gather([torch.zeros(2)')}")],
    "test_g_true_hang": [re.escape(f"p2p deadlock: both ranks receive first: rank 0 waits in recv(src=1, tag=0) from "
                                   f"test_inner.py:{line_of(FAILURES, 'dist.recv(t, src=1 - rank)')}, "
                                   "which rank 1 never sends; rank 1 waits in recv(src=0, tag=0)"),
                         re.escape("-- Python stack of ranks 0,1 (all threads) --"),
                         re.escape("dist.recv(t, src=1 - rank)")],
    "test_h_slow_rank": [rf"slow rank: rank 1 is busy outside any collective at test_inner.py:"
                         rf"{line_of(FAILURES, 'time.sleep(60)')}(: time\.sleep\(60\)| \(in test_h_slow_rank\)).*"
                         r"rank 0 waited for the whole 3 s bound in all_reduce #1", re.escape("time.sleep(60)")],
    "test_i_shape_mismatch_abort": [
        re.escape("shape mismatch in all_gather #1 of group default: rank 0 [3], rank 1 [5] "
                  f"(from test_inner.py:{line_of(FAILURES, 'dist.all_gather([torch.zeros(n)')})"),
        re.escape("killed by SIGABRT inside it")],
    "test_j_op_mismatch": [re.escape("op mismatch at collective #1 of group default: rank 0 all_reduce, "
                                     "rank 1 broadcast")],
    "test_k_silent_mismatch": [re.escape("shape mismatch in broadcast #1 of group default: rank 0 [3], rank 1 [5]"),
                               re.escape("completed it without an error")],
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_failure_is_diagnosed(failures, scenario):
    section = failures.section(scenario)
    for pattern in EXPECTED[scenario]:
        assert re.search(pattern, section, re.S), f"/{pattern}/ not in:\n{section}"


TIMING = """
import os, time
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=4)
def test_warmup(rank):
    dist.barrier()

@pytest.mark.nccl(world=4)
def test_left_early(rank):
    if rank == 2:
        return
    dist.all_reduce(torch.ones(1))

@pytest.mark.nccl(world=4)
def test_dies(rank):
    if rank == 3:
        os._exit(9)
    dist.all_reduce(torch.ones(1))

@pytest.mark.nccl(world=4, timeout=2)
def test_hang(rank):
    if rank == 0:
        time.sleep(30)
    dist.all_reduce(torch.ones(1))
"""


def test_fail_fast_and_hang_bounds(run_inner):
    """A rank leaving fails the test within 2 s; a hang at its bound plus at most 3 s."""
    inner = run_inner(TIMING, "--durations=0", "--durations-min=0")
    assert inner.result.parseoutcomes().get("failed") == 3, inner.text
    durations = {}
    for line in inner.result.stdout.lines:
        m = re.match(r"\s*([\d.]+)s call\s+test_inner.py::(\w+)", line)
        if m:
            durations[m.group(2)] = float(m.group(1))
    assert durations["test_left_early"] < 2.0, durations
    assert durations["test_dies"] < 2.0, durations
    assert 2.0 <= durations["test_hang"] < 5.0, durations
    assert "rank 2 left the test (passed) after 0 collectives" in inner.section("test_left_early")
    assert "rank 3 exited with code 9" in inner.section("test_dies")
