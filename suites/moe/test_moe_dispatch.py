"""Expert-parallel dispatch and combine with routing that differs across ranks (megatron-core's
``all_to_all``, see expert_parallel.py for why not the dispatcher class itself).

- A rank whose expert receives no tokens returns a new empty tensor instead of running its expert
  (PaddleFormers PR #3010): its combine output no longer needs a gradient, so its backward skips
  both backward all-to-alls and goes on to the expert group's next collective (the load statistics'
  all-reduce) while the others wait in the combine's backward all-to-all. Fixed: run the expert on
  the empty tensor.
- Split sizes that disagree between the two sides: the last rank takes its own send counts for what
  it expects instead of the exchanged counts; the verdict names what a sender sends every rank and
  what the last rank expects from it. Fixed: the counts from the exchange.
"""

from __future__ import annotations

import sys

import pytest
from expert_parallel import moe_step, site

MODULE = sys.modules[__name__]


def to_all_but_last(rank: int, world: int) -> list[int]:
    """Every rank routes 2 tokens to each expert but the last rank's, which gets none."""
    return [2] * (world - 1) + [0]


def uneven(rank: int, world: int) -> list[int]:
    """Rank r routes 1 + (2r + e) % 3 tokens to expert e: what i sends j is not what j sends i."""
    return [1 + (2 * rank + e) % 3 for e in range(world)]


@pytest.mark.timeout(60)
def test_rank_with_no_tokens_skipping_backward_is_diagnosed(expect_diagnosis, nccl_world):
    """"op mismatch at collective #3 of group ep[0,1]: rank 0 all_to_all_single, rank 1 all_reduce
    (from megatron/.../mappings.py:444 <- expert_parallel.py:L; rank 1 from expert_parallel.py:M)"
    (world 2): the rank that received nothing left the backward."""
    import expert_parallel
    last = nccl_world.size - 1
    expect_diagnosis(moe_step, to_all_but_last, False,
                     op=rf"op mismatch at collective #3 of group ep\[[^]]*\]: ranks? [\d,-]+ all_to_all_single, "
                        rf"rank {last} all_reduce", rank=last, site=site(expert_parallel, "LOAD STATS"))


@pytest.mark.nccl(timeout=60)
def test_expert_run_on_empty_tokens_passes(rank):
    assert moe_step(to_all_but_last) == moe_step(to_all_but_last)


@pytest.mark.timeout(60)
def test_split_sizes_disagreeing_is_diagnosed(expect_diagnosis, nccl_world):
    """"split mismatch in all_to_all_single #1 of group ep[0,1]: rank 0 sends [2, 2] but rank 1
    expects 3 from it" (world 2)."""
    import expert_parallel
    last = nccl_world.size - 1
    expect_diagnosis(moe_step, uneven, True, False,
                     op=rf"split mismatch in all_to_all_single #1 of group ep\[[^]]*\]: rank \d+ sends \[[\d, ]+\] but "
                        rf"rank {last} expects \d+ from it", rank=last, site=site(expert_parallel, "DISPATCH"))


@pytest.mark.nccl(timeout=60)
def test_split_sizes_from_the_exchanged_counts_pass(rank):
    moe_step(uneven)
