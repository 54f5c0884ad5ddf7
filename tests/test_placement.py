"""Where ranks run and for how long: CUDA visibility of gloo ranks, GPU names through
CUDA_VISIBLE_DEVICES, ranks started as fresh interpreters when the fork server holds CUDA state, and
the bound under pytest-timeout's budget (set-up and group start included)."""

import re

import pytest

from pytest_nccl.budget import PYTEST_TIMEOUT_RESERVE, Budget
from pytest_nccl.forked.gpus import visible_devices


@pytest.mark.parametrize("environ, count, names", [
    ({}, 3, ["0", "1", "2"]),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2, ["2", "3"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}, 2, ["GPU-aa", "GPU-bb"]),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, []),
])
def test_lease_names_follow_the_controllers_visible_devices(environ, count, names):
    assert visible_devices(count, environ) == names


def test_bound_is_what_pytest_timeout_leaves_after_group_start():
    budget = Budget(timeout=120.0, deadline=100.0 + 20.0)   # pytest-timeout(20) started at t=100
    assert budget.setup_deadline(now=101.0) == 120.0 - PYTEST_TIMEOUT_RESERVE
    # the group took 6 s to start (import torch on a GPU host): 20 - 7 - reserve is left
    assert budget.bound(now=107.0) == pytest.approx(13.0 - PYTEST_TIMEOUT_RESERVE)
    assert budget.bound(now=119.0) == 0.5                      # never zero: the call still runs
    assert Budget(timeout=5.0, deadline=1000.0).bound(now=0.0) == 5.0   # ours is shorter anyway
    assert Budget(timeout=5.0).bound(now=123.0) == 5.0 and Budget(timeout=5.0).setup_deadline(now=0.0) == 30.0


# The automatic choice: NCCL with a GPU per rank, else gloo with CUDA hidden (the CPU path). gloo asked
# for by name shares the GPUs there are instead (tests/gpu holds that on a GPU host).
CUDA_SEEN = """
import os
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_fallback_ranks_take_the_cpu_path(rank, device):
    if dist.get_backend() == "gloo":
        assert str(device) == "cpu" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
        assert torch.cuda.device_count() == 0
    else:
        assert torch.cuda.device_count() == 2   # one GPU per rank
"""


def test_fallback_ranks_see_no_cuda_unless_each_has_a_gpu(run_inner):
    inner = run_inner(CUDA_SEEN)
    assert inner.result.parseoutcomes() == {"passed": 1}, inner.text


MODULE_INITIALIZES_CUDA = """
import os
import pytest, torch
import torch.distributed as dist

# What a CUDA tensor at module level leaves behind (faked, so that a CPU host tests the same path)
torch.cuda.is_initialized = lambda: True

def cmdline():
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        return f.read().replace(b"\\0", b" ").decode()

@pytest.mark.nccl(world=2)
def test_spawned_ranks_work(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
    assert "pytest_nccl.rank.zygote --rank" in cmdline()

@pytest.mark.nccl(world=2)
def test_mismatch_still_diagnosed(rank):
    dist.all_reduce(torch.ones(2 + rank))
"""


def test_a_module_that_initializes_cuda_gets_spawned_ranks(run_inner):
    inner = run_inner(MODULE_INITIALIZES_CUDA)
    assert inner.result.parseoutcomes() == {"passed": 1, "failed": 1, "warnings": 1}, inner.text
    warning = re.search(r"PytestWarning: pytest-nccl: (\S+) initialized CUDA when the fork server imported it",
                        inner.text)
    assert warning and warning.group(1).endswith("test_inner.py"), inner.text
    assert "this session starts ranks as fresh interpreters" in inner.text
    section = inner.section("test_mismatch_still_diagnosed")
    assert "shape mismatch in all_reduce #1 of group default: rank 0 [2], rank 1 [3]" in section


FORKED_OR_SPAWNED = """
import os
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_where(rank):
    dist.all_reduce(torch.ones(1))
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        print("spawned" if b"--rank" in f.read() else "forked")
"""


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_rank_start_option(run_inner, start):
    inner = run_inner(FORKED_OR_SPAWNED, f"--nccl-rank-start={start}")
    assert inner.result.parseoutcomes() == {"passed": 1}, inner.text
    expected = "spawned" if start == "spawn" else "forked"
    assert inner.text.count(expected) == 2 and "PytestWarning" not in inner.text, inner.text


SLOW_GROUP_START = """
import time
import pytest, torch
import torch.distributed as dist

@pytest.mark.timeout(10)
@pytest.mark.nccl(world=2)
def test_hang_after_a_slow_start(rank):
    if rank == 1:
        time.sleep(60)
    dist.all_reduce(torch.ones(1))
"""


def test_bound_leaves_room_after_a_slow_group_start(run_inner, pytester):
    """The fork server spends 5 s importing a preloaded module inside the test's call (as `import
    torch` and trl do on a GPU host): our bound must still end before pytest-timeout's 10 s."""
    pytester.makepyfile(slow_preload="import time\ntime.sleep(5)\n")
    pytester.makeini("[pytest]\nnccl_preload = slow_preload\n")
    inner = run_inner(SLOW_GROUP_START, "-p", "timeout")
    assert inner.result.parseoutcomes() == {"failed": 1}, inner.text
    section = inner.section("test_hang_after_a_slow_start")
    assert "slow rank: rank 1 is busy outside any collective" in section, inner.text
    assert "+++ Timeout +++" not in inner.text
