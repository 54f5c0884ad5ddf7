"""A job whose ranks read their rank from the environment, as ``torchrun`` (``python -m
torch.distributed.run``) starts them: three all_reduces, then an all_gather whose size differs on
rank 1 in the bad case (gloo aborts), or that rank 1 skips for a barrier in the desync case (without
a watch the ranks wait for gloo's 30 minutes). A test runs it in a subprocess (tests/test_launched.py).

    torchrun --nproc-per-node 2 env_job.py good|bad|desync
"""

import sys

import torch
import torch.distributed as dist


def main() -> int:
    case = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    n = 3 if case == "bad" and rank == 1 else 2
    if case == "desync" and rank == 1:
        dist.barrier()  # the barrier
    else:
        dist.all_gather([torch.zeros(n) for _ in range(world)], torch.ones(n))  # the gather
    dist.barrier()
    print(f"rank {rank} trained", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
