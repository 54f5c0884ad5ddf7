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

verl = pytest.importorskip("verl", reason="verl is not installed (pip install verl)")

from dynamic_batching import MAX_TOKENS, legacy_actor, log_probs_of_the_step, rollout_batch  # noqa: E402


def _legacy_actor():
    actor = legacy_actor()
    if actor is None:  # 0.8.0 removed the legacy workers
        pytest.skip(f"verl {verl.__version__} has no legacy FSDP actor (verl.workers.actor.dp_actor)")
    return actor


def _verl_device_usable() -> None:
    """verl 0.9 picks its device from registered platforms (CUDA, NPU, ROCm) and falls back to CUDA
    without one: on a CPU-only machine its tensors would go to a device torch does not have."""
    from verl.utils.device import get_device_name

    device = get_device_name()
    if device != "cpu" and not getattr(getattr(torch, device, None), "is_available", lambda: False)():
        pytest.skip(f"verl {verl.__version__} puts its tensors on {device!r}, which this machine does not have")


@pytest.mark.nccl(timeout=120)
def test_actor_log_prob_ragged_micro_batch_counts(rank, world_size):
    """Regression for verl#6176/#6178: the last rank's rows need two micro-batches, the others' one.
    Fails (CollectiveMismatch: the last rank's second forward all-gathers in verl's
    dp_actor.py while the others reduce the metric) on verl 0.7.1; passes on 0.7.0 and earlier."""
    log_probs_of_the_step(_legacy_actor(), rank, world_size, ragged=True)


@pytest.mark.nccl(timeout=120)
def test_actor_log_prob_equal_micro_batch_counts(rank, world_size):
    """Control: the same lengths on every rank, one micro-batch each; passes on 0.7.1 too."""
    log_probs_of_the_step(_legacy_actor(), rank, world_size, ragged=False)


@pytest.mark.nccl(timeout=120)
def test_rearrange_micro_batches_with_dp_group_agrees(rank, world_size):
    """verl's own sync, called as the fixed actor (and verl 0.8's FSDP engine) call it: with the
    data-parallel group passed, every rank gets the busiest rank's count. Passes on every release."""
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    _verl_device_usable()
    batch = rollout_batch(rank, world_size, ragged=True).batch
    micro_batches, _ = rearrange_micro_batches(batch, MAX_TOKENS, dp_group=dist.group.WORLD)
    assert len(micro_batches) == 2
