"""A weight-sync side group as OpenRLHF makes it: the trainer's rank 0 (this process) and stand-in
inference engines (``multiprocessing`` children) create a group of their own over a ``tcp://``
rendezvous; none of them creates a default process group. The trainer broadcasts its weights.

    python side_group_job.py good|bad openrlhf|torch PORT [trainer-group]

- ``openrlhf``: OpenRLHF's own ``openrlhf.utils.distributed_util.init_process_group`` (loaded from
  its file: the package's ``__init__`` imports its whole trainer stack), group "openrlhf".
- ``torch``: what it does, in plain torch (no ``_new_process_group_helper``): torch's
  ``rendezvous``, a ``PrefixStore`` and ``ProcessGroupGloo``, group "weight-sync".
- ``bad``: the last engine never joins (it started, and is busy elsewhere when the others wait).
- The engines join when the trainer does (it sets ``go`` right before its own join), as OpenRLHF's
  trainer calls every engine's ``init_process_group`` and then its own: the members' waits start
  together, whatever the trainer did before (its own default group, on a loaded host, takes seconds).
- ``trainer-group``: the trainer's rank 0 is a rank of a default group too (of one, here), as
  OpenRLHF's trainer is of its DeepSpeed group.
"""

import datetime
import importlib.util
import multiprocessing
import os
import sys
import time

import torch
import torch.distributed

ENGINES = 3
WORLD = ENGINES + 1
TIMEOUT = datetime.timedelta(seconds=600)  # the store's own bound: far past the watch's


def openrlhf_util():
    package = importlib.util.find_spec("openrlhf")
    path = os.path.join(package.submodule_search_locations[0], "utils", "distributed_util.py")
    spec = importlib.util.spec_from_file_location("openrlhf_distributed_util", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weight_sync_group(how: str, rank: int, port: int):
    if how == "openrlhf":
        return openrlhf_util().init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                                  world_size=WORLD, rank=rank, group_name="openrlhf",
                                                  timeout=TIMEOUT)
    dist = torch.distributed
    group_name = "weight-sync"
    store, rank, world = next(dist.rendezvous(f"tcp://127.0.0.1:{port}", rank, WORLD, timeout=TIMEOUT))
    return dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), rank, world, TIMEOUT)  # the group


def member(how: str, rank: int, port: int) -> None:
    group = weight_sync_group(how, rank, port)
    weights = torch.full((4,), 7.0) if rank == 0 else torch.zeros(4)
    options = torch.distributed.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([weights], options).wait()
    assert weights.tolist() == [7.0] * 4, weights
    print(f"member {rank} synced", flush=True)


def engine(case: str, how: str, rank: int, port: int, ready, go) -> None:
    ready.put(rank)  # started (as OpenRLHF's engines are before the trainer makes the group)
    go.wait(300)
    if case == "bad" and rank == ENGINES:
        time.sleep(600)  # never joins
    member(how, rank, port)


def main() -> int:
    case, how, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    engines = [ctx.Process(target=engine, args=(case, how, rank, port, ready, go)) for rank in range(1, WORLD)]
    for p in engines:
        p.start()
    for _ in engines:
        ready.get(timeout=300)
    if sys.argv[4:] == ["trainer-group"]:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
        torch.distributed.barrier()
    go.set()
    print(f"trainer waits from {time.time():.3f}", flush=True)
    member(how, 0, port)
    for p in engines:
        p.join()
    return max(p.exitcode for p in engines) and 1


if __name__ == "__main__":
    sys.exit(main())
