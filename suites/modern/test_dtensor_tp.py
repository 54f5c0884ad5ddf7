"""DTensor tensor parallelism with a rank that skips a redistribute.

A column-parallel head (``ColwiseParallel(use_local_output=False)``) leaves the logits sharded on the
last dim (``Shard(-1)``). Evaluation needs them whole on every rank: ``redistribute(Replicate())``,
a functional all-gather. The last rank's evaluation shard is empty, and it skips the accuracy, with
it the redistribute: the others wait in the all-gather while it is already in the all-reduce of
the correct counts. On NCCL that hangs until the watchdog (or pairs an all-gather with an
all-reduce); the plugin names it from the functional collective's own record, about a second after
the ranks block. Fixed: every rank takes part in the redistribute, with or without labels.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
from modern_helpers import cpu_mesh, last_rank, site
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module


def eval_labels(rank: int, world: int) -> torch.Tensor:
    """Every rank gets 3 labels but the last, whose evaluation shard is empty."""
    return torch.empty(0, dtype=torch.long) if rank == world - 1 else torch.tensor([0, 1, 2]) + rank


def eval_step(every_rank_redistributes: bool) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = cpu_mesh("tp")
    torch.manual_seed(0)
    head = parallelize_module(nn.Linear(8, 4 * world), mesh, ColwiseParallel(use_local_output=False))
    x = torch.randn(3, 8)  # the same activations on every rank (tensor parallelism)
    logits = head(x)  # a DTensor sharded on the vocabulary: Shard(-1)
    labels = eval_labels(rank, world)
    correct = torch.zeros(())
    if every_rank_redistributes or len(labels):
        full = logits.redistribute(mesh, [Replicate()]).to_local()  # REDISTRIBUTE
        if len(labels):
            correct = (full.argmax(-1) == labels).sum().float()
    dist.all_reduce(correct)  # COUNT
    return correct.item()


@pytest.mark.timeout(60)
def test_rank_skipping_redistribute_is_diagnosed(expect_diagnosis, nccl_world):
    """"op mismatch at collective #N of group default: ranks 0-2 all_gather_into_tensor, rank 3
    all_reduce (from test_dtensor_tp.py:L; rank 3 from test_dtensor_tp.py:M)" at world 4."""
    expect_diagnosis(eval_step, False, op=r"op mismatch .*all_gather_into_tensor.*all_reduce",
                     rank=nccl_world.size - 1, site=site(sys.modules[__name__], "REDISTRIBUTE"))


@pytest.mark.nccl(timeout=60)
def test_every_rank_redistributing_passes(rank):
    counts = eval_step(True)
    assert counts == eval_step(True)  # the same on every call, and no rank is left behind
    assert last_rank() == dist.get_world_size() - 1
