"""A job started by the ``deepspeed`` launcher: DeepSpeed creates the group
(``deepspeed.init_distributed``) and the collectives go through ``deepspeed.comm``.

    deepspeed --num_gpus 2 deepspeed_job.py good|bad
"""

import sys

import deepspeed
import deepspeed.comm as dist
import torch


def main() -> int:
    case = sys.argv[-1]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    n = 3 if case == "bad" and rank == 1 else 2
    dist.all_gather([torch.zeros(n) for _ in range(2)], torch.ones(n))  # the gather
    dist.barrier()
    print(f"rank {rank} trained", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
