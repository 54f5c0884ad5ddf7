"""Small pure pieces: backend choice, option parsing, GPU leases."""

import multiprocessing
import time

import pytest

from pytest_nccl.errors import NcclUsageError
from pytest_nccl.forked.gpus import GpuLeaser
from pytest_nccl.placement import Placement, place
from pytest_nccl.settings import parse_world


@pytest.mark.parametrize("requested, world, gpus, expected", [
    ("auto", 4, 0, Placement("gloo", "auto: no CUDA device")),
    ("auto", 4, 1, Placement("gloo", "auto: 1 CUDA device < world 4; CUDA hidden from the ranks")),
    ("auto", 4, 2, Placement("gloo", "auto: 2 CUDA devices < world 4; CUDA hidden from the ranks")),
    ("auto", 4, 8, Placement("nccl", "auto: 8 CUDA devices >= world 4", gpus=True)),
    ("gloo", 2, 0, Placement("gloo", "requested")),
    ("gloo", 2, 1, Placement("gloo", "requested; 1 CUDA device < world 2, shared: rank r on cuda:r % 1",
                             shared_gpus=1)),
    ("gloo", 5, 2, Placement("gloo", "requested; 2 CUDA devices < world 5, shared: rank r on cuda:r % 2",
                             shared_gpus=2)),
    ("gloo", 2, 8, Placement("gloo", "requested; a GPU per rank: 8 CUDA devices >= world 2", gpus=True)),
    ("nccl", 2, 2, Placement("nccl", "requested", gpus=True)),
])
def test_placement(requested, world, gpus, expected):
    assert place(requested, world, gpus) == expected


@pytest.mark.parametrize("world, gpus, devices", [(2, 1, [0, 0]), (5, 2, [0, 1, 0, 1, 0]), (3, 3, [None] * 3),
                                                  (4, 0, [None] * 4)])
def test_ranks_that_share_gpus_take_them_in_turn(world, gpus, devices):
    placement = place("gloo", world, gpus)
    assert [placement.device_of(r) for r in range(world)] == devices


def test_nccl_without_enough_gpus_is_one_line():
    with pytest.raises(NcclUsageError, match=r"^--nccl-backend=nccl needs 4 CUDA devices for world 4; "
                                             r"this machine has 1$"):
        place("nccl", 4, 1)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "2.5", ""])
def test_world_must_be_a_positive_integer(value):
    with pytest.raises(NcclUsageError, match="must be a whole number of ranks >= 1"):
        parse_world(value, "--nccl-world")


NAMES = ["0", "1", "2", "3"]


def _hold(lock_dir, n, ready, release):
    lease = GpuLeaser(4, lock_dir, names=NAMES).try_acquire(n)
    ready.put(None if lease is None else lease.ids)
    release.wait(30)


def test_gpu_leases_never_overlap_between_processes(tmp_path):
    """Two groups (say two xdist workers) each get their own devices; a third waits or times out;
    a lease held by a process that dies is free again."""
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), 2, ready, release))
    holder.start()
    try:
        assert ready.get(timeout=10) == ["0", "1"]
        leaser = GpuLeaser(4, str(tmp_path), names=NAMES)
        mine = leaser.try_acquire(2)
        assert mine.ids == ["2", "3"]
        assert leaser.try_acquire(1) is None
        with pytest.raises(TimeoutError, match="no 1 free GPUs of 4"):
            leaser.acquire(1, time.monotonic() + 0.3)
        mine.release()
        assert leaser.try_acquire(2).ids == ["2", "3"]
    finally:
        release.set()
        holder.join(10)
    assert GpuLeaser(4, str(tmp_path), names=NAMES).try_acquire(2).ids == ["0", "1"]  # the dead holder's lease is gone
