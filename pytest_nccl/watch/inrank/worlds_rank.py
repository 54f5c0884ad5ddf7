"""Rank side: which default world a rank of a watched job is in (``jobdir.world_dir`` keeps the files
of each world apart), and what its launcher told it about the job's nodes."""

from __future__ import annotations

import os


def launcher_env() -> dict:
    """The rank info's fields about the job's nodes and store (several nodes: ``channel.py``)."""
    env = os.environ
    return dict(local_world=env.get("LOCAL_WORLD_SIZE"), node=env.get("GROUP_RANK"), master_addr=env.get("MASTER_ADDR"),
                master_port=env.get("MASTER_PORT"), run_id=env.get("TORCHELASTIC_RUN_ID"))


def world_key(world: int) -> str:
    """What tells this process's default world from another of the same job: the port of the store
    under its default group (every rank of a world meets there; a port, not a host name, which ranks
    may spell differently) and its size. A store without a port (FileStore, HashStore) is named by
    its type."""
    try:
        import torch.distributed.distributed_c10d as c10d

        from ...rank.trace_rendezvous import innermost_store  # loaded with the tracer, before any group

        store = innermost_store(c10d._get_default_store())
        port = getattr(store, "port", None)
        where = f"store port {port}" if port is not None else f"a {type(store).__name__}"
    except Exception:  # a private torch helper, any version: the world is named by its size alone
        where = "its store"
    return f"{where}, {world} rank{'s' if world != 1 else ''}"
