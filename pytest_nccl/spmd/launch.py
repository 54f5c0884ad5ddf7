"""Whether this pytest process was started by a launcher (torchrun, srun, or RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT set by hand), and which rank of which launch it is."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import NcclUsageError
from ..settings import SpmdMode


@dataclass
class Launch:
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    agent_store: bool      # torchrun: the agent hosts the store, every rank is a client
    launcher: str          # "torchrun" | "srun" | "env"
    run_id: str
    attempt: int


def detect(mode: str, env=None) -> Launch | None:
    """The launch this pytest process belongs to, or None (plugin mode: the plugin forks ranks).
    auto: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are all set. on: they must be (SLURM_PROCID /
    SLURM_NTASKS stand in for RANK / WORLD_SIZE). off: never."""
    env = os.environ if env is None else env
    if mode == SpmdMode.OFF:
        return None
    rank, world = env.get("RANK"), env.get("WORLD_SIZE")
    local_rank, local_world = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
    if mode == SpmdMode.ON and rank is None and world is None and "SLURM_PROCID" in env:
        rank, world = env.get("SLURM_PROCID"), env.get("SLURM_NTASKS")
        local_rank = local_rank or env.get("SLURM_LOCALID")
        local_world = local_world or env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0] or None
    needed = {"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": env.get("MASTER_ADDR"),
              "MASTER_PORT": env.get("MASTER_PORT")}
    missing = [k for k, v in needed.items() if not v]
    if missing:
        if mode == SpmdMode.ON:
            raise NcclUsageError("--nccl-spmd=on needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the "
                                 f"environment (torchrun sets them); missing: {', '.join(missing)}")
        return None
    try:
        rank_i, world_i = int(rank), int(world)
        port = int(needed["MASTER_PORT"])
        local_i = int(local_rank) if local_rank not in (None, "") else rank_i
        local_world_i = int(local_world) if local_world not in (None, "") else world_i
    except ValueError:
        raise NcclUsageError(f"SPMD mode: RANK={rank!r}, WORLD_SIZE={world!r}, MASTER_PORT="
                             f"{needed['MASTER_PORT']!r} must be whole numbers") from None
    if not 0 <= rank_i < world_i:
        raise NcclUsageError(f"SPMD mode: RANK={rank_i} is not within WORLD_SIZE={world_i}")
    if "TORCHELASTIC_RUN_ID" in env:
        launcher = "torchrun"
    elif "SLURM_JOB_ID" in env:
        launcher = "srun"
    else:
        launcher = "env"
    return Launch(rank_i, world_i, local_i, local_world_i, needed["MASTER_ADDR"], port,
                  env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true", launcher,
                  env.get("TORCHELASTIC_RUN_ID", env.get("SLURM_JOB_ID", "env")),
                  int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
