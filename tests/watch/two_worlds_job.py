"""A job that creates two default worlds of two ranks each, as OpenRLHF's trainer ranks beside a vLLM
engine's own world (each calls init_process_group over a store of its own): their collectives differ
in shape. ``bad``: rank 1 of the trainer's world leaves one all_reduce early. ``engine-bad``: the
trainer's world is created first and ends clean; rank 1 of the engine's world leaves early."""

import multiprocessing as mp
import socket
import sys
import time


def member(world: str, rank: int, port: int, steps: int, trainer_ready) -> None:
    import torch
    import torch.distributed as dist

    if world == "engine" and trainer_ready is not None:
        trainer_ready.wait()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if world == "trainer" and trainer_ready is not None:
        trainer_ready.set()
    for i in range(steps):
        dist.all_reduce(torch.ones(2 if world == "trainer" else 3 + i))  # the step
        time.sleep(0.1)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    case = sys.argv[1]
    ctx = mp.get_context("spawn")
    trainer, engine = free_port(), free_port()
    ready = ctx.Event() if case == "engine-bad" else None
    procs = [ctx.Process(target=member, args=("trainer", r, trainer, 10 - (r if case == "bad" else 0), ready))
             for r in range(2)]
    procs += [ctx.Process(target=member, args=("engine", r, engine, 12 - (r if case == "engine-bad" else 0), ready))
              for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
