"""A CPU stand-in of vLLM's ``PyNcclCommunicator`` (a test double, not NCCL): the same constructor
and collective methods (broadcast, all_reduce, all_gather, reduce_scatter, send, recv), carried over
the ``StatelessProcessGroup``'s own store, so that TRL's weight sync (``PyNcclCommunicator(pg,
device)``, ``broadcast(weights, src=rank)``, ``group.barrier()``) runs on a machine without a GPU.

Like NCCL it is one-sided for a root: a broadcast's root returns once its tensor is handed over, its
receivers wait for it (NCCL's receivers wait on their stream; here, in the store's ``get``, bounded
by the store's timeout). Its constructor sends rank 0's unique id to every rank as vLLM's does (a
``broadcast_obj``), so a member that never joins is seen there. What it does not model: CUDA
streams and their asynchrony (a call here is complete when it returns), NCCL's own timeouts.

``install()`` puts it in place of vLLM's class (``vllm.distributed.device_communicators.pynccl``,
and in modules that imported the name already, such as TRL's ``vllm_client``)."""

from __future__ import annotations

import os
import sys

import torch


class PyNcclCommunicator:
    """CPU stand-in of ``vllm.distributed.device_communicators.pynccl.PyNcclCommunicator``."""

    def __init__(self, group, device=None, library_path=None):
        self.group = group
        self.rank, self.world_size = group.rank, group.world_size
        self.device = torch.device("cpu")
        self.available, self.disabled = True, False
        # as vLLM: rank 0 makes the unique id, every rank gets it through the group's store
        self.unique_id = group.broadcast_obj(os.urandom(128) if self.rank == 0 else None, src=0)

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None):
        if self.rank == src:
            self.group.broadcast(tensor, src)
        else:
            tensor.copy_(self.group.broadcast(tensor, src))

    def all_reduce(self, in_tensor: torch.Tensor, out_tensor=None, op=torch.distributed.ReduceOp.SUM, stream=None):
        result = self.group.all_reduce(in_tensor, op)
        if out_tensor is None:
            return result
        out_tensor.copy_(result)
        return out_tensor

    def all_gather(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, stream=None):
        output_tensor.copy_(torch.cat([t.reshape(-1) for t in self.group.all_gather_obj(input_tensor)])
                            .reshape(output_tensor.shape))

    def reduce_scatter(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                       op=torch.distributed.ReduceOp.SUM, stream=None):
        total = self.group.all_reduce(input_tensor, op)
        output_tensor.copy_(total.reshape(-1).chunk(self.world_size)[self.rank].reshape(output_tensor.shape))

    def send(self, tensor: torch.Tensor, dst: int, stream=None):
        self.group.send(tensor, dst)

    def recv(self, tensor: torch.Tensor, src: int, stream=None):
        self.group.recv(tensor, src)


def install() -> None:
    """The stand-in in place of vLLM's class, where vLLM defines it and wherever it was imported,
    traced as vLLM's is under the watch (``rank/trace_vllm``)."""
    import importlib

    from ..rank import trace_vllm

    trace_vllm.trace_communicator_class(PyNcclCommunicator)
    real = importlib.import_module(trace_vllm.COMM_MODULE).PyNcclCommunicator
    for module in list(sys.modules.values()):
        if getattr(module, "PyNcclCommunicator", None) is real:
            module.PyNcclCommunicator = PyNcclCommunicator  # type: ignore[attr-defined]
