"""Artifacts: --nccl-trace-dir JSON and Flight Recorder dumps that torch's fr_trace reads, the JUnit
property, async collectives, subgroups, and --nccl-trace=off."""

import importlib.util
import json
import pickle
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import torch

TRACED = """
import time
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2, timeout=3)
def test_slow_rank_async(rank):
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    if rank == 1:
        time.sleep(60)
    dist.all_gather_into_tensor(torch.zeros(4), torch.ones(2))

@pytest.mark.nccl(world=4)
def test_subgroup_mismatch(rank):
    pair = dist.new_group([0, 1])
    other = dist.new_group([2, 3])
    if rank < 2:
        dist.all_reduce(torch.ones(2 + rank), group=pair)
    else:
        dist.all_reduce(torch.ones(2), group=other)
"""


def test_trace_dir_junit_and_flight_recorder(run_inner, pytester):
    inner = run_inner(TRACED, "--nccl-trace-dir=traces", "--junitxml=junit.xml")
    assert inner.result.parseoutcomes() == {"failed": 2}, inner.text
    traces = pytester.path / "traces"
    data = json.loads((traces / "test_inner.py__test_slow_rank_async.json").read_text())
    assert data["diagnosis"]["kind"] == "slow-rank" and data["diagnosis"]["ranks"] == [1]
    first = data["ranks"][0]["collectives"][0]
    assert (first["op"], first["async"], first["state"], first["group"], first["seq"]) == \
        ("all_reduce", True, "completed", "default", 1)
    assert first["site"][0].startswith("test_inner.py:")
    pending = data["ranks"][0]["collectives"][1]
    assert (pending["op"], pending["state"], pending["shapes"]) == ("all_gather_into_tensor", "entered", "[2]")
    assert "time.sleep(60)" in data["ranks"][1]["stack"]

    sub = inner.section("test_subgroup_mismatch")
    assert "shape mismatch in all_reduce #1 of group pg1[0,1]: rank 0 [2], rank 1 [3]" in sub

    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_slow_rank_async"].iter("property")}
    assert props["nccl_diagnosis"].startswith("slow rank: rank 1 is busy outside any collective")
    assert (props["nccl_diagnosis_kind"], props["nccl_exception"]) == ("slow-rank", "CollectiveTimeout")
    failure = cases["test_slow_rank_async"].find("failure")
    assert failure.get("message").startswith("CollectiveTimeout: slow rank: rank 1")

    fr_dir = traces / "test_inner.py__test_slow_rank_async.fr"
    assert sorted(p.name for p in fr_dir.iterdir()) == ["rank_0", "rank_1"]
    if importlib.util.find_spec("torch.distributed.flight_recorder") is None:
        # torch 2.6 has no fr_trace to analyze it with: the dump must still load as fr_trace's
        # input, with the hang's entries where this torch's recorder records gloo
        from pytest_nccl.rank import flight_api
        with open(fr_dir / "rank_0", "rb") as f:
            dump = pickle.load(f)
        assert {"entries", "pg_config", "version"} <= set(dump), sorted(dump)
        if not flight_api.gap("gloo"):
            assert any("all_gather" in e.get("profiling_name", "") for e in dump["entries"]), dump["entries"]
        return
    analyzed = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(fr_dir)],
                              capture_output=True, text=True, timeout=120)
    printed = analyzed.stdout + analyzed.stderr  # its logger writes to stderr
    if analyzed.returncode != 0 and re.search(r"gloo.*nccl", printed):
        # older fr_trace (torch 2.11) analyzes NCCL/XCCL dumps only: the dump must still be what it
        # loads (it got as far as checking the backend), with the entries of the hang
        with open(fr_dir / "rank_0", "rb") as f:
            dump = pickle.load(f)
        assert {"entries", "pg_config", "version"} <= set(dump), sorted(dump)
        assert any("all_gather" in e.get("profiling_name", "") for e in dump["entries"]), dump["entries"]
        return
    assert analyzed.returncode == 0, printed
    assert "missing ranks: {1}" in printed and "gloo:all_gather" in printed


UNTRACED = """
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_raises(rank):
    dist.all_reduce(torch.ones(1))
    assert rank == 0
"""


def test_trace_off(run_inner):
    inner = run_inner(UNTRACED, "--nccl-trace=off")
    assert "trace off" in inner.text
    section = inner.section("test_raises")
    assert "rank 1 raised AssertionError: assert 1 == 0" in section
    assert "all_reduce" not in section.split("-- traceback")[0]


