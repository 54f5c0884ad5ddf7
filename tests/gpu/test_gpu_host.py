"""On a GPU host: the fork server stays fork-safe, NCCL ranks bind their own GPU, a rank stuck in a
GPU kernel is bounded and its memory freed, gloo fallback hides CUDA from the ranks, xdist workers
lease GPUs without overlap.

Skipped without CUDA; run on every GPU host you get: ``pytest tests/gpu -v``. The TRL check needs
trl and datasets installed."""

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

GPUS = torch.cuda.device_count()  # NVML first: no CUDA initialized in the controller
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no CUDA device on this host")

ROOT = Path(__file__).resolve().parents[2]

MODULE_QUERIES_CUDA = """
import pytest, torch
import torch.distributed as dist

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"     # what nearly every GPU test file does
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

@pytest.mark.nccl(world=1, backend="nccl")
def test_nccl_after_a_module_level_query(rank, device):
    t = torch.ones(4, device=device)
    dist.all_reduce(t)
    assert str(device) == "cuda:0" and t.sum().item() == 4
"""


def test_module_level_cuda_query_keeps_forked_ranks(run_inner):
    inner = run_inner(MODULE_QUERIES_CUDA)
    assert inner.result.parseoutcomes() == {"passed": 1}, inner.text
    assert "initialized CUDA" not in inner.text


MODULE_MAKES_CUDA_TENSOR = """
import os
import pytest, torch
import torch.distributed as dist

TABLE = torch.arange(4, device="cuda")     # CUDA initialized in whatever imports this module

@pytest.mark.nccl(world=1, backend="nccl")
def test_nccl_after_a_module_level_cuda_tensor(rank, device):
    t = torch.ones(4, device=device) + TABLE.to(device)
    dist.all_reduce(t)
    assert t.sum().item() == 10

@pytest.mark.nccl(world=1, backend="nccl")
def test_second_group_after_failure(rank, device):
    raise ValueError("boom")

@pytest.mark.nccl(world=1, backend="nccl")
def test_third(rank, device):
    dist.all_reduce(torch.ones(1, device=device))
"""


def test_module_level_cuda_tensor_gets_spawned_ranks(run_inner):
    inner = run_inner(MODULE_MAKES_CUDA_TENSOR)
    assert inner.result.parseoutcomes() == {"passed": 2, "failed": 1, "warnings": 1}, inner.text
    assert re.search(r"test_inner\.py initialized CUDA when the fork server imported it", inner.text)
    assert "rank 0 raised ValueError: boom" in inner.text


BINDING = f"""
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world={min(GPUS, 4)}, backend="nccl")
def test_each_rank_binds_its_gpu(rank, world_size, device):
    assert device == torch.device("cuda", rank)
    assert torch.cuda.current_device() == rank and torch.cuda.device_count() == world_size
    t = torch.full((8,), float(rank), device=device)
    out = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(out, t)
    assert [o[0].item() for o in out] == list(range(world_size))

@pytest.mark.nccl(world={min(GPUS, 4)}, backend="nccl", timeout=20)
def test_shape_mismatch_is_diagnosed(rank, device):
    dist.all_reduce(torch.ones(2 + rank, device=device))
"""


def test_nccl_collectives_and_device_binding(run_inner):
    inner = run_inner(BINDING)
    outcomes = inner.result.parseoutcomes()
    if GPUS == 1:  # one rank: nothing to mismatch, the collective completes
        assert outcomes == {"passed": 2}, inner.text
    else:
        assert outcomes == {"passed": 1, "failed": 1}, inner.text
        assert "mismatch in all_reduce #1 of group default" in inner.text


