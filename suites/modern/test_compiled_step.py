"""A ``torch.compile``d training step with a rank-dependent branch (pytorch#147561's shape).

The step averages gradients with a functional all-reduce inside the compiled region. A logging
helper adds, on rank 0 only, an all-reduce of the loss for the log line: rank 0's graph has one
collective more than every other rank's (dynamo specializes the branch on the rank). Rank 0 waits
in the loss all-reduce while the others wait in the next gradient all-reduce, with other shapes:
the headline names both, with the line inside the compiled function that issued each (the graph
keeps it). Fixed: the logging all-reduce runs on every rank (or outside the compiled step).
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from modern_helpers import site
from torch import nn


def step(model: nn.Module, x: torch.Tensor, rank: int, log_on_rank0_only: bool) -> torch.Tensor:
    loss = model(x).pow(2).mean()
    loss.backward()
    # a sum divided by the world size, not "avg": gloo on torch 2.6 has no AVG (measured: it raises)
    world = dist.get_world_size()
    for p in model.parameters():
        p.grad = funcol.all_reduce(p.grad, "sum", dist.group.WORLD) / world  # GRADS
    if rank == 0 or not log_on_rank0_only:
        loss = funcol.all_reduce(loss.detach(), "sum", dist.group.WORLD) / world  # LOG
    return loss


compiled_step = torch.compile(step, backend="aot_eager")


def train(log_on_rank0_only: bool) -> float:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.zeros(())
    for i in range(2):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(rank * 10 + i))
        loss = compiled_step(model, x, rank, log_on_rank0_only)
        opt.step()
        opt.zero_grad()
    return float(loss)


@pytest.mark.timeout(90)
def test_rank_dependent_branch_in_compiled_step_is_diagnosed(expect_diagnosis, nccl_world):
    """"shape mismatch in all_reduce #3 of group default: rank 0 [], ranks 1-3 [2, 4] (from
    test_compiled_step.py:L; ranks 1-3 from test_compiled_step.py:M)" at world 4: rank 0's loss
    all-reduce against the others' next gradient all-reduce."""
    module = sys.modules[__name__]
    expect_diagnosis(train, True, op=r"mismatch in all_reduce #3 of group default: rank 0 \[\]", rank=0,
                     site=site(module, "LOG"))


@pytest.mark.nccl(timeout=90)
def test_logging_on_every_rank_passes(rank):
    loss = train(False)
    losses = [None] * dist.get_world_size()
    dist.all_gather_object(losses, loss)
    assert len(set(losses)) == 1  # averaged: the same on every rank
