"""verl's own single controller running the suite's dynamic-batching step: a local Ray cluster
(CPU), ``RayResourcePool(use_gpu=False)``, a ``RayWorkerGroup`` of two verl ``Worker`` actors that
create their process group from the RANK/WORLD_SIZE/MASTER_* the group gives them, as verl's FSDP
workers do, and one ``compute_log_prob`` of verl's FSDP actor dispatched to both (Dispatch.ONE_TO_ALL).

    python ray_worker_group.py ragged|even [--second-pool]

ragged: the last rank's rows need two micro-batches, the other's one (dynamic_batching.py). On a
release whose actor syncs no micro-batch count (verl 0.7.1) the ranks' collectives diverge in verl's
dp_actor.py: under ``pytest-nccl watch`` a verdict; on a good release the driver prints the metric
and exits 0. A release without the legacy actor (0.8.0 on) exits 5 with one line. Run it under the
watch: ``python -m pytest_nccl watch --timeout 20 -- python suites/verl/ray_worker_group.py ragged``.

``--second-pool``: a second ``RayWorkerGroup`` of two workers on a resource pool of its own (verl's
critic or reference model placed apart from the actor) runs the even step first: a second default
world in the job, with a store of its own, alive while the first group runs its step.
"""

import sys

import ray
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

WORLD = 2
NO_ACTOR = 5  # the release has no legacy FSDP actor: nothing to run


@ray.remote
class DynamicBatchingWorker(Worker):
    def __init__(self):
        super().__init__()  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from the worker group's runtime_env
        import torch.distributed as dist

        dist.init_process_group("gloo")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def log_prob_step(self, ragged: bool) -> float:
        import torch.distributed as dist
        from dynamic_batching import legacy_actor, log_probs_of_the_step

        return float(log_probs_of_the_step(legacy_actor(), dist.get_rank(), dist.get_world_size(), ragged))


def main() -> int:
    ragged = {"ragged": True, "even": False}[sys.argv[1]]
    second_pool = sys.argv[2:] == ["--second-pool"]
    from dynamic_batching import legacy_actor

    if legacy_actor() is None:
        import verl

        print(f"verl {verl.__version__} has no legacy FSDP actor (verl.workers.actor.dp_actor)", file=sys.stderr)
        return NO_ACTOR
    # small: two CPUs, no dashboard, the smallest object store Ray takes
    pools = 2 if second_pool else 1
    ray.init(num_cpus=WORLD * pools, include_dashboard=False, object_store_memory=80 * 1024**2, log_to_driver=True)
    try:
        groups = [RayWorkerGroup(resource_pool=RayResourcePool(process_on_nodes=[WORLD], use_gpu=False,
                                                               max_colocate_count=1),
                                 ray_cls_with_init=RayClassWithInitArgs(cls=DynamicBatchingWorker), device_name="cpu")
                  for _ in range(pools)]
        group = groups[0]
        if second_pool:
            print(f"driver: second pool's metric per rank {groups[1].log_prob_step(False)}", flush=True)
        metrics = group.log_prob_step(ragged)
        print(f"driver: log-prob metric per rank {[round(m, 4) for m in metrics]}", flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
