"""OpenRLHF's weight-sync group with vLLM engines that never connect.

OpenRLHF broadcasts the trainer's weights to the vLLM engines over an extra process group that
trainer rank 0 opens with ``init_process_group(init_method="tcp://host:port", world_size=N+1,
rank=0)`` (its copy of torch's helper: ``rendezvous()`` then ``_new_process_group_helper``). Rank 0
starts the TCPStore of that rendezvous and waits until every engine has connected; the other
trainer ranks go on to the next collective and wait for rank 0. When an engine crashed before
joining, or connects to the wrong address, users see after 30 minutes:

    torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/5 clients joined.

Under pytest-nccl the test fails within its bound, naming rank 0 and the rendezvous line.
"""

import datetime
import socket

import pytest
import torch
import torch.distributed as dist

import pytest_nccl

OPENRLHF_TIMEOUT = datetime.timedelta(minutes=30)  # torch's default_pg_timeout, as OpenRLHF passes it


def init_weight_sync_group(rank: int, world_size: int, group_name: str = "openrlhf"):
    """What OpenRLHF's ``init_process_group(init_method="tcp://...")`` does on trainer rank 0: start
    the rendezvous store for ``world_size`` members and wait for all of them (TCPStore's
    ``wait_for_workers``), then create the group over it. Unlike torch's tcp:// handler, the
    listening socket is bound to the loopback address (``master_listen_fd``), so the test opens
    nothing on other interfaces.

    The store owns ``master_listen_fd`` and closes it itself, also when it raises (as when the
    plugin releases rank 0 from the wait): the socket is detached, never closed here too. Closing
    it as well closed the fd a second time, by then possibly reused by the next test's gloo
    connection ("epoll_ctl: Bad file descriptor", SIGABRT, seen under torchrun at 3 ranks)."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(world_size)
        host, port = listener.getsockname()
    except BaseException:
        listener.close()
        raise
    listen_fd = listener.detach()  # from here on the store's
    store_args = dict(timeout=OPENRLHF_TIMEOUT, wait_for_workers=True, master_listen_fd=listen_fd)
    try:
        store = dist.TCPStore(host, port, world_size, rank == 0, **store_args)
    except NotImplementedError:
        # torch 2.6's default (libuv) store refuses a listen fd ("switch to the legacy TCPStore");
        # it leaves the fd open (measured), so the legacy store takes the same one
        store = dist.TCPStore(host, port, world_size, rank == 0, use_libuv=False, **store_args)
    return dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), rank, world_size, OPENRLHF_TIMEOUT)


@pytest.mark.nccl(timeout=5)
@pytest.mark.xfail(raises=pytest_nccl.CollectiveTimeout, strict=True,
                   reason="OpenRLHF: the vLLM engine never joins the weight-sync group")
def test_weight_sync_group_engine_never_joins(rank, world_size):
    weights = torch.full((4,), float(rank))
    if rank == 0:
        # the trainer's rank 0 plus one vLLM engine, which never connects
        group = init_weight_sync_group(rank=0, world_size=2)
        dist.broadcast(weights, src=0, group=group)
    dist.barrier()  # the other trainer ranks wait here for rank 0


@pytest.mark.nccl(timeout=30)
def test_weight_sync_within_the_trainer_group(rank, world_size):
    # the same broadcast over a group whose members are all there passes
    weights = torch.full((4,), float(rank))
    dist.broadcast(weights, src=0)
    assert weights.tolist() == [0.0] * 4
    dist.barrier()
