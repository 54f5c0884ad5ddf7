"""Expert parallelism on CPU ranks through megatron-core's own ``all_to_all`` (``tensor_parallel.
mappings``): the autograd function whose forward is an ``all_to_all_single`` with the routing's
split sizes and whose backward is the same exchange with the sizes swapped, as the all-to-all token
dispatcher calls it for dispatch and combine.

``MoEAlltoAllTokenDispatcher`` itself does not run on a CPU torch: its constructor makes a
``torch.cuda.Stream()`` ("torch.cuda.Stream requires CUDA support", measured with 0.16.1). The layer
here does what its ``token_dispatch`` / ``token_combine`` do around that function: count the tokens
each rank routes to each expert, exchange the counts, send the tokens, run the local expert, send
them back. ``on_cpu`` makes megatron's receive buffer (``torch.cuda.current_device()``) a CPU one.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from unittest import mock

import pytest
import torch
import torch.distributed as dist

mappings = pytest.importorskip("megatron.core.tensor_parallel.mappings",
                               reason="megatron-core is not installed (pip install 'megatron-core==0.16.1')")

HIDDEN = 4


@contextlib.contextmanager
def on_cpu():
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"):
        yield


def ep_group():
    """The expert-parallel group: every rank, one expert each (named "ep" in the headlines)."""
    return dist.new_group(list(range(dist.get_world_size())), group_desc="ep")


def moe_step(counts_of, expert_on_empty: bool = True, output_splits_from_counts: bool = True) -> float:
    """One forward and backward of an MoE layer with a residual, then the expert group's load
    statistics and the gradient all-reduce.
    ``counts_of(rank, world)``: how many of its tokens a rank routes to each expert.
    ``expert_on_empty``: a rank that receives no tokens still runs its expert on the empty tensor
    (else it returns a new empty tensor: the graph is cut there, PaddleFormers#3010);
    ``output_splits_from_counts``: what a rank expects from each comes from the exchanged counts
    (else the last rank takes its own send counts for them)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = ep_group()
    torch.manual_seed(0)
    expert = torch.nn.Linear(HIDDEN, HIDDEN)  # the same weights on every rank: one expert per rank
    counts = counts_of(rank, world)
    tokens = torch.randn(sum(counts), HIDDEN, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    every = torch.empty(world * world, dtype=torch.long)
    dist.all_gather_into_tensor(every, torch.tensor(counts))  # the counts: rank i's row, what it routes where
    every = every.view(world, world)
    input_splits = counts
    output_splits = every[:, rank].tolist()  # what each rank routes to this rank's expert
    if not output_splits_from_counts and rank == world - 1:
        output_splits = counts  # as if the routing were symmetric
    with on_cpu():
        # the tokens are in expert order already (as megatron's permute leaves them): counts[e] for expert e
        received = mappings.all_to_all(group, tokens, output_splits, input_splits)  # DISPATCH
        if len(received) == 0 and not expert_on_empty:
            out = torch.zeros(0, HIDDEN)  # a new tensor: no gradient will flow back through this rank's combine
        else:
            out = expert(received)
        combined = mappings.all_to_all(group, out, input_splits, output_splits)  # COMBINE
        loss = (tokens + combined).pow(2).mean()
        loss.backward()  # BACKWARD
    load = torch.tensor(output_splits, dtype=torch.float)
    dist.all_reduce(load, group=group)  # LOAD STATS: tokens per expert, for the load-balancing log
    grad = expert.weight.grad if expert.weight.grad is not None else torch.zeros_like(expert.weight)
    dist.all_reduce(grad)  # GRAD SYNC
    return float(loss)


def site(module, marker: str) -> str:
    """A regex for 'file.py:LINE' of the line of ``module`` that carries ``# marker``."""
    lines, _ = inspect.getsourcelines(module)
    number = next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)
    return re.escape(f"{module.__name__.rsplit('.', 1)[-1]}.py:{number}") + r"\b"
