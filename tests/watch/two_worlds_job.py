"""A job that creates two default worlds, as OpenRLHF's trainer ranks beside a vLLM engine's own
world (each calls init_process_group over a store of its own): their collectives differ in shape.
``good``: two worlds of two ranks. ``bad``: rank 1 of the trainer's world leaves one all_reduce
early. ``engine-bad``: the trainer's world is created first and ends clean; rank 1 of the engine's
world leaves early. ``elsewhere``: the engine's world has four ranks, and ranks 2,3 run outside the
watch (as on another node, or a server started apart): healthy. ``elsewhere-bad``: rank 3 of those
leaves early."""

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time


def member(world: str, rank: int, size: int, port: int, steps: int, trainer_ready) -> None:
    import torch
    import torch.distributed as dist

    if world == "engine" and trainer_ready is not None:
        trainer_ready.wait()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    if world == "trainer" and trainer_ready is not None:
        trainer_ready.set()
    for i in range(steps):
        dist.all_reduce(torch.ones(2 if world == "trainer" else 3 + (i if size == 2 else 0)))  # the step
        time.sleep(0.1)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outside_the_watch(rank: int, port: int, steps: int) -> subprocess.Popen:
    """A rank of the engine's world that the watch does not see: started without its hook."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_NCCL_") and k != "PYTHONPATH"}
    return subprocess.Popen([sys.executable, __file__, "outside", str(rank), str(port), str(steps)], env=env)


if __name__ == "__main__":
    case = sys.argv[1]
    if case == "outside":
        member("engine", int(sys.argv[2]), 4, int(sys.argv[3]), int(sys.argv[4]), None)
        sys.exit()
    ctx = mp.get_context("spawn")
    trainer, engine = free_port(), free_port()
    ready = ctx.Event() if case == "engine-bad" else None
    engine_size = 4 if case.startswith("elsewhere") else 2
    outside = [outside_the_watch(r, engine, 12 - (r == 3 and case == "elsewhere-bad")) for r in (2, 3)
               if engine_size == 4]
    procs = [ctx.Process(target=member, args=("trainer", r, 2, trainer, 10 - (r if case == "bad" else 0), ready))
             for r in range(2)]
    procs += [ctx.Process(target=member, args=("engine", r, engine_size, engine,
                                               12 - (r if case == "engine-bad" else 0), ready)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    for o in outside:
        o.wait()
    sys.exit(max(p.exitcode for p in procs))