STUCK_KERNEL = """
import pytest, torch
import torch.distributed as dist

HOLD = 4 << 30   # bytes held by the stuck rank

@pytest.mark.nccl(world=1, backend="nccl", timeout=10)
def test_gpu_stuck_in_a_kernel(rank, device):
    block = torch.empty(HOLD, dtype=torch.uint8, device=device)
    torch.cuda._sleep(1 << 62)        # a kernel that spins for days
    torch.cuda.synchronize()

@pytest.mark.nccl(world=1, backend="nccl")
def test_memory_is_free_again(rank, device):
    free, total = torch.cuda.mem_get_info()
    assert free >= HOLD, (free, total)
    torch.empty(HOLD, dtype=torch.uint8, device=device)
"""


def test_rank_stuck_in_a_gpu_kernel_is_bounded_and_freed(run_inner):
    inner = run_inner(STUCK_KERNEL, "--durations=2")
    assert inner.result.parseoutcomes() == {"passed": 1, "failed": 1}, inner.text
    m = re.search(r"([\d.]+)s call +test_inner.py::test_gpu_stuck_in_a_kernel", inner.text)
    assert m and float(m.group(1)) < 10 + 8, inner.text


XDIST_LEASES = """
import os, time, fcntl
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=1, backend="nccl")
@pytest.mark.parametrize("i", range(6))
def test_lease(i, rank, device, tmp_path_factory):
    start = time.time()
    dist.all_reduce(torch.ones(1, device=device))
    time.sleep(0.3)
    with open(os.environ["LEASE_LOG"], "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{os.environ['CUDA_VISIBLE_DEVICES']} {start} {time.time()}\\n")
"""


def test_xdist_workers_never_share_a_gpu(run_inner, pytester, monkeypatch):
    log = pytester.path / "leases.log"
    monkeypatch.setenv("LEASE_LOG", str(log))
    inner = run_inner(XDIST_LEASES, "-n", "3")
    assert inner.result.parseoutcomes()["passed"] == 6, inner.text
    spans: dict = {}
    for line in log.read_text().splitlines():
        dev, start, end = line.split()
        spans.setdefault(dev, []).append((float(start), float(end)))
    for dev, intervals in spans.items():
        intervals.sort()
        for (_, e1), (s2, _) in itertools.pairwise(intervals):
            assert s2 >= e1, f"two groups used GPU {dev} at once: {intervals}"


@pytest.mark.skipif(not all(__import__("importlib").util.find_spec(m) for m in ("trl", "datasets")),
                    reason="needs trl and datasets")
def test_trl_suite_under_gloo_fallback_with_cuda_visible():
    """More ranks than GPUs: gloo fallback, CUDA hidden from the ranks (they would put rank N on a
    cuda:N that does not exist)."""
    world = GPUS + 1
    # not -q: the session header, which says where the ranks run, is what this checks
    proc = subprocess.run([sys.executable, "-m", "pytest", f"--nccl-world={world}", "suites/trl",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTEST_ADDOPTS": ""})
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert re.search(rf"^nccl: world {world}, backend gloo \(auto: .*CUDA hidden from the ranks\)", proc.stdout,
                     re.MULTILINE), proc.stdout[:3000]


GLOO_SHARES_THE_GPUS = f"""
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world={GPUS + 1}, backend="gloo")
def test_gloo_reduces_cuda_tensors(rank, world_size):
    t = torch.ones(4, device="cuda")
    assert t.device.index == rank % {GPUS}, t.device
    dist.all_reduce(t)
    assert t.sum().item() == 4 * world_size
"""


def test_gloo_by_name_shares_the_gpus_with_more_ranks_than_gpus(run_inner):
    """gloo asked for by name with fewer GPUs than ranks: CUDA tensors work as under plain torch,
    rank r on cuda:r % GPUs (the automatic fallback hides CUDA instead)."""
    inner = run_inner(GLOO_SHARES_THE_GPUS, "--nccl-backend=gloo")  # the header says the session's backend
    assert inner.result.parseoutcomes() == {"passed": 1}, inner.text
    assert f"shared: rank r on cuda:r % {GPUS}" in inner.text, inner.text
