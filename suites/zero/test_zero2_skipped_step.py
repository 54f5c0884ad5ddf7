"""Scenario 3: under ZeRO-2 (and 1) a rank skips the optimizer step, the others wait in the step's
all-gather. Any world size: the last rank is the one whose batch is empty.

ZeRO-1/2 keep the parameters whole in forward/backward; each rank updates only its partition in
``step()`` and the updated partitions come back with an all-gather (stage_1_and_2.py:
all_gather_dp_groups -> all_gather_into_tensor). A rank whose batch is empty ("nothing to learn,
skip the update") returns before ``engine.step()``; the others sit in that all-gather. With
DeepSpeed 0.19.8's defaults ``step()`` first all-reduces the gradient norm (compute_grad_norm=True,
even with gradient_clipping=0), so that is where they wait; with ``compute_grad_norm: false`` the
all-gather is the step's only collective. Both are checked.

Fixed form: decide the skip collectively (all-reduce the token count): every rank steps, or none.

FSDP2 has no analogue: its optimizer step works on local shards with no collective (the all-gather
comes with the next forward), so a rank skipping ``opt.step()`` does not hang; its shard silently
stops being updated. ``test_fsdp2_skipped_step_does_not_hang`` pins that down.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from headlines import names_ranks
from zero_helpers import clean_state, deepspeed_engine, ds_config, fsdp2_shard, tiny_mlp

import pytest_nccl

STEPS = 2


def skipping_rank(world_size: int) -> int:
    """The one rank whose last batch is empty: the last rank (rank 1 at world 2)."""
    return world_size - 1


def batch(rank: int, step: int, world_size: int):
    """Inputs and per-example weights; the last rank's last batch is empty (all weights zero)."""
    g = torch.Generator().manual_seed(100 * rank + step)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 4, generator=g)
    empty = rank == skipping_rank(world_size) and step == STEPS - 1
    weight = torch.zeros(4) if empty else torch.ones(4)
    return x, y, weight


def weighted_loss(pred, y, weight):
    per_example = ((pred - y) ** 2).mean(dim=1)
    return (per_example * weight).sum() / weight.sum().clamp(min=1.0)


def train_zero2(fixed: bool, compute_grad_norm: bool) -> int:
    """A few ZeRO-2 steps; returns how many optimizer steps this rank took."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = tiny_mlp()
    stepped = 0
    with clean_state() as stack:
        engine = deepspeed_engine(model, ds_config(2, micro_batch=4, compute_grad_norm=compute_grad_norm), stack)
        for step in range(STEPS):
            x, y, weight = batch(rank, step, world_size)
            loss = weighted_loss(engine(x), y, weight)
            engine.backward(loss)  # gradient all-reduce: every rank takes part
            n = torch.tensor([weight.sum().item()])
            if fixed:
                dist.all_reduce(n)  # the skip decision is global
            if n.item() == 0:
                continue  # "empty batch: skip the update"
            engine.step()
            stepped += 1
    return stepped


STEP_COLLECTIVE = [
    pytest.param(False, r"\ball_gather_into_tensor\b", id="no-grad-norm"),  # step() = all_gather_dp_groups only
    pytest.param(True, r"\ball_reduce\b", id="default"),        # step() starts with the grad-norm all_reduce
]


@pytest.mark.timeout(45)
@pytest.mark.parametrize("compute_grad_norm, op", STEP_COLLECTIVE)
def test_skipped_step_hang_is_diagnosed(compute_grad_norm, op, deepspeed_ops, expect_diagnosis, nccl_world):
    """The last rank leaves before step(); every other rank waits in the step's collective
    ("rank 3 left the test (passed) ...; ranks 0,1,2 wait in ..." at world 4)."""
    last = skipping_rank(nccl_world.size)
    err = expect_diagnosis(train_zero2, False, compute_grad_norm, exc=pytest_nccl.CollectiveMismatch,
                           op=op, rank=last)
    assert names_ranks(err.diagnosis.headline, set(range(last))), err.diagnosis.headline  # the waiters


@pytest.mark.nccl(timeout=60)
@pytest.mark.parametrize("compute_grad_norm", [False, True], ids=["no-grad-norm", "default"])
def test_skipped_step_fixed(compute_grad_norm, deepspeed_ops):
    assert train_zero2(True, compute_grad_norm) == STEPS  # the global count is never 0 here


@pytest.mark.nccl(timeout=60)
def test_fsdp2_skipped_step_does_not_hang(rank, world_size):
    """FSDP2 (reshard_after_forward=False, the ZeRO-2 analogue): skipping opt.step() on the last rank
    issues no collective and leaves that rank's shard as it was, while every other rank's moves."""
    model = fsdp2_shard(tiny_mlp(), [], reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        x, y, weight = batch(rank, step, world_size)
        weighted_loss(model(x), y, weight).backward()
        before = [p.to_local().detach().clone() for p in model.parameters()]
        if weight.sum() == 0:
            opt.zero_grad()
            continue
        opt.step()
        opt.zero_grad()
    moved = any(not torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters(), strict=True))
    assert moved == (rank != skipping_rank(world_size))
