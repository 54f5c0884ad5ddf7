"""A Ray job as verl and OpenRLHF start their trainers: the driver starts a local cluster
(``ray.init()``), creates one actor per rank; each actor sets RANK/WORLD_SIZE/MASTER_* itself and
creates the default process group, then trains.

    python ray_job.py good|bad|sleeps PORT

bad: rank 1 all_gathers a tensor of another shape (the desync the watch names); sleeps: rank 1
sleeps before the gather (each rank touches ``$ENDINGS_READY.R`` first: tests/test_watch_endings.py).
"""

import os
import sys

import ray

WORLD = 2


@ray.remote(num_cpus=0)
class Trainer:
    def setup(self, rank: int, port: int) -> None:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import torch.distributed as dist

        dist.init_process_group("gloo")

    def train(self, case: str) -> float:
        import torch
        import torch.distributed as dist

        rank = dist.get_rank()
        t = torch.ones(2)
        for _ in range(3):
            dist.all_reduce(t)
        if case == "sleeps":
            open(f"{os.environ['ENDINGS_READY']}.{rank}", "w").close()
            if rank == 1:
                import time

                time.sleep(600)  # the line the reports name
        n = 3 if case == "bad" and rank == 1 else 2
        out = [torch.zeros(n) for _ in range(WORLD)]
        dist.all_gather(out, torch.ones(n))  # the gather
        dist.barrier()
        return float(t.sum())


def main() -> int:
    case, port = sys.argv[1], int(sys.argv[2])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    trainers = [Trainer.remote() for _ in range(WORLD)]
    ray.get([t.setup.remote(r, port) for r, t in enumerate(trainers)])
    results = ray.get([t.train.remote(case) for t in trainers], timeout=120)
    print(f"driver: trained {results}", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
