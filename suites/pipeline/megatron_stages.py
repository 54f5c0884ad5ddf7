"""megatron-core's ``P2PCommunicator`` on CPU ranks: stage groups of consecutive ranks, the config the
issues set (``variable_seq_lengths``, ``batch_p2p_comm``), and where a marked line is.

megatron-core builds its shape tensors and receive buffers on ``torch.cuda.current_device()`` and
calls ``torch.cuda.synchronize()`` around batched transfers; on a CPU rank both are patched for
the duration of one communicator's use (``on_cpu``), nothing else of megatron is changed.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from unittest import mock

import pytest
import torch
import torch.distributed as dist

p2p_communication = pytest.importorskip(
    "megatron.core.pipeline_parallel.p2p_communication",
    reason="megatron-core is not installed (pip install 'megatron-core==0.16.1')")
from megatron.core.model_parallel_config import ModelParallelConfig  # noqa: E402

if not hasattr(p2p_communication, "P2PCommunicator"):  # before 0.14 the functions took the config
    pytest.skip("this megatron-core has no P2PCommunicator (0.16.1 is the release these tests name)",
                allow_module_level=True)


@contextlib.contextmanager
def on_cpu():
    """megatron's CUDA calls made CPU ones: tensors on "cpu", no device to synchronize."""
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"), \
            mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None):
        yield


def stage_group(pp: int):
    """This rank's pipeline group: consecutive ranks, ``pp`` of them; None for a rank left over (a
    world that ``pp`` does not divide). Every rank creates every group (``new_group`` is collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group(list(range(start, start + pp))) for start in range(0, world - pp + 1, pp)]
    return groups[rank // pp] if rank // pp < len(groups) else None


def communicator(group, *, variable_seq_lengths: bool, batch_p2p_comm: bool):
    """megatron's communicator for ``group``, configured as Megatron-LM#5100 names it."""
    config = ModelParallelConfig(pipeline_model_parallel_size=group.size(), variable_seq_lengths=variable_seq_lengths,
                                 batch_p2p_comm=batch_p2p_comm, pipeline_dtype=torch.float32)
    return p2p_communication.P2PCommunicator(group, config)


def site(module, marker: str) -> str:
    """A regex for 'file.py:LINE' of the line of ``module`` that carries ``# marker``."""
    lines, _ = inspect.getsourcelines(module)
    number = next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)
    return re.escape(f"{module.__name__.rsplit('.', 1)[-1]}.py:{number}") + r"\b"
