"""verl's dynamic batching on ranks whose sequences differ in length (verl#6176, verl#6178).

With ``use_dynamic_bsz`` verl packs each rank's sequences into micro-batches of at most
``max_token_len`` tokens (``verl.utils.seqlen_balancing.rearrange_micro_batches``); every rank must
then run as many micro-batches as the busiest one, since each FSDP forward all-gathers the
parameters. ``rearrange_micro_batches`` agrees on the count with an ``all_reduce(MAX)`` over
``dp_group``. #5051 (first shipped in verl 0.7.1) made that all-reduce conditional on
``dp_group is not None``, and the FSDP actor, ``DataParallelPPOActor.compute_log_prob`` and
``update_policy`` (verl/workers/actor/dp_actor.py), never passed one: each rank counts its own
micro-batches, and the rank with fewer leaves the loop while another is still all-gathering for
its next forward (NCCL: a hang until the watchdog). Fixed on main by #5591 (pass the group); no
release carries the fix: 0.7.0 and earlier reduce over the default group (good), 0.7.1 is bad, and
0.8.0 removed the legacy actor (its FSDP engine passes its data-parallel group).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from pytest_nccl.testing import tiny_causal_lm

verl = pytest.importorskip("verl", reason="verl is not installed (pip install verl)")

MAX_TOKENS = 24  # the per-GPU token budget of one micro-batch
ROWS, SEQ, RESPONSE = 4, 16, 4
SHORT, LONG = 6, 12  # valid tokens per row: 4 x 6 = 24 (one micro-batch), 4 x 12 = 48 (two)


def _legacy_actor():
    try:
        from verl.workers.actor.dp_actor import DataParallelPPOActor
    except ModuleNotFoundError as e:  # 0.8.0 removed the legacy workers
        if e.name not in ("verl.workers.actor", "verl.workers.actor.dp_actor"):
            raise  # a dependency verl cannot import (0.7.0 with transformers 5) is an error, not a skip
        pytest.skip(f"verl {verl.__version__} has no legacy FSDP actor (verl.workers.actor.dp_actor)")
    return DataParallelPPOActor


def _verl_device_usable() -> None:
    """verl 0.9 picks its device from registered platforms (CUDA, NPU, ROCm) and falls back to CUDA
    without one: on a CPU-only machine its tensors would go to a device torch does not have."""
    from verl.utils.device import get_device_name

    device = get_device_name()
    if device != "cpu" and not getattr(getattr(torch, device, None), "is_available", lambda: False)():
        pytest.skip(f"verl {verl.__version__} puts its tensors on {device!r}, which this machine does not have")


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


def log_probs_of_the_step(rank: int, world: int, ragged: bool) -> torch.Tensor:
    actor = _legacy_actor()(actor_config(), tiny_fsdp2_model())
    result = actor.compute_log_prob(rollout_batch(rank, world, ragged))
    # 0.7.1 returns a dict; 0.7.0 and earlier (log_probs, entropy)
    log_probs = result["log_probs"] if isinstance(result, dict) else result[0]
    assert log_probs.shape == (ROWS, RESPONSE)
    # the step's metric, averaged over the data-parallel ranks as verl's trainer reduces its metrics
    mean = log_probs.mean().detach().clone()
    dist.all_reduce(mean)
    return mean


@pytest.mark.nccl(timeout=120)
def test_actor_log_prob_ragged_micro_batch_counts(rank, world_size):
    """Regression for verl#6176/#6178: the last rank's rows need two micro-batches, the others' one.
    Fails (CollectiveMismatch: the last rank's second forward all-gathers in verl's
    dp_actor.py while the others reduce the metric) on verl 0.7.1; passes on 0.7.0 and earlier."""
    log_probs_of_the_step(rank, world_size, ragged=True)


@pytest.mark.nccl(timeout=120)
def test_actor_log_prob_equal_micro_batch_counts(rank, world_size):
    """Control: the same lengths on every rank, one micro-batch each; passes on 0.7.1 too."""
    log_probs_of_the_step(rank, world_size, ragged=False)


@pytest.mark.nccl(timeout=120)
def test_rearrange_micro_batches_with_dp_group_agrees(rank, world_size):
    """verl's own sync, called as the fixed actor (and verl 0.8's FSDP engine) call it: with the
    data-parallel group passed, every rank gets the busiest rank's count. Passes on every release."""
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    _verl_device_usable()
    batch = rollout_batch(rank, world_size, ragged=True).batch
    micro_batches, _ = rearrange_micro_batches(batch, MAX_TOKENS, dp_group=dist.group.WORLD)
    assert len(micro_batches) == 2
