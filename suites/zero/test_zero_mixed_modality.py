"""Scenario 1: mixed-modality batches under ZeRO-3 (VLM-R1's GRPO runs dying with "Watchdog caught
collective operation timeout ... _ALLGATHER_BASE"; fixed in VLM-R1 commit 95b721e).

ZeRO-3 (and FSDP2 with reshard_after_forward=True) gathers each submodule's partitioned
parameters when that submodule runs forward (DeepSpeed: fetch_sub_module -> all_gather_coalesced ->
all_gather_into_tensor; FSDP2: its pre-forward all-gather). Every rank's batch has images but the
last rank's, which has none: the others gather the vision tower while the last rank gathers the
next block. On NCCL that is the watchdog timeout; on gloo the sizes differ, so some rank aborts
("Received data size doesn't match expected size"; which one varies). Either way the plugin must
name the all-gather and, as the odd one out, the last rank (DeepSpeed at world 4: "ranks 0,1,2
[136], rank 3 [264]"; at world 2 "rank 0 [..], rank 1 [..]"). Any world size.

Fixed form: all-reduce a has-images flag and run the vision tower on a dummy input where a rank has
no images (kept in the graph with a zero weight, so backward matches too).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from zero_helpers import ENGINES, TinyVLM, all_gather_op, clean_state, deepspeed_engine, ds_config, fsdp2_shard

import pytest_nccl

STEPS = 2


def text_only_rank(world_size: int) -> int:
    return world_size - 1


def batch(rank: int, step: int, world_size: int):
    g = torch.Generator().manual_seed(100 * rank + step)
    input_ids = torch.randint(0, 32, (2, 6), generator=g)
    has_images = rank != text_only_rank(world_size)
    pixel_values = torch.randn(2, 4, 16, generator=g) if has_images else None
    return input_ids, pixel_values


def train_vlm(engine_kind: str, fixed: bool) -> list[float]:
    """A few training steps of TinyVLM on this rank's batches; returns the losses."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyVLM()
    model.sync_modalities = fixed
    losses = []
    with clean_state() as stack:
        if engine_kind == "deepspeed":
            engine = deepspeed_engine(model, ds_config(3), stack)
            for step in range(STEPS):
                loss = engine(*batch(rank, step, world_size))
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
        else:
            fsdp2_shard(model, [model.vision, model.block], reshard_after_forward=True)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for step in range(STEPS):
                loss = model(*batch(rank, step, world_size))
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
    return losses


@pytest.mark.timeout(45)
@pytest.mark.parametrize("engine_kind", ENGINES)
def test_mixed_modality_hang_is_diagnosed(engine_kind, engine_ready, expect_diagnosis, nccl_world):
    """The last rank skips the vision tower: the plugin reports a CollectiveMismatch in the
    all-gather whose shapes name the last rank apart from the others."""
    expect_diagnosis(train_vlm, engine_kind, False, exc=pytest_nccl.CollectiveMismatch,
                     op=all_gather_op(engine_kind), rank=text_only_rank(nccl_world.size))


@pytest.mark.nccl(timeout=60)
@pytest.mark.parametrize("engine_kind", ENGINES)
def test_mixed_modality_fixed(engine_kind, engine_ready):
    """All-reduced has-images flag + dummy vision pass: every rank gathers the same submodules."""
    losses = train_vlm(engine_kind, True)
    assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses)))
