"""Shared pieces of the modern suite: the CPU mesh, tiny models, where a marked line is.

Imported by every test module, so the fork server imports torch.distributed.tensor, FSDP2 and
transformers' Llama once for every rank.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor  # noqa: F401 (imported once, in the fork server)

from pytest_nccl.testing import hf_offline_env, tiny_causal_lm

hf_offline_env()

try:
    import transformers.models.llama.modeling_llama  # noqa: F401
except ImportError:
    pass


def last_rank() -> int:
    """The rank that diverges in every scenario: which one follows from the world size."""
    return dist.get_world_size() - 1


def cpu_mesh(name: str = "dp"):
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(name,))


def site(module, marker: str) -> str:
    """A regex for 'file.py:LINE' of the line of ``module`` that carries ``# marker``."""
    lines, _ = inspect.getsourcelines(module)
    number = next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)
    return re.escape(f"{module.__name__.rsplit('.', 1)[-1]}.py:{number}") + r"\b"


# FSDP2 records an event on its device's stream; on CPU that is torch.cpu.Stream, which has no
# record_event on torch 2.6 (every FSDP2 forward raises AttributeError there): probed, not a version
needs_fsdp2_on_cpu = pytest.mark.skipif(
    not hasattr(torch.cpu.Stream, "record_event"),
    reason="FSDP2 on CPU needs torch.cpu.Stream.record_event, which this torch lacks")


def tiny_lm_fsdp2(frozen_base: bool = False, reshard_after_forward: bool = True):
    """A tiny Llama sharded with FSDP2 (each decoder layer a unit, then the root); ``frozen_base``:
    only the LM head trains, as with a frozen backbone or LoRA (pytorch#169448)."""
    model = tiny_causal_lm(seed=0)
    if frozen_base:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("lm_head"))
    mesh = cpu_mesh()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


class TinyMLP(nn.Module):
    """Two projections, the tensor-parallel unit of a transformer block's MLP."""

    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
