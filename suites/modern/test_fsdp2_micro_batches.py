"""Per-rank micro-batch counts under FSDP2 (verl#5591's shape).

Dynamic batching packs each rank's sequences into micro-batches of at most ``MAX_TOKENS`` tokens:
``num_micro_batches = ceil(tokens / MAX_TOKENS)``, computed on each rank from its own data. The
last rank's sequences are longer, so it runs one micro-batch more: its extra forward all-gathers
FSDP2's parameters while every other rank is already in the gradient-norm all-reduce of the
optimizer step (on NCCL: a hang until the watchdog). verl's fix (#5591): agree on the count first,
an all-reduce MAX over the data-parallel group, and let ranks with fewer sequences run empty
micro-batches (a zero-weighted loss keeps every FSDP2 collective in step).
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.distributed as dist
from modern_helpers import needs_fsdp2_on_cpu, site, tiny_lm_fsdp2

MAX_TOKENS = 24
SHORT, LONG = 6, 10

pytestmark = needs_fsdp2_on_cpu


def sequences(rank: int, world: int) -> list[torch.Tensor]:
    """Four sequences per rank; the last rank's are longer (more tokens, one micro-batch more)."""
    length = LONG if rank == world - 1 else SHORT
    g = torch.Generator().manual_seed(rank)
    return [torch.randint(3, 60, (length,), generator=g) for _ in range(4)]


def micro_batches(seqs: list[torch.Tensor], count: int) -> list[list[torch.Tensor]]:
    """``count`` micro-batches, sequences dealt in order; the tail ones may be empty."""
    per = math.ceil(len(seqs) / count)
    return [seqs[i * per:(i + 1) * per] for i in range(count)]


def train_step(agree_on_count: bool) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm_fsdp2()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seqs = sequences(rank, world)
    count = math.ceil(sum(len(s) for s in seqs) / MAX_TOKENS)
    if agree_on_count:  # verl#5591: every rank runs as many micro-batches as the busiest one
        n = torch.tensor(count)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # AGREE
        count = int(n)
    for batch in micro_batches(seqs, count):
        if batch:
            ids = torch.stack(batch)
            loss = model(input_ids=ids, labels=ids).loss / count  # FORWARD
        else:  # an empty micro-batch still runs FSDP2's gathers and reduce-scatters
            ids = seqs[0][None, :2]
            loss = model(input_ids=ids, labels=ids).loss * 0.0
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # GRAD_NORM
    opt.step()
    return count


@pytest.mark.timeout(60)
def test_per_rank_micro_batch_counts_are_diagnosed(expect_diagnosis, nccl_world):
    """The last rank's extra forward against the others' grad-norm all-reduce: "op mismatch at
    collective #N of group default: ranks 0-2 all_reduce, rank 3 all_gather_single (from
    test_fsdp2_micro_batches.py:L; rank 3 from test_fsdp2_micro_batches.py:M)" at world 4."""
    module = sys.modules[__name__]
    expect_diagnosis(train_step, False, op=r"op mismatch .*all_reduce.*all_gather", rank=nccl_world.size - 1,
                     site=site(module, "FORWARD"))


@pytest.mark.nccl(timeout=60)
def test_agreed_micro_batch_count_passes(rank, world_size):
    counts = train_step(True)
    assert counts == math.ceil(4 * LONG / MAX_TOKENS)  # the last rank's count, on every rank
