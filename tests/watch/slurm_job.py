"""A rank as ``srun`` starts it: SLURM_PROCID and SLURM_NTASKS in its environment, no RANK; the
script maps them to ``init_process_group``'s arguments itself.

    SLURM_PROCID=R SLURM_NTASKS=2 python slurm_job.py good|bad PORT
"""

import os
import sys

import torch
import torch.distributed as dist

case, port = sys.argv[1], int(sys.argv[2])
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
n = 3 if case == "bad" and rank == 1 else 2
dist.all_gather([torch.zeros(n) for _ in range(world)], torch.ones(n))  # the gather
dist.barrier()
print(f"rank {rank} trained", flush=True)
dist.destroy_process_group()
