"""Ranks started with ``torch.multiprocessing.spawn`` or plain ``multiprocessing``: no RANK in their
environment; each passes ``rank=``/``world_size=`` (and an ``init_method`` URL) to
``init_process_group``.

    python spawn_job.py good|bad mp-spawn|mp-fork|mp-spawn-process PORT
"""

import multiprocessing
import sys

import torch
import torch.distributed as dist

WORLD = 2


def train(rank: int, case: str, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    n = 3 if case == "bad" and rank == 1 else 2
    dist.all_gather([torch.zeros(n) for _ in range(WORLD)], torch.ones(n))  # the gather
    dist.barrier()
    print(f"rank {rank} trained", flush=True)
    dist.destroy_process_group()


def main() -> int:
    case, how, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if how == "mp-spawn":
        import torch.multiprocessing as mp

        mp.spawn(train, args=(case, port), nprocs=WORLD)
        return 0
    ctx = multiprocessing.get_context("fork" if how == "mp-fork" else "spawn")
    procs = [ctx.Process(target=train, args=(rank, case, port)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode for p in procs) and 1


if __name__ == "__main__":
    sys.exit(main())
