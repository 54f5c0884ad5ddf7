"""A small gloo job that leaves Flight Recorder dumps as NCCL's dump-on-timeout does: each rank writes
``_dump_fr_trace(True, True, False)`` (the pickle, Python frames included) to ``<prefix><rank>``
once the job has stalled, then exits. Run under torchrun: ``torchrun --nproc-per-node=W fr_job.py
SCENARIO PREFIX``. The lines the tests expect in headlines are marked ``# line: NAME``."""

import os
import pickle
import sys
import threading
import time

import torch
import torch.distributed as dist

SCENARIO, PREFIX = sys.argv[1], sys.argv[2]
STALL_S = float(os.environ.get("FR_JOB_STALL_S", "3"))


def write_dump() -> None:
    """This rank's dump at ``<prefix><rank>``, written whole or not at all."""
    blob = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    path = f"{PREFIX}{dist.get_rank()}"
    with open(path + ".part", "wb") as f:
        f.write(blob)
    os.replace(path + ".part", path)


def last_entry_retired() -> bool:
    """Whether this rank's last Flight Recorder entry is retired (marked completed)."""
    entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False))["entries"]
    return bool(entries and entries[-1].get("retired"))


def dump_and_exit(after: float) -> None:
    """What NCCL's watchdog does on a timeout: write this rank's dump, then end the rank."""
    time.sleep(after)
    write_dump()
    if SCENARIO == "gone":
        os._exit(0)  # gone before the others dump: their collective with it fails first
    # every rank's dump before any rank goes: a peer gone would end the others' collectives first
    world = dist.get_world_size()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(os.path.exists(f"{PREFIX}{r}") for r in range(world)):
        time.sleep(0.05)
    os._exit(0)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(8)
    tp = [dist.new_group([r, r + 1], group_desc=f"tp_{r // 2}") for r in range(0, world, 2)]
    mine = tp[rank // 2]
    if not (SCENARIO == "gone" and rank == 0):  # rank 0 dumps once its collective has failed
        threading.Thread(target=dump_and_exit, args=(STALL_S,), daemon=True).start()
    for _ in range(2):
        dist.all_reduce(x)  # line: step
    if SCENARIO in ("skip", "missing"):
        if rank != 1:
            dist.all_reduce(x)  # line: waits
        time.sleep(60)  # rank 1 skipped it: the job stalls here
    elif SCENARIO == "gone":
        if rank == 1:
            time.sleep(60)  # skips the collective; its dump is written and it ends
        try:
            dist.all_reduce(x)  # line: gonewaits
        except RuntimeError:  # rank 1 closed its connection: the Flight Recorder marks this completed,
            deadline = time.monotonic() + 30  # a moment after the call raised
            while time.monotonic() < deadline and not last_entry_retired():
                time.sleep(0.05)
            write_dump()
            os._exit(0)
    elif SCENARIO == "op":
        if rank == 1:
            dist.broadcast(x, src=0)  # line: odd
        else:
            dist.all_reduce(x)  # line: opwaits
        time.sleep(60)
    elif SCENARIO == "subgroup":
        dist.all_reduce(x, group=mine)  # line: sub
        if rank != 3:
            dist.all_reduce(x, group=mine)  # line: subwait
        time.sleep(60)
    elif SCENARIO == "behind":
        if rank == 0:
            works = [dist.all_reduce(x, async_op=True) for _ in range(4)]  # line: ahead
            works[-1].wait()
        time.sleep(60)  # rank 1 never comes: it is 4 collectives behind
    elif SCENARIO == "healthy":
        for _ in range(3):
            dist.all_reduce(x, group=mine)  # line: sub
        dist.barrier()
        time.sleep(60)  # the dump is taken while every rank idles, as a dump taken on demand is
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    main()
