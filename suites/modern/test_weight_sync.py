"""A weight-sync side group to an inference server (trl#7103's shape; trl#6797, trl#2923).

RL trainers stream weights to a vLLM server over a second communicator: torch's process-group
helper over a store of its own, with the server as the group's other member. Here the trainer is
FSDP2 on every rank and the server a stand-in thread of rank 0 (a ProcessGroupGloo over the same
store). trl#7103: ``_sync_weight`` interleaves each parameter's ``full_tensor()`` (an all-gather of
the default group) with rank 0's send of it to the server, and the server, asked for a checkpoint
reload (``is_checkpoint_format=True``), waits for a path instead of receiving. Rank 0 blocks in its
send to the server while the other ranks are already in the next parameter's all-gather. The
server is outside the test: it may be slow rather than stuck, so this is decided at the bound, and
named then: which rank waits in which group, from which line, and where the others wait. Fixed
(trl#7131): every rank gathers every parameter first, then rank 0 sends, to a server that streams.
"""

from __future__ import annotations

import datetime
import socket
import sys
import threading

import pytest
import torch
import torch.distributed as dist
from modern_helpers import site, tiny_lm_fsdp2
from torch.distributed.distributed_c10d import ProcessGroupGloo, _new_process_group_helper

TIMEOUT = datetime.timedelta(seconds=120)
_syncs = [0]  # weight-sync groups this process made: each gets a name of its own, as c10d requires


def shared_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = [s.getsockname()[1]]
    dist.broadcast_object_list(port, src=0)
    return port[0]


def stand_in_server(port: int, name: str, shapes: list, checkpoint_format: bool, received: list) -> None:
    """The inference server's end of the weight-sync group (its rank 1; c10d prefixes the group's
    keys with its name and the device)."""
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=TIMEOUT)
    group = ProcessGroupGloo(dist.PrefixStore("cpu/", dist.PrefixStore(f"{name}/", store)), 1, 2, TIMEOUT)
    if checkpoint_format:
        store.wait(["checkpoint_path"])  # SERVER: reload from a path nobody sends
    for shape in shapes:
        buffer = torch.empty(shape)
        group.broadcast(buffer, 0).wait()
        received.append(buffer)


def sync_weights(interleaved: bool) -> int:
    rank = dist.get_rank()
    model = tiny_lm_fsdp2()
    params = [p for _, p in model.named_parameters()]
    port = shared_port()
    group, server, received = None, None, []
    if rank == 0:
        _syncs[0] += 1
        name = f"weights{_syncs[0]}"
        shapes = [tuple(p.shape) for p in params]
        server = threading.Thread(target=stand_in_server, args=(port, name, shapes, interleaved, received),
                                  daemon=True)
        server.start()
        store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=TIMEOUT)
        group, _ = _new_process_group_helper(2, 0, [], "gloo", store, name, timeout=TIMEOUT)
    dist.barrier()  # the rank-0-only set-up is done before any rank gathers (trl#7131)
    if interleaved:
        for p in params:
            full = p.full_tensor()  # GATHER_ONE
            if rank == 0:
                group.broadcast(full, 0).wait()  # SEND_ONE
    else:
        fulls = [p.full_tensor() for p in params]  # GATHER_ALL
        if rank == 0:
            for full in fulls:
                group.broadcast(full, 0).wait()  # SEND_ALL
            server.join(60)
            assert all(torch.equal(a, b) for a, b in zip(received, fulls, strict=False)) and len(received) == len(fulls)
    dist.barrier()
    return len(params)


@pytest.mark.timeout(30)
def test_interleaved_weight_sync_is_diagnosed(expect_diagnosis, nccl_world):
    """"rank 0 waits in broadcast #1 of group weights1[0,+1] from test_weight_sync.py:L instead,
    after N collectives in group default; ranks 1-3 waited for the whole ... bound in
    all_gather_into_tensor #N+1 of group default from test_weight_sync.py:M" at world 4."""
    module = sys.modules[__name__]
    others = set(range(1, nccl_world.size))
    expect_diagnosis(sync_weights, True, op=r"rank 0 waits in broadcast #1 of group weights\d+\[0,\+1\].*"
                     r"all_gather_into_tensor", rank=others, site=site(module, "SEND_ONE"))


@pytest.mark.nccl(timeout=60)
def test_gather_first_then_send_passes(rank):
    assert sync_weights(False) > 0
