"""OpenRLHF's own weight-sync group (``openrlhf.utils.distributed_util.init_process_group``, the
release of the seed's time, 0.6.1, on a torch it runs on: before 2.10) where one member, an
inference engine, never joins: the test's bound names the group, its creating line in OpenRLHF and
its size instead of torch's "1/3 clients joined" after the store's timeout (30 min by default).

Skips without OpenRLHF (the project's venv has none); run in a venv with it:
``pip install torch==2.6.0 openrlhf==0.6.1 --no-deps``. The module is loaded from its file: the
package's ``__init__`` imports its whole trainer stack (deepspeed, transformers, ray, ...).
"""

from __future__ import annotations

import importlib.util

import pytest

SPEC = importlib.util.find_spec("openrlhf")
pytestmark = pytest.mark.skipif(SPEC is None,
                                reason="OpenRLHF is not installed (pip install openrlhf==0.6.1 --no-deps)")

INNER = """
import datetime, importlib.util, os, socket
import pytest, torch
import torch.distributed as dist

path = os.path.join(importlib.util.find_spec("openrlhf").submodule_search_locations[0], "utils", "distributed_util.py")
spec = importlib.util.spec_from_file_location("openrlhf_distributed_util", path)
openrlhf_util = importlib.util.module_from_spec(spec)
spec.loader.exec_module(openrlhf_util)


def free_port(rank):
    port = torch.tensor([0])
    if rank == 0:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port[0] = s.getsockname()[1]; s.close()
    dist.broadcast(port, 0)
    return int(port[0])


@pytest.mark.nccl(timeout=10)
def test_weight_sync_group(rank, world_size):
    port = free_port(rank)
    # the trainer's rank 0 and one engine of a group of three: the second engine never starts
    openrlhf_util.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                     world_size=world_size + 1, rank=rank, group_name="openrlhf",
                                     timeout=datetime.timedelta(seconds=600))
"""


def test_engine_that_never_joins_is_named_within_the_bound(run_inner):
    inner = run_inner(INNER, "--nccl-world=2", "-o", "addopts=", name="test_openrlhf_inner")
    section = inner.section("test_weight_sync_group")
    assert inner.result.ret == 1, inner.text
    assert "openrlhf/utils/distributed_util.py:" in section, section
    assert "creating group openrlhf over 127.0.0.1:" in section and "(3 members, this rank 1)" in section, section
    assert inner.elapsed < 120, inner.elapsed  # the 10 s bound, not the store's 600 s
