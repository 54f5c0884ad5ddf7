"""An ``accelerate launch`` script (on CPU, ``--multi_gpu`` starts torchrun's workers): reductions
through the ``Accelerator``, then rank 0 gathers while rank 1 goes to ``wait_for_everyone`` in the
desync case. A test runs it as TRL's tests/distributed do: ``subprocess.run([accelerate, launch,
...], check=True)`` (tests/test_launched.py).

    accelerate launch --multi_gpu --num_processes 2 accelerate_job.py good|desync
"""

import sys

import torch
from accelerate import Accelerator


def main() -> int:
    case = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    t = torch.ones(2)
    for _ in range(3):
        t = accelerator.reduce(t, reduction="sum")
    if case == "desync" and rank == 1:
        accelerator.wait_for_everyone()  # the wait
    else:
        accelerator.gather(torch.ones(1, 2))  # the gather
    accelerator.wait_for_everyone()
    print(f"rank {rank} trained", flush=True)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
