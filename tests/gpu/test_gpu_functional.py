"""On a GPU host, NCCL at world 1: functional collectives (what DTensor, FSDP2's state dicts and
compiled graphs issue) are journaled with their call sites, eager and through inductor's generated
code, and a rank stuck after one is bounded (issue 23, item 6).

Skipped without CUDA; run on every GPU host you get: ``pytest tests/gpu -v``. Not run on the CPU
machine this was written on (none was lent): what it asserts is the CPU behaviour of
tests/test_functional_trace.py, on NCCL.
"""

import re

import pytest
import torch
from conftest import line_of

GPUS = torch.cuda.device_count()  # NVML first: no CUDA initialized in the controller
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no CUDA device on this host")

SOURCE = """
import pytest, torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


@pytest.mark.nccl(world=1, backend="nccl", timeout=60)
def test_eager_functional_is_journaled(rank, device):
    out = funcol.all_reduce(torch.ones(4, device=device), "sum", dist.group.WORLD)  # EAGER
    assert out.sum().item() == 4
    raise ValueError("show the trace")


def step(x):
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1  # COMPILED


@pytest.mark.nccl(world=1, backend="nccl", timeout=120)
def test_inductor_graph_is_journaled(rank, device):
    compiled = torch.compile(step)  # inductor: the graph becomes generated Python calling the ops
    assert compiled(torch.ones(4, device=device)).sum().item() == 12  # CALL
    raise ValueError("show the trace")


@pytest.mark.nccl(world=1, backend="nccl", timeout=8)
def test_rank_stuck_after_a_functional_collective_is_bounded(rank, device):
    out = funcol.all_reduce(torch.ones(4, device=device), "sum", dist.group.WORLD)  # BEFORE_STUCK
    out = out + 1
    torch.cuda._sleep(1 << 40)  # a kernel that does not end
    torch.cuda.synchronize()  # STUCK
"""


def _line(snippet: str) -> str:
    return f"test_inner.py:{line_of(SOURCE, snippet)}"


def test_functional_collectives_on_nccl(run_inner):
    inner = run_inner(SOURCE, "--durations=0")
    assert inner.result.parseoutcomes() == {"failed": 3}, inner.text
    eager = inner.section("test_eager_functional_is_journaled")
    assert re.search(r"#1 all_reduce \[4\]", eager) and f"at {_line('# EAGER')}" in eager, eager
    compiled = inner.section("test_inductor_graph_is_journaled")
    # the line the graph kept where it kept one, else at least the call of the compiled function
    assert "all_reduce" in compiled and (f"at {_line('# COMPILED')}" in compiled
                                         or f"at {_line('# CALL')}" in compiled), compiled
    stuck = inner.section("test_rank_stuck_after_a_functional_collective_is_bounded")
    assert "8 s bound" in stuck and "all_reduce" in stuck, stuck
    assert _line("# STUCK") in stuck, stuck  # where the rank is: the stack's line
    m = re.search(r"([\d.]+)s call +test_inner.py::test_rank_stuck_after_a_functional_collective_is_bounded",
                  inner.text)
    assert m and float(m.group(1)) < 8 + 30, inner.text  # the bound, plus stacks and tear-down
