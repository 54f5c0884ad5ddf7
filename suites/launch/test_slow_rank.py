"""verl's uneven rollouts: one rank generates far longer than the others before a collective.

In verl's PPO/GRPO loop every rank generates rollouts for its own prompts, then the ranks meet in a
collective (gathering rollouts, all-reducing metrics or the batch's token count). Generation stops
per sequence at EOS or at the response length limit, so a rank that drew a prompt whose answer does
not stop (or a much larger limit) keeps decoding while the others wait in the collective; NCCL then
reports a watchdog timeout on every rank after 10-30 minutes ("all ranks timed out"), which names
no culprit. Under pytest-nccl the report names the slow rank and where it is busy, with its stack.
"""

import time

import pytest
import torch
import torch.distributed as dist

import pytest_nccl

DECODE_STEP_S = 0.01
EOS = -1


def generate_rollout(prompt_id: int, max_new_tokens: int) -> torch.Tensor:
    """Stands in for vLLM/HF generation: one decode step per token until EOS or the length limit."""
    tokens = []
    for step in range(max_new_tokens):
        time.sleep(DECODE_STEP_S)  # one forward pass of the policy
        token = EOS if prompt_id % 2 == 0 and step == 15 else step
        if token == EOS:
            break
        tokens.append(token)
    return torch.tensor(tokens, dtype=torch.long)


def gather_rollout_lengths(rollout: torch.Tensor, world_size: int) -> list[int]:
    n = torch.tensor([rollout.numel()])
    sizes = [torch.zeros_like(n) for _ in range(world_size)]
    dist.all_gather(sizes, n)
    return [int(s.item()) for s in sizes]


@pytest.mark.nccl(timeout=3)
@pytest.mark.xfail(raises=pytest_nccl.CollectiveTimeout, strict=True,
                   reason="verl: the last rank's rollout does not stop; the others wait in the gather")
def test_uneven_rollout_lengths_slow_rank(rank, world_size):
    # every rank's prompt stops at EOS after 15 tokens but the last rank's (rank 1 at world 2),
    # whose answer never stops, and its length limit (a long-context config) is far beyond the
    # collective's timeout
    slow = rank == world_size - 1
    prompt_id, max_new_tokens = (1, 100_000) if slow else (0, 256)
    rollout = generate_rollout(prompt_id, max_new_tokens)
    gather_rollout_lengths(rollout, world_size)


@pytest.mark.nccl(timeout=30)
def test_rollout_lengths_within_a_shared_limit(rank, world_size):
    # the same loop with a response length limit that every rank can meet within the bound:
    # even ranks stop at EOS after 15 tokens, odd ranks at the limit
    rollout = generate_rollout(prompt_id=rank, max_new_tokens=32)
    lengths = gather_rollout_lengths(rollout, world_size)
    assert lengths == [15 if r % 2 == 0 else 32 for r in range(world_size)]
