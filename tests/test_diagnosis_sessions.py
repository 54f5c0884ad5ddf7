"""The diagnosis of the arguments the ranks must agree on (issue 12), in real inner sessions: one per
backend setting, asserting each pattern's exact headline, its exception class and how soon it
failed (on hand-written records: test_diagnosis_arguments.py)."""

from __future__ import annotations

import pytest
from conftest import line_of, run_inner_once, run_scenarios

SCENARIOS = """
import pytest, torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

@pytest.mark.nccl(world=2)
def test_00_warm_world_2(rank):
    dist.barrier()

@pytest.mark.nccl(world=4)
def test_00_warm_world_4(rank):
    dist.barrier()

@pytest.mark.nccl(world=2)
def test_p2p_tag(rank):
    t = torch.ones(2)
    if rank == 0:
        dist.send(t, dst=1, tag=1)
    else:
        dist.recv(t, src=0, tag=2)

@pytest.mark.nccl(world=2)
def test_broadcast_root(rank):
    dist.broadcast(torch.ones(2), src=rank)  # each rank believes it is the root

@pytest.mark.nccl(world=2)
def test_gather_dst(rank):
    dist.gather(torch.ones(2), [torch.zeros(2), torch.zeros(2)], dst=rank)

@pytest.mark.nccl(world=2)
def test_all_reduce_op(rank):
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)

@pytest.mark.nccl(world=4)
def test_ring_wrong_neighbour(rank):
    dst = (rank + 2) % 4 if rank == 1 else (rank + 1) % 4
    ops = [dist.P2POp(dist.isend, torch.ones(2), dst), dist.P2POp(dist.irecv, torch.zeros(2), (rank - 1) % 4)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()

@pytest.mark.nccl(world=2)
def test_all_to_all_splits(rank):
    splits = [2, 2] if rank == 0 else [1, 3]
    dist.all_to_all_single(torch.zeros(4), torch.ones(4), output_split_sizes=[2, 2], input_split_sizes=splits)

@pytest.mark.nccl(world=4)
def test_mesh_skip(rank):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    if rank != 2:
        dist.all_reduce(torch.ones(2), group=mesh.get_group("tp"))  # the tp all_reduce
    dist.barrier()  # rank 2 comes here at once

@pytest.mark.nccl(world=2)
def test_isend_irecv_wait_tag(rank):
    t = torch.ones(2)
    if rank == 0:
        dist.isend(t, dst=1, tag=3).wait()
    else:
        dist.irecv(t, src=0, tag=4).wait()

@pytest.mark.nccl(world=2)
def test_both_send_first(rank):
    t = torch.ones(2)
    dist.send(t, dst=1 - rank)
    dist.recv(t, src=1 - rank)

@pytest.mark.nccl(world=4)
def test_recv_from_wrong_source(rank):
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    elif rank == 1:
        dist.recv(torch.ones(2), src=2)

@pytest.mark.nccl(world=2)
def test_reduce_dst(rank):
    dist.reduce(torch.ones(2), dst=rank)

@pytest.mark.nccl(world=2)
def test_broadcast_object_src(rank):
    dist.broadcast_object_list([rank], src=rank)

@pytest.mark.nccl(world=2)
def test_reduce_scatter_op(rank):
    op = dist.ReduceOp.MIN if rank == 0 else dist.ReduceOp.SUM
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4), op=op)

@pytest.mark.nccl(world=2)
def test_swapped_group_order(rank):
    weights = dist.new_group([0, 1], group_desc="weights")
    grads = dist.new_group([0, 1], group_desc="grads")
    for group in ([weights, grads] if rank == 0 else [grads, weights]):
        dist.all_reduce(torch.ones(1), group=group)

@pytest.mark.nccl(world=2)
def test_all_to_all_abort(rank):
    n = [2, 2] if rank == 0 else [1, 3]
    dist.all_to_all_single(torch.zeros(4), torch.ones(4), output_split_sizes=n, input_split_sizes=n)

@pytest.mark.nccl(world=4)
def test_zz_agreeing_arguments_pass(rank):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(torch.ones(2), op=dist.ReduceOp.MAX, group=mesh.get_group("tp"))
    dp = mesh.get_group("dp")
    dist.broadcast(torch.ones(2), src=dist.get_global_rank(dp, 1), group=dp)
    ops = [dist.P2POp(dist.isend, torch.ones(1), (rank + 1) % 4),
           dist.P2POp(dist.irecv, torch.zeros(1), (rank - 1) % 4)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    splits = [1, 2, 1, 0]  # uneven, consistent: rank r sends splits[j] to j and expects splits[r] from each
    dist.all_to_all_single(torch.zeros(4 * splits[rank]), torch.ones(sum(splits)),
                           output_split_sizes=[splits[rank]] * 4, input_split_sizes=splits)

@pytest.mark.nccl(world=4)
def test_zz_groups_are_named_as_the_user_named_them(rank):
    from pytest_nccl.rank.tracer import pg_label
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    weights, plain = dist.new_group([0, 1, 2, 3], group_desc="weights"), dist.new_group([0, 1, 2, 3])
    tp = "0,1" if rank < 2 else "2,3"
    assert pg_label(mesh.get_group("tp"))[0] == f"tp[{tp}]" and pg_label(None)[0] == "default"
    assert pg_label(weights)[0] == "weights[0-3]" and pg_label(plain)[0] == f"pg{plain.group_name}[0-3]"
    again = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))  # same names, same ranks:
    assert pg_label(again.get_group("tp"))[0] == f"tp.pg{again.get_group('tp').group_name}[{tp}]"  # told apart
"""


