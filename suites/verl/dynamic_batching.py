"""The dynamic-batching step of verl's FSDP actor on this rank, shared by the suite's tests
(test_dynamic_batching.py) and the Ray job that runs it under verl's own worker group
(ray_worker_group.py). Plain functions, no pytest: a Ray worker imports this module (Ray puts the
driver's directory on its workers' path).

``rollout_batch(ragged=True)`` gives the last rank rows of LONG valid tokens and the others rows of
SHORT: with a budget of MAX_TOKENS per micro-batch the last rank needs two micro-batches, the others
one (verl#6176, verl#6178; see test_dynamic_batching.py for the releases).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from pytest_nccl.testing import tiny_causal_lm

MAX_TOKENS = 24  # the per-GPU token budget of one micro-batch
ROWS, SEQ, RESPONSE = 4, 16, 4
SHORT, LONG = 6, 12  # valid tokens per row: 4 x 6 = 24 (one micro-batch), 4 x 12 = 48 (two)
LEGACY_ACTOR = ("verl.workers.actor", "verl.workers.actor.dp_actor")


def legacy_actor():
    """verl's FSDP actor class (``DataParallelPPOActor``), or None where the release has none (0.8.0
    removed the legacy workers). A dependency verl cannot import (0.7.0 with transformers 5) raises."""
    try:
        from verl.workers.actor.dp_actor import DataParallelPPOActor
    except ModuleNotFoundError as e:
        if e.name not in LEGACY_ACTOR:
            raise
        return None
    return DataParallelPPOActor


def tiny_fsdp2_model():
    """A tiny Llama sharded with FSDP2 over every rank, as verl's FSDP workers shard the actor."""
    model = tiny_causal_lm(seed=0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def rollout_batch(rank: int, world: int, ragged: bool):
    """ROWS sequences of SEQ positions (prompt + RESPONSE response tokens); the last rank's rows hold
    LONG valid tokens, the others' SHORT (``ragged``), so the last rank needs two micro-batches and
    the others one. Not ragged: SHORT everywhere."""
    from verl import DataProto

    valid = LONG if ragged and rank == world - 1 else SHORT
    g = torch.Generator().manual_seed(rank)
    input_ids = torch.randint(3, 60, (ROWS, SEQ), generator=g)
    attention_mask = torch.zeros(ROWS, SEQ, dtype=torch.long)
    attention_mask[:, SEQ - valid:] = 1  # left-padded, as verl's rollouts are
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
             "responses": input_ids[:, -RESPONSE:]}
    meta = {"micro_batch_size": 2, "temperature": 1.0, "use_dynamic_bsz": True, "max_token_len": MAX_TOKENS}
    return DataProto.from_dict(tensors=batch, meta_info=meta)


def actor_config():
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": MAX_TOKENS, "use_remove_padding": False,
        "use_fused_kernels": False, "ulysses_sequence_parallel_size": 1, "entropy_from_logits_with_chunking": False,
        "use_torch_compile": False, "fsdp_config": {"dtype": "float32"},
    })


def log_probs_of_the_step(actor_class, rank: int, world: int, ragged: bool) -> torch.Tensor:
    """One ``compute_log_prob`` of ``actor_class`` (verl's actor) on this rank's rollout, then the
    step's metric averaged over the ranks (an all_reduce, as verl's trainer reduces its metrics)."""
    actor = actor_class(actor_config(), tiny_fsdp2_model())
    result = actor.compute_log_prob(rollout_batch(rank, world, ragged))
    # 0.7.1 returns a dict; 0.7.0 and earlier (log_probs, entropy)
    log_probs = result["log_probs"] if isinstance(result, dict) else result[0]
    assert log_probs.shape == (ROWS, RESPONSE)
    mean = log_probs.mean().detach().clone()
    dist.all_reduce(mean)
    return mean
