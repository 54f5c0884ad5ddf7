"""A gloo job whose ranks end as NCCL's watchdog ends them with dump-on-timeout on: rank 1 skips the
third all_reduce, and once the job has stalled each rank writes its Flight Recorder to
``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (where the watch asked for it) and aborts (SIGABRT), as the
watchdog does after a collective's timeout; ``JOB_LINGER_RANK`` stays ``JOB_LINGER_S`` seconds more,
alive once the others are gone. Launched by torchrun under ``pytest-nccl watch``."""

import os
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "")
on = os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "")
print(f"rank {rank}: dump on timeout={on} into {prefix}", flush=True)


def watchdog() -> None:
    time.sleep(float(os.environ.get("JOB_STALL_S", "3")))
    if on == "1" and prefix:
        blob = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
        with open(f"{prefix}{rank}.part", "wb") as f:
            f.write(blob)
        os.replace(f"{prefix}{rank}.part", f"{prefix}{rank}")
        deadline = time.monotonic() + 30  # every rank's dump before any rank goes, as NCCL's all dump first
        while time.monotonic() < deadline and not all(os.path.exists(f"{prefix}{r}") for r in range(world)):
            time.sleep(0.05)
    if rank == int(os.environ.get("JOB_LINGER_RANK", "-1")):  # alive when the first rank is gone
        time.sleep(float(os.environ.get("JOB_LINGER_S", "0")))
    os.abort()


threading.Thread(target=watchdog, daemon=True).start()
x = torch.ones(4)
for _ in range(2):
    dist.all_reduce(x)
if rank != 1:
    dist.all_reduce(x)  # rank 0 waits here
time.sleep(120)