GATE = """
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_desync(rank):
    if rank == 0:
        dist.all_reduce(torch.ones(1))

@pytest.mark.nccl(world=2)
def test_fine(rank):
    dist.barrier()
"""

UNLOADABLE = """
import pytest
import only_in_the_controller  # made by conftest.py, which ranks do not run

@pytest.mark.nccl(world=2)
def test_cannot_load(rank):
    pass
"""


def test_gate_report_step_summary_and_bisect_exit_codes(run_inner, pytester, monkeypatch):
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    inner = run_inner(GATE, "--nccl-report=gate.md", "--nccl-exitcode-infra")
    assert inner.result.ret == 1  # a desync is a real failure: git bisect marks the commit bad
    report = (pytester.path / "gate.md").read_text()
    assert "backend **gloo**, world size **2**" in report and f"| torch | {torch.__version__} |" in report
    assert "rank 1 left the test (passed) after 0 collectives" in report
    # the job summary: the failed distributed tests' table (docs/ci.md), then the gate report
    table, gate = summary.read_text().split("\n\n# ", 1)
    assert table.startswith("### pytest-nccl: 1 distributed test failed\n") and "# " + gate == report

    pytester.makeconftest("import sys, types\nsys.modules['only_in_the_controller'] = types.ModuleType('x')\n")
    infra = run_inner(UNLOADABLE, "--nccl-exitcode-infra", "test_unloadable.py", name="test_unloadable")
    assert infra.result.ret == 125, infra.text  # cannot test this commit: git bisect skips it


DDP = """
import pytest, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

@pytest.mark.nccl(world=2, timeout=30)
def test_ddp_rank_skips_a_step(rank):
    model = DDP(torch.nn.Linear(4, 4))
    for step in range(2):
        if rank == 1 and step == 1:
            return  # an empty batch: this rank skips forward and backward
        model(torch.randn(2, 4)).sum().backward()
"""


def test_collectives_issued_from_cpp_come_from_the_flight_recorder(run_inner):
    """DDP's reducer issues its collectives from C++, where the Python tracer cannot see them: the
    Flight Recorder can, and the controller consults it once a rank has finished. A torch whose
    Flight Recorder does not record the backend (2.6 on gloo) says so in the session header."""
    from pytest_nccl.rank import flight_api
    inner = run_inner(DDP, "--durations=1")
    section = inner.section("test_ddp_rank_skips_a_step")
    backend = re.search(r"^nccl: world 2, backend (\w+)", inner.text, re.M)
    assert backend, inner.text
    gap = flight_api.gap(backend.group(1))
    if gap:  # this torch cannot see them: the header says so, once, and the test still ends at its bound
        assert f"nccl: {gap}" in inner.result.stdout.lines, inner.text
        assert "collectives issued from C++ (DDP's reducer) are not traced" in gap
        assert inner.result.parseoutcomes().get("failed") == 1, inner.text
        return
    assert not any("are not traced" in line for line in inner.result.stdout.lines[:8]), inner.text
    assert re.search(r"rank 1 left the test \(passed\) after \d+ collectives in group default; rank 0 waits "
                     r"in \w+ #\d+ of group default \(issued from C\+\+, seen by the Flight Recorder\)", section)
    assert "* issued from C++" in section
    m = re.search(r"([\d.]+)s call +test_inner.py::test_ddp_rank_skips_a_step", inner.text)
    assert m and float(m.group(1)) < 15, inner.text  # well before the 30 s bound


def test_group_labels_show_ranks_compactly():
    """Labels carry the ranks (members_of reads them back): ranges, a stride, or '...' past the width."""
    from pytest_nccl.core.groups import members_of
    from pytest_nccl.core.groups import ranks_text as _label_ranks
    assert _label_ranks([2, 3]) == "2,3" and _label_ranks(list(range(16))) == "0-15"
    strided = _label_ranks(list(range(0, 64, 2)))
    assert strided == "0-62:2" and members_of(f"dp[{strided}]", 64) == list(range(0, 64, 2))
    assert _label_ranks([3, 1, 2]) == "3,1,2"  # new_group(sort_ranks=False): group rank order
    ragged = _label_ranks([i * i for i in range(40)])
    assert ragged.endswith(",...") and members_of(f"pg9[{ragged}]", 2000) == list(range(2000))
