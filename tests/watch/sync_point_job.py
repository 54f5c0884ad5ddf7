"""One rank's training loop whose step's compute is a long kernel, then the loss's all_reduce, read
at a sync point; launched by torchrun (world 1). On a GPU it runs on real NCCL (``torch.cuda._sleep``
holds the stream), else on the NCCL model (``nccl_model.sleep``), so one test checks the model's
claim against NCCL itself.

    python sync_point_job.py good     12 steps, each kernel short
    python sync_point_job.py stuck    step 6's kernel outlasts the watch's bound: the all_reduce behind
                                      it is enqueued, not completed, and the rank blocks at its loss
"""

import sys

import torch
import torch.distributed as dist

ON_GPU = torch.cuda.is_available()
if ON_GPU:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
else:
    from pytest_nccl.testing import nccl_model

    nccl_model.register()
    dist.init_process_group(nccl_model.NAME)


def compute(seconds: float) -> None:
    if ON_GPU:
        torch.cuda._sleep(int(seconds * 2e9))  # cycles: ~2 GHz
    else:
        nccl_model.sleep(seconds)


def item(t: torch.Tensor) -> float:
    return t.item() if ON_GPU else nccl_model.item(t)


for step in range(12):
    loss = torch.ones(4, device="cuda" if ON_GPU else "cpu")
    compute(600.0 if sys.argv[1] == "stuck" and step == 5 else 0.005)  # the step's compute
    dist.all_reduce(loss)  # the step's loss
    print(f"step {step} loss {item(loss[0])}", flush=True)  # the sync point
dist.destroy_process_group()
