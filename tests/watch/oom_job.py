"""A job whose rank 1 moves itself into a small memory cgroup after 3 collectives
(tests/test_watch_oom.py), under torchrun.

    python oom_job.py oom      rank 1 then allocates until the kernel's OOM killer takes it
    python oom_job.py sleeps   rank 1 then sleeps (the test kills it with a plain SIGKILL)

Rank 0 waits in the 4th all_reduce. ``$OOM_CGROUP`` is the cgroup's directory; each rank writes its
pid to ``$ENDINGS_READY.R`` once it did its first 3 collectives (and rank 1 moved).
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        with open(os.path.join(os.environ["OOM_CGROUP"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        # the watch reads a rank's cgroup once a tick (50 ms): a job's ranks start in theirs, this one
        # moved, and the watch must have seen it there before the kill for the count to be its
        time.sleep(1.0)
    with open(f"{os.environ['ENDINGS_READY']}.{rank}", "w") as f:
        f.write(str(os.getpid()))
    if rank == 1 and mode == "oom":
        held = []
        while True:  # written, not only reserved: every page is charged to the cgroup
            held.append(b"\x01" * (8 << 20))
    if rank == 1:
        time.sleep(600)
    dist.all_reduce(t)
    print("never", t.item())


if __name__ == "__main__":
    main(sys.argv[1])
