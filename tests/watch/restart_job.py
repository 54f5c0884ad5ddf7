"""A torchrun job with elastic restarts (``--max-restarts 1``): which attempt this is comes from
torchrun (TORCHELASTIC_RESTART_COUNT).

    torchrun --nproc-per-node 2 --max-restarts 1 restart_job.py flaky|broken|rejoin|hang

flaky: rank 1 raises in the first attempt only (the restart succeeds); broken: rank 1 raises in
every attempt (torchrun gives up); rejoin: rank 1 raises in the first attempt, and the restart's
ranks fail in init_process_group (torchrun gives up); hang: the ranks deadlock in the first attempt
(each waits to receive from the other).

The group is created from a store the script makes, keyed by the attempt: torch 2.13's env://
rendezvous reuses the launcher's store across restarts, and gloo's second attempt then reads the
first attempt's addresses (connectFullMesh fails: connection refused). It is also how a rank gets
its group from a store rather than from the environment.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

case = sys.argv[1]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
hosted = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # else torchrun's agent hosts it
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      is_master=hosted and rank == 0, timeout=datetime.timedelta(seconds=60))
if case == "rejoin" and attempt == 1:  # the restart cannot form its group (a peer's stale address, say)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank,
                            world_size=world + 1, timeout=datetime.timedelta(seconds=3))  # never completes
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank, world_size=world)
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
if rank == 1 and (case == "broken" or (case in ("flaky", "rejoin") and attempt == 0)):
    raise ValueError(f"bad node in attempt {attempt}")  # rank 1 raises
if case == "hang":
    dist.recv(torch.zeros(1), src=1 - rank)  # each rank waits for the other
dist.all_reduce(t)  # rank 0 waits here
print(f"rank {rank} trained in attempt {attempt}", flush=True)
dist.destroy_process_group()
