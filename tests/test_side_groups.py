"""Groups made without new_group (issue 23, items 2, 3 and 5): a ProcessGroupGloo over a store of its
own, torch's process-group helper with a member outside the test (an inference server), and their
rendezvous. Real inner sessions (gloo, world 2): the side group is traced and named, a rendezvous
that a member never joins names who is missing and where each rank waits, and a rank stuck in a
side group while the others wait for it in the default group is named as such."""

from __future__ import annotations

import re

import pytest
from conftest import line_of, run_inner_once

SOURCE = """
import datetime, socket, threading
import pytest, torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import ProcessGroupGloo, _new_process_group_helper

TIMEOUT = datetime.timedelta(seconds=60)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shared_port():
    port = [free_port()]
    dist.broadcast_object_list(port, src=0)
    return port[0]


def stand_in_server(port, streaming):
    # an inference server's receiving end: group rank 1 of the weight-sync group
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=TIMEOUT)
    pg = ProcessGroupGloo(dist.PrefixStore("cpu/", dist.PrefixStore("weights/", store)), 1, 2, TIMEOUT)
    if not streaming:
        store.wait(["checkpoint_path"])  # SERVER_WAITS: a path that never comes
    pg.broadcast(torch.zeros(4), 0).wait()


@pytest.mark.nccl(world=2, timeout=6)
def test_third_member_never_joins(rank):
    port = shared_port()
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timeout=TIMEOUT)  # STORE
    ProcessGroupGloo(store, rank, 3, TIMEOUT)  # GROUP


@pytest.mark.nccl(world=2, timeout=8)
def test_weight_sync_blocks_while_others_gather(rank):
    port = shared_port()
    if rank == 0:
        server = threading.Thread(target=stand_in_server, args=(port, False), daemon=True)
        server.start()
        store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=TIMEOUT)
        pg, _ = _new_process_group_helper(2, 0, [], "gloo", store, "weights", timeout=TIMEOUT)
        pg.broadcast(torch.ones(4), 0).wait()  # SEND
    dist.all_gather_into_tensor(torch.zeros(4), torch.ones(2))  # GATHER


@pytest.mark.nccl(world=2, timeout=20)
def test_monitored_barrier_peer_sleeps(rank):
    import time
    if rank == 1:
        time.sleep(60)  # PEER: never arrives
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))


@pytest.mark.nccl(world=2, timeout=60)
def test_zz_streaming_server_passes_and_the_group_is_named(rank):
    from pytest_nccl.rank import tracer
    port = shared_port()
    if rank == 0:
        server = threading.Thread(target=stand_in_server, args=(port, True), daemon=True)
        server.start()
        store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=TIMEOUT)
        pg, _ = _new_process_group_helper(2, 0, [], "gloo", store, "weights", timeout=TIMEOUT)
        assert tracer.pg_label(pg)[0] == "weights[0,+1]"
        pg.broadcast(torch.ones(4), 0).wait()
        server.join(30)
        raw = ProcessGroupGloo(dist.PrefixStore("solo", dist.TCPStore("127.0.0.1", free_port(), 1, True)), 0, 1,
                               TIMEOUT)
        assert re.fullmatch(r"gloo\\d+\\[0\\]", tracer.pg_label(raw)[0]), tracer.pg_label(raw)
        raw.allreduce([torch.ones(1)]).wait()
    dist.barrier()
"""
SOURCE = "import re\n" + SOURCE


def _line(snippet: str) -> str:
    return f"test_inner.py:{line_of(SOURCE, snippet)}"


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    return run_inner_once(tmp_path_factory, SOURCE, "--durations=0")


def test_session_outcomes(inner):
    assert inner.result.parseoutcomes() == {"passed": 1, "failed": 3}, inner.text


def test_rendezvous_names_who_never_joined_and_where(inner):
    headline = inner.headline("test_third_member_never_joins")
    assert headline.startswith("the test exceeded its 6 s bound outside any collective ("), headline
    assert re.search(rf"rank 0 waits in TCPStore\(127\.0\.0\.1:\d+\) as a server of 3 members at "
                     rf"{_line('# STORE')}: ranks 0,1 of this test arrived, 1 member never did", headline), headline
    assert re.search(rf"rank 1 waits creating group gloo over 127\.0\.0\.1:\d+ \(3 members, this rank 1\) at "
                     rf"{_line('# GROUP')}: group ranks 0,2 never joined", headline), headline


def test_rank_in_a_side_group_is_named_with_the_group_and_the_line(inner):
    headline = inner.headline("test_weight_sync_blocks_while_others_gather")
    assert re.search(rf"rank 0 waits in broadcast #1 of group weights\[0,\+1\] from {_line('# SEND')} instead, "
                     rf"after \d+ collectives? in group default; rank 1 waited for the whole 8 s bound in "
                     rf"all_gather_into_tensor #\d+ of group default from {_line('# GATHER')}", headline), headline


def test_a_monitored_barrier_names_where_its_missing_peer_is(inner):
    headline = inner.headline("test_monitored_barrier_peer_sleeps")
    assert headline == (f"rank 0 raised RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms; "
                        f"rank 1 is busy outside any collective at {_line('# PEER')}: time.sleep(60)"), headline
