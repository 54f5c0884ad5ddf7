"""Scenario 2: generation with per-rank stopping under ZeRO-3 (DeepSpeed#8262, #8321,
transformers#18281).

Under ZeRO-3 (FSDP2 with reshard_after_forward=True) every decoding step is a forward that gathers
the partitioned parameters again. transformers' real ``generate(synced_gpus=False)`` stops each rank
on its own condition, here ``max_length`` with prompts of different lengths: the last rank (long
prompt) finishes after 4 new tokens and leaves, every other rank (short prompt) runs a 5th forward
and waits in its all-gather forever (NCCL: the watchdog timeout). Any world size: exactly one rank,
the last, has the long prompt, so the headline names it alone. ``synced_gpus=True`` keeps finished
ranks running dummy forwards until every rank is done (an all-reduced "finished" flag per step) and
passes.

Contrast (the ZeRO-2 analogue): DeepSpeed ZeRO-2 and FSDP2 with reshard_after_forward=False keep
full parameters in forward (FSDP2: after the first forward), so the same unsynced generate passes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from zero_helpers import all_gather_op, clean_state, deepspeed_engine, ds_config, fsdp2_shard, tiny_lm

import pytest_nccl

MAX_LENGTH = 10
SHORT, LONG = "ab", "abcdef"  # 8 decoding steps, 4


def prompt(rank: int, world_size: int) -> str:
    """The last rank gets the long prompt (it stops first), every other rank the short one."""
    return LONG if rank == world_size - 1 else SHORT


def generate(engine_kind: str, synced_gpus: bool) -> list[int]:
    """Greedy generate on this rank's prompt with the model sharded by ``engine_kind``; checks the
    tokens against the same model unsharded (gathering must not change the result)."""
    rank = dist.get_rank()
    model, tok = tiny_lm()
    ids = tok(prompt(rank, dist.get_world_size()), return_tensors="pt").input_ids
    kwargs = dict(attention_mask=torch.ones_like(ids), max_length=MAX_LENGTH, do_sample=False)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)[0].tolist()  # local, before sharding: no collectives
    with clean_state() as stack:
        if engine_kind == "deepspeed-zero3":
            module = deepspeed_engine(model, ds_config(3, optimizer=False), stack).module
        elif engine_kind == "deepspeed-zero2":
            module = deepspeed_engine(model, ds_config(2), stack).module
        elif engine_kind == "fsdp2-reshard":
            module = fsdp2_shard(model, list(model.model.layers), reshard_after_forward=True)
        elif engine_kind == "fsdp2-no-reshard":
            module = fsdp2_shard(model, list(model.model.layers), reshard_after_forward=False)
        else:
            raise ValueError(engine_kind)
        module.eval()
        with torch.no_grad():
            out = module.generate(ids, synced_gpus=synced_gpus, **kwargs)[0].tolist()
    assert out == expected, f"rank {rank}: sharded generate gave {out}, unsharded {expected}"
    return out


ZERO3_LIKE = ("deepspeed-zero3", "fsdp2-reshard")
ZERO2_LIKE = ("deepspeed-zero2", "fsdp2-no-reshard")


@pytest.mark.timeout(45)
@pytest.mark.parametrize("engine_kind", ZERO3_LIKE)
def test_unsynced_generate_hang_is_diagnosed(engine_kind, engine_ready, expect_diagnosis, nccl_world):
    """The last rank stops first and leaves; the others wait in the next step's parameter all-gather
    ("rank 3 left the test (passed) ...; ranks 0,1,2 wait in ..." at world 4)."""
    expect_diagnosis(generate, engine_kind, False, exc=pytest_nccl.CollectiveMismatch,
                     op=all_gather_op(engine_kind), rank=nccl_world.size - 1)


@pytest.mark.nccl(timeout=60)
@pytest.mark.parametrize("engine_kind", ZERO3_LIKE)
def test_synced_generate_passes(engine_kind, engine_ready):
    generate(engine_kind, True)


@pytest.mark.nccl(timeout=60)
@pytest.mark.parametrize("engine_kind", ZERO2_LIKE)
def test_unsynced_generate_without_param_gathers_passes(engine_kind, engine_ready):
    """No per-forward parameter gather, nothing to desync: the ZeRO-3 hang needs ZeRO-3."""
    generate(engine_kind, False)
