"""An FSDP2 checkpoint whose full state dict is gathered on rank 0 only (pytorch#169448's shape).

A tiny Llama whose backbone is frozen (only the LM head trains, as with a frozen backbone or LoRA)
is sharded with FSDP2 and trained a step. Saving: ``get_model_state_dict(full_state_dict=True,
cpu_offload=True)`` gathers every parameter, frozen ones included (``DTensor.full_tensor``: a
functional all-gather per parameter). Called on rank 0 only (``if rank == 0: save(...)``), rank 0
waits in the first all-gather while the others are already in the barrier after the save; on NCCL
rank 0 hangs inside ``_iterate_state_dict``. Fixed: every rank calls ``get_model_state_dict`` (with
``cpu_offload=True`` only rank 0 keeps the tensors) and rank 0 writes the file.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
from modern_helpers import needs_fsdp2_on_cpu, site, tiny_lm_fsdp2
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

pytestmark = needs_fsdp2_on_cpu


def train_and_save(gather_on_rank0_only: bool, path: str) -> int:
    rank = dist.get_rank()
    model = tiny_lm_fsdp2(frozen_base=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {}
    if gather_on_rank0_only:
        if rank == 0:
            state = get_model_state_dict(model, options=options)  # ONLY_RANK0
    else:
        state = get_model_state_dict(model, options=options)  # EVERY_RANK
    if rank == 0:
        torch.save(state, path)
    dist.barrier()  # AFTER_SAVE
    return len(state)


@pytest.mark.timeout(60)
def test_full_state_dict_on_rank0_only_is_diagnosed(expect_diagnosis, nccl_world, tmp_path):
    """"op mismatch at collective #N of group default: rank 0 all_gather_into_tensor, ranks 1-3
    barrier (from test_fsdp2_checkpoint.py:L; ranks 1-3 from ...)" at world 4."""
    expect_diagnosis(train_and_save, True, str(tmp_path / "model.pt"),
                     op=r"op mismatch .*rank 0 all_gather_into_tensor.*barrier", rank=0,
                     site=site(sys.modules[__name__], "ONLY_RANK0"))


@pytest.mark.nccl(timeout=60)
def test_every_rank_gathering_passes(rank, tmp_path):
    path = os.path.join(str(tmp_path), f"model-{os.getpid()}.pt")
    kept = train_and_save(False, path)
    if rank == 0:
        saved = torch.load(path)
        assert kept == len(saved) and any(k.startswith("lm_head") for k in saved)
        assert any("layers.0" in k for k in saved)  # the frozen backbone is in the checkpoint
    else:
        assert kept == 0  # cpu_offload: only rank 0 keeps the tensors
