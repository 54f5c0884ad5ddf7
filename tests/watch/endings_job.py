"""A job for the endings of a watched job (tests/test_watch_endings.py), under torchrun, ``accelerate
launch`` or on its own with ``torch.multiprocessing.spawn``.

    python endings_job.py sleeps     rank 1 sleeps before the 4th all_reduce; the others wait in it
    python endings_job.py healthy    8 steps of an all_reduce, 0.5 s apart; exits 0
    python endings_job.py watchdog   the NCCL model, a 5 s watchdog: rank 1 sleeps before the 4th
                                     all_reduce, rank 0's watchdog aborts it, torchrun ends rank 1
    python endings_job.py sleeps mp-spawn PORT   the first, its 2 ranks from mp.spawn

Each rank writes its pid to ``$ENDINGS_READY.R`` once it did its first 3 collectives.
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pytest_nccl.testing import nccl_model


def run(rank, mode: str, port: int = 0) -> None:
    if mode == "watchdog":
        nccl_model.register()
        dist.init_process_group(nccl_model.NAME, timeout=timedelta(seconds=5))
    elif port:  # mp.spawn: rank and world as arguments
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(t)
    with open(f"{os.environ['ENDINGS_READY']}.{rank}", "w") as f:
        f.write(str(os.getpid()))
    if mode == "healthy":
        for _ in range(8):
            time.sleep(0.5)
            dist.all_reduce(t)
        return
    if rank == 1:
        time.sleep(600)  # the line the reports name
    dist.all_reduce(t)
    print("never", nccl_model.item(t[0]) if mode == "watchdog" else t.item())


if __name__ == "__main__":
    if sys.argv[2:3] == ["mp-spawn"]:
        import torch.multiprocessing as mp

        mp.spawn(run, args=(sys.argv[1], int(sys.argv[3])), nprocs=2)
    else:
        run(None, sys.argv[1])
