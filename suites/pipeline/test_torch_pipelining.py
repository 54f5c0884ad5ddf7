"""torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` at PP = the world, two stages per rank:
the schedule pytorch#172668 prints (``get_schedule_ops("Interleaved1F1B", ...)``), run for real on
gloo. It completes and every send pairs with a receive of its shape: the pairing check stays silent
on a real schedule's traffic.

The deadlock #172668 reports needs NCCL: a send occupies the stream, so the receive enqueued after
it on the same stream cannot start until the peer receives (both ranks send first). The runtime
here posts its sends and goes on; gloo never holds the receive behind them. The same order, with
each send waited on before the receive (what the stream does), is
``test_megatron_p2p.py::test_both_stages_sending_first_is_diagnosed``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

pipelining = pytest.importorskip("torch.distributed.pipelining")


@pytest.mark.nccl(timeout=90)
def test_interleaved_1f1b_over_every_rank_passes(rank):
    world = dist.get_world_size()
    n_stages, micro_batches = 2 * world, 2 * world
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(n_stages)]  # the same weights on every rank
    stages = [pipelining.PipelineStage(layers[i], i, n_stages, torch.device("cpu"))
              for i in range(rank, n_stages, world)]  # looped: rank r holds stages r and r + world
    schedule = pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches,
                                                  loss_fn=lambda out, target: (out - target).pow(2).mean())
    x, target = torch.randn(2 * micro_batches, 8), torch.zeros(2 * micro_batches, 8)
    losses: list = []
    # stage 0 (on rank 0) takes the input, the last stage (on the last rank) the target
    schedule.step(x if rank == 0 else None, target=target if rank == world - 1 else None, losses=losses)
    if rank == world - 1:
        assert len(losses) == micro_batches and all(torch.isfinite(loss) for loss in losses)
    assert all(p.grad is not None for stage in stages for p in stage.submod.parameters())
