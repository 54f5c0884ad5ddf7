"""Functional collectives, DTensor, torch.compile and ProcessGroup objects are journaled with call
sites before they block (issue 23): each pattern below runs in one real inner session (gloo, world
2, the real torch code) and must fail with a headline that names the op, the ranks and the line,
well before the bound (decided by the same fast rules as c10d functions, not at the bound)."""

from __future__ import annotations

import re

import pytest
from conftest import line_of, run_inner_once

SOURCE = """
import pytest, torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

BOUND = 60


@pytest.mark.nccl(world=2, timeout=BOUND)
def test_functional_all_reduce_skipped(rank):
    if rank == 0:
        funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()  # FUNCOL
    dist.barrier()  # BARRIER


@pytest.mark.nccl(world=2, timeout=BOUND)
def test_dtensor_redistribute_on_one_rank(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    x = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    if rank == 0:
        x = x.redistribute(mesh, [Replicate()])  # REDISTRIBUTE
    dist.all_reduce(x.to_local().sum())  # AFTER


def step(x):
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1  # COMPILED


compiled_step = torch.compile(step, backend="aot_eager")


@pytest.mark.nccl(world=2, timeout=BOUND)
def test_compiled_step_count_differs(rank):
    x = torch.ones(2)
    for _ in range(2 if rank == 0 else 1):
        x = compiled_step(x)  # CALL
    dist.barrier()  # END


@pytest.mark.nccl(world=2, timeout=BOUND)
def test_process_group_methods(rank):
    pg = dist.group.WORLD
    if rank == 0:
        pg.allreduce([torch.ones(2)]).wait()  # PG_ALLREDUCE
    else:
        pg.broadcast(torch.ones(2), 0).wait()  # PG_BROADCAST


@pytest.mark.nccl(world=2, timeout=BOUND)
def test_new_group_skipped(rank):
    if rank == 0:
        dist.new_group([0])  # NEW_GROUP
    dist.barrier()  # SKIPPED_TO


@pytest.mark.nccl(world=2, timeout=BOUND)
def test_zz_agreeing_functional_and_pg_calls_pass(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    out = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
    assert out.tolist() == [2.0, 2.0]
    mesh = init_device_mesh("cpu", (2,))
    x = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    assert x.to_local().sum().item() == 28.0
    dist.group.WORLD.allreduce([torch.ones(1)]).wait()
    assert compiled_step(torch.ones(2)).tolist() == [5.0, 5.0]
    from torch.distributed.device_mesh import DeviceMesh
    from pytest_nccl.rank import tracer
    group = dist.new_group([0, 1], group_desc="wrapped")
    wrapped = DeviceMesh.from_group(group, "cpu")  # a mesh over a group made before
    y = distribute_tensor(torch.arange(8.0).reshape(4, 2), wrapped, [Shard(0)]).redistribute(wrapped, [Replicate()])
    assert y.to_local().sum().item() == 28.0 and tracer.pg_label(group)[0] == "wrapped[0,1]"
"""


def _line(snippet: str) -> str:
    return f"test_inner.py:{line_of(SOURCE, snippet)}"


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    return run_inner_once(tmp_path_factory, SOURCE, "--durations=0", "-p", "no:randomly")


def _duration(inner, test: str) -> float:
    m = re.search(rf"([\d.]+)s call +test_inner.py::{test}\b", inner.text)
    assert m, inner.text
    return float(m.group(1))


EXPECTED = {
    # test -> (headline regex, what it must say)
    "test_functional_all_reduce_skipped": (
        rf"op mismatch at collective #1 of group default: rank 0 all_reduce, rank 1 barrier "
        rf"\(from {_line('# FUNCOL')}; rank 1 from {_line('# BARRIER')}\)"),
    "test_dtensor_redistribute_on_one_rank": (
        rf"op mismatch at collective #\d+ of group (default|tp\[0,1\]): rank 0 all_gather_into_tensor, rank 1 "
        rf"all_reduce \(from {_line('# REDISTRIBUTE')}; rank 1 from {_line('# AFTER')}\)"),
    "test_compiled_step_count_differs": (
        rf"op mismatch at collective #2 of group default: rank 0 all_reduce, rank 1 barrier "
        rf"\(from {_line('# COMPILED')}; rank 1 from {_line('# END')}\)"),
    "test_process_group_methods": (
        rf"op mismatch at collective #1 of group default: rank 0 all_reduce, rank 1 broadcast "
        rf"\(from {_line('# PG_ALLREDUCE')}; rank 1 from {_line('# PG_BROADCAST')}\)"),
    "test_new_group_skipped": (
        rf"op mismatch at collective #1 of group default: rank 0 new_group, rank 1 barrier "
        rf"\(from {_line('# NEW_GROUP')}; rank 1 from {_line('# SKIPPED_TO')}\)"),
}


def test_session_outcomes(inner):
    assert inner.result.parseoutcomes() == {"passed": 1, "failed": len(EXPECTED)}, inner.text


@pytest.mark.parametrize("test", sorted(EXPECTED))
def test_headline_names_op_ranks_and_line_before_the_bound(inner, test):
    section = inner.section(test)
    assert re.search(EXPECTED[test], section), section
    assert "CollectiveMismatch" in section or "op mismatch" in section
    # decided by the mismatch rule (about a second after the ranks block), not at the 60 s bound
    assert _duration(inner, test) < 30, inner.text


def test_compiled_graph_call_site_is_the_line_the_graph_kept(inner):
    """Inside the compiled step the record's call site is the funcol line the graph's node kept,
    then the call of the compiled function."""
    section = inner.section("test_compiled_step_count_differs")
    assert f"at {_line('# COMPILED')}" in section, section


def test_functional_wait_is_where_the_rank_blocks(inner):
    """rank 0 blocked in wait_tensor: its all_reduce record is async and waiting, not only entered."""
    section = inner.section("test_functional_all_reduce_skipped")
    assert re.search(r"rank 0: .*all_reduce.*waiting", section) or "(waiting)" in section, section
