"""A training loop on the NCCL model (``pytest_nccl.testing.nccl_model``: collectives return
enqueued, complete on a stream, the loss is read at a sync point), launched by torchrun.

    python nccl_model_job.py good      every rank runs 12 steps, gradients reduced overlapped
    python nccl_model_job.py uneven    rank 1 has one batch fewer: rank 0's last all_reduce never
                                       completes, and rank 0 blocks reading its loss
"""

import sys

import torch
import torch.distributed as dist

from pytest_nccl.testing import nccl_model

nccl_model.register()
dist.init_process_group(nccl_model.NAME)
rank = dist.get_rank()
steps = 11 if sys.argv[1] == "uneven" and rank == 1 else 12
for step in range(steps):
    buckets = [torch.ones(16) for _ in range(3)]
    works = [dist.all_reduce(b, async_op=True) for b in buckets]  # gradient buckets, overlapped
    for w in works:
        w.wait()
    loss = torch.ones(1)
    dist.all_reduce(loss)  # the step's loss
    print(f"rank {rank} step {step} loss {nccl_model.item(loss[0])}", flush=True)  # the sync point
dist.destroy_process_group()