def _at(snippet: str) -> str:
    return f"test_inner.py:{line_of(SCENARIOS, snippet)}"


# scenario -> (exact headline, exception class)
EXPECTED = {
    "test_p2p_tag": (f"p2p tag mismatch: rank 0 waits in send(dst=1, tag=1) from {_at('dst=1, tag=1')}, which rank 1 "
                     f"never receives; rank 1 waits in recv(src=0, tag=2) from {_at('src=0, tag=2')}, which rank 0 "
                     "never sends", "CollectiveMismatch"),
    "test_broadcast_root": ("root mismatch in broadcast #1 of group default: rank 0 src=0, rank 1 src=1 "
                            f"(from {_at('src=rank)  # each')})", "CollectiveMismatch"),
    "test_gather_dst": ("root mismatch in gather #1 of group default: rank 0 dst=0, rank 1 dst=1 "
                        f"(from {_at('dst=rank)')})", "CollectiveMismatch"),
    "test_all_reduce_op": ("reduce-op mismatch in all_reduce #1 of group default: rank 0 SUM, rank 1 MAX "
                           f"(from {_at('ReduceOp.SUM if rank == 0')}); the backend completed it without an error: "
                           "its result is wrong", "CollectiveMismatch"),
    "test_ring_wrong_neighbour": (
        f"p2p peer mismatch: rank 1 waits in isend(dst=3, tag=0) from {_at('for work in dist.batch_isend_irecv(ops):')}"
        ", which rank 3 never receives (it passed); rank 2 waits in irecv(src=1, tag=0) from "
        f"{_at('for work in dist.batch_isend_irecv(ops):')}, which rank 1 never sends", "CollectiveMismatch"),
    "test_all_to_all_splits": (
        "split mismatch in all_to_all_single #1 of group default: rank 1 sends [1, 3] but rank 0 expects 2 from it, "
        f"and 1 more pair (from {_at('output_split_sizes=[2, 2]')}); gloo rejected it on rank 1 "
        "(inLengthPerRank[myRank] == outLengthPerRank[myRank])", "CollectiveMismatch"),
    "test_mesh_skip": (f"rank 2 skipped all_reduce #1 of group tp[2,3] from {_at('# the tp all_reduce')} "
                       f"and waits in barrier #1 of group default from {_at('# rank 2 comes here')}; ranks 0,1 issued "
                       "it first, rank 3 waits in it", "CollectiveMismatch"),
    "test_isend_irecv_wait_tag": (
        f"p2p tag mismatch: rank 0 waits in isend(dst=1, tag=3) from {_at('tag=3)')}, which rank 1 never receives; "
        f"rank 1 waits in irecv(src=0, tag=4) from {_at('tag=4)')}, which rank 0 never sends", "CollectiveMismatch"),
    "test_both_send_first": (
        f"p2p deadlock: both ranks send first: rank 0 waits in send(dst=1, tag=0) from {_at('dst=1 - rank')}, which "
        f"rank 1 never receives; rank 1 waits in send(dst=0, tag=0) from {_at('dst=1 - rank')}, which rank 0 never "
        "receives", "CollectiveMismatch"),
    "test_recv_from_wrong_source": (
        f"p2p peer mismatch: rank 0 waits in send(dst=1, tag=0) from {_at('torch.ones(2), dst=1)')}, which rank 1 "
        f"never receives; rank 1 waits in recv(src=2, tag=0) from {_at('src=2)')}, which rank 2 never sends "
        "(it passed)", "CollectiveMismatch"),
    "test_reduce_dst": ("root mismatch in reduce #1 of group default: rank 0 dst=0, rank 1 dst=1 "
                        f"(from {_at('dist.reduce(')})", "CollectiveMismatch"),
    "test_broadcast_object_src": ("root mismatch in broadcast_object_list #1 of group default: rank 0 src=0, "
                                  f"rank 1 src=1 (from {_at('broadcast_object_list([rank]')})", "CollectiveMismatch"),
    "test_reduce_scatter_op": ("reduce-op mismatch in reduce_scatter_tensor #1 of group default: rank 0 MIN, rank 1 "
                               f"SUM (from {_at('reduce_scatter_tensor(')}); the backend completed it without an "
                               "error: its result is wrong", "CollectiveMismatch"),
    "test_swapped_group_order": (
        f"deadlock across groups: rank 0 waits in all_reduce #1 of group weights[0,1] from {_at('group=group)')} "
        f"without rank 1, rank 1 in all_reduce #1 of group grads[0,1] from {_at('group=group)')} without rank 0",
        "CollectiveMismatch"),
    "test_all_to_all_abort": (
        "split mismatch in all_to_all_single #1 of group default: rank 0 sends [2, 2] but rank 1 expects 1 from it, "
        f"and 1 more pair (from {_at('output_split_sizes=n')}); rank 1 killed by SIGABRT inside it",
        "CollectiveMismatch"),
}
# what blocks (or, for a reduce op, completes) at once: the failure within 2 s of it on an idle
# machine; the bound is 60 s, so 5 s leaves a loaded 2-core runner its margin
FAST = 5.0


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    return run_scenarios(tmp_path_factory, SCENARIOS, "--nccl-timeout=60")


def test_scenarios_session(scenarios):
    inner, _, _ = scenarios
    assert inner.result.parseoutcomes() == {"passed": 4, "failed": len(EXPECTED)}, inner.text


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_scenario_headline_exception_and_time(scenarios, scenario):
    inner, props, durations = scenarios
    headline, exception = EXPECTED[scenario]
    assert props.get((scenario, "nccl_diagnosis")) == headline, inner.section(scenario)
    assert props.get((scenario, "nccl_exception")) == exception
    assert durations[scenario] < FAST, (scenario, durations[scenario])


UNTRACED = """
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_all_to_all_splits_untraced(rank):
    splits = [2, 2] if rank == 0 else [1, 3]
    dist.all_to_all_single(torch.zeros(4), torch.ones(4), output_split_sizes=[2, 2], input_split_sizes=splits)
"""


def test_gloo_checks_read_as_the_same_disagreement_without_a_trace(tmp_path_factory):
    inner = run_inner_once(tmp_path_factory, UNTRACED, "--nccl-trace=off", name="test_untraced")
    assert ("split mismatch in a collective (gloo on rank 1: inLengthPerRank[myRank] == outLengthPerRank[myRank]); "
            "rank 1 raised it") in inner.text, inner.text
