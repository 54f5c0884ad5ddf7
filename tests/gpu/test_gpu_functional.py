"""On a GPU host, NCCL at world 1: functional collectives (what DTensor, FSDP2's state dicts and
compiled graphs issue) are journaled with their call sites, eager and through inductor's generated
code, and a rank stuck after one is bounded (issue 23, item 6).

Skipped without CUDA; run on every GPU host you get: ``pytest tests/gpu -v`` (or the whole
``tests/gpu/run_gpu_host.sh``). What it asserts is the CPU behaviour of
tests/test_functional_trace.py, on NCCL: each record's call site is read from the trace JSON
(``--nccl-trace-dir``), since the terminal report shows sites only at a divergence.
"""

import json
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


def _sites(trace_dir, test: str) -> list[str]:
    """The call sites of the all_reduce records of ``test``'s rank 0, from its trace JSON."""
    [path] = trace_dir.glob(f"*{test}.json")
    [rank0] = json.loads(path.read_text())["ranks"]
    return [" <- ".join(c["site"]) for c in rank0["collectives"] if c["op"] == "all_reduce"]


def test_functional_collectives_on_nccl(run_inner, pytester):
    trace = pytester.path / "trace"
    inner = run_inner(SOURCE, "--durations=0", f"--nccl-trace-dir={trace}")
    assert inner.result.parseoutcomes() == {"failed": 3}, inner.text
    eager = inner.section("test_eager_functional_is_journaled")
    assert re.search(r"#1 all_reduce \[4\]", eager), eager
    # a raised rank's table shows no sites (only a divergence does): the journal's record has it
    assert _sites(trace, "test_eager_functional_is_journaled") == [_line("# EAGER")], inner.text
    compiled = _sites(trace, "test_inductor_graph_is_journaled")
    # the line the graph kept where it kept one; else the compiled function (its frame runs dynamo's
    # code, whose lines map to the def line: so it reads on CPU with inductor) or the call of it
    assert len(compiled) == 1 and compiled[0].startswith(
        (f"{_line('# COMPILED')}", f"{_line('def step(x)')}", f"{_line('# CALL')}")), compiled
    stuck = inner.section("test_rank_stuck_after_a_functional_collective_is_bounded")
    assert "8 s bound" in stuck and "all_reduce" in stuck, stuck
    assert _line("# STUCK") in stuck, stuck  # where the rank is: the stack's line
    assert _sites(trace, "test_rank_stuck_after_a_functional_collective_is_bounded") == [_line("# BEFORE_STUCK")]
    m = re.search(r"([\d.]+)s call +test_inner.py::test_rank_stuck_after_a_functional_collective_is_bounded",
                  inner.text)
    assert m and float(m.group(1)) < 8 + 30, inner.text  # the bound, plus stacks and tear-down
