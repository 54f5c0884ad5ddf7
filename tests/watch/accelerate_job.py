"""An ``accelerate launch`` script that begins as most Hugging Face scripts do: datasets and
transformers are its first imports (both probe for torch with ``importlib.util.find_spec`` before
importing it), torch comes through them.

    accelerate launch --multi_gpu --num_processes 2 accelerate_job.py good|bad   (on CPU too)
"""

import datasets  # noqa: F401, I001  (first: it probes for torch)
import transformers  # noqa: F401
import sys

from accelerate import Accelerator


def main() -> int:
    import torch

    case = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    t = torch.ones(2)
    for _ in range(3):
        t = accelerator.reduce(t, reduction="sum")
    n = 3 if case == "bad" and rank == 1 else 2
    gathered = accelerator.gather(torch.ones(1, n))  # the gather
    accelerator.wait_for_everyone()
    print(f"rank {rank} trained {tuple(gathered.shape)}", flush=True)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
