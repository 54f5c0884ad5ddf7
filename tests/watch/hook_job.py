"""One process of a watched job that imports torch in a given way, then becomes a rank of a world
of 1 in a given way, issues one all_reduce and reports what it sees (one JSON line on stdout).
Run with the watch's start-up hook on PYTHONPATH (tests/test_watch_hook.py), without the watch.

    python hook_job.py IMPORT GROUP [PORT]          (or: python -m hook_job IMPORT GROUP [PORT])

IMPORT: import | probe | import_module | lazy | chained | transformers | datasets
GROUP:  env | args-url | store | loader-workers
"""

import json
import os
import sys


def import_torch(how: str):
    if how in ("import", "chained"):  # chained: the user's own sitecustomize imported it at start-up
        assert how == "import" or "torch" in sys.modules
        import torch
    elif how == "probe":  # what transformers, datasets and trl do before they import torch
        import importlib.util

        assert importlib.util.find_spec("torch") is not None
        assert importlib.util.find_spec("torch") is not None
        import torch
    elif how == "import_module":
        import importlib

        torch = importlib.import_module("torch")
    elif how == "lazy":  # importlib's LazyLoader: torch runs at the first attribute access
        import importlib.util

        spec = importlib.util.find_spec("torch")
        spec.loader = importlib.util.LazyLoader(spec.loader)
        torch = importlib.util.module_from_spec(spec)
        sys.modules["torch"] = torch
        spec.loader.exec_module(torch)
        torch.ones(1)
    elif how == "transformers":
        import torch
        import transformers  # noqa: F401  (it probes, then imports torch lazily)
        from transformers import PreTrainedModel  # noqa: F401
    elif how == "datasets":
        import datasets  # noqa: F401
        import torch
    else:
        raise SystemExit(f"unknown import {how}")
    return torch


def main() -> None:
    how, group = sys.argv[1], sys.argv[2]
    torch = import_torch(how)
    import torch.distributed as dist

    if group == "env":
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
        dist.init_process_group("gloo")
    elif group == "args-url":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[3]}", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.all_reduce(torch.ones(1))
    if group == "loader-workers":  # a DataLoader's workers import torch too, and stay idle
        loader = torch.utils.data.DataLoader(list(range(4)), num_workers=2, multiprocessing_context="spawn")
        assert [int(x) for x in loader] == [0, 1, 2, 3]
    print(json.dumps({"traced": getattr(dist.all_reduce, "_pytest_nccl_traced", False)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
