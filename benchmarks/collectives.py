"""Functions the benchmarks run on every rank (module level, so a rank can import them)."""

import time

import torch
import torch.distributed as dist


def trivial():
    return None


def all_reduces(n: int) -> float:
    """Seconds for ``n`` one-element all_reduces on this rank."""
    t = torch.ones(1)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return time.perf_counter() - start
