"""A failed distributed test's report names the exception class a user catches (``pytest.raises``,
``xfail(raises=)``) on its first line, which the short summary (-r) and the JUnit failure message
show, and ends with the trace files --nccl-trace-dir got, each with what opens it. Which tests get
trace files: a failed or xfailed one (an expected failure's trace shows it still fails as expected),
never one that passed or xpassed (docs/reports.md)."""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from conftest import run_inner_once

from pytest_nccl.views.report import NcclLongRepr, format_trace_files, trace_files

INNER = """
import pytest, torch
import torch.distributed as dist
import pytest_nccl


@pytest.mark.nccl(world=2, timeout=20)
def test_desync(rank):
    dist.all_gather([torch.empty(3 + 2 * rank) for _ in range(2)], torch.ones(3 + 2 * rank))


@pytest.mark.nccl(world=2, timeout=20)
def test_raises(rank):
    assert rank == 0, "rank 1 disagrees"


@pytest.mark.nccl(world=2, timeout=20)
@pytest.mark.xfail(raises=pytest_nccl.CollectiveMismatch, strict=True)
def test_known_desync(rank):
    if rank == 0:
        dist.all_reduce(torch.ones(1))


@pytest.mark.nccl(world=2, timeout=20)
@pytest.mark.xfail(reason="it passes", strict=False)
def test_xpasses(rank):
    dist.all_reduce(torch.ones(1))


@pytest.mark.nccl(world=2, timeout=20)
def test_passes(rank):
    dist.all_reduce(torch.ones(1))
"""
NAME = "test_report_inner"


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    run = run_inner_once(tmp_path_factory, INNER, "--nccl-trace-dir=traces", "--junitxml=junit.xml", name=NAME)
    (folder,) = tmp_path_factory.getbasetemp().glob(f"{NAME}[0-9]*")  # run_inner_once's mktemp
    cases = {c.get("name"): c for c in ET.parse(folder / "junit.xml").getroot().iter("testcase")}
    return SimpleNamespace(run=run, dir=folder, traces=folder / "traces", cases=cases)


def section(inner, test: str) -> str:
    """The failure's report in the inner session's output, from its title to the next title."""
    lines = inner.run.text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip("_ ") == test)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("____")
                or lines[i].startswith("=====")), len(lines))
    return "\n".join(lines[start + 1:end])


def base(test: str) -> str:
    return f"{NAME}.py__{test}"


def test_the_outcomes(inner):
    assert inner.run.result.parseoutcomes() == {"failed": 2, "passed": 1, "xfailed": 1, "xpassed": 1}, \
        inner.run.text


@pytest.mark.parametrize("test, exception, headline", [
    ("test_desync", "CollectiveMismatch", "shape mismatch in all_gather #1 of group default"),
    ("test_raises", "RankRaised", "rank 1 raised AssertionError: rank 1 disagrees"),
])
def test_the_first_line_names_the_exception_class(inner, test, exception, headline):
    report = section(inner, test)
    first = report.splitlines()[0]
    assert first.startswith(f"{exception}: {headline}"), report
    props = {p.get("name"): p.get("value") for p in inner.cases[test].iter("property")}
    assert props["nccl_exception"] == exception
    # the JUnit failure message is what pytest's short summary line (-r) shows, trimmed to the width
    assert inner.cases[test].find("failure").get("message") == f"{exception}: {props['nccl_diagnosis']}"
    assert f"FAILED {NAME}.py::{test} - {exception}: " in inner.run.text


@pytest.mark.parametrize("test", ["test_desync", "test_raises"])
def test_the_report_ends_with_its_trace_files(inner, test):
    report = section(inner, test)
    files = report[report.index("-- trace files (--nccl-trace-dir) --"):].splitlines()[1:]
    files = files[:next((i for i, line in enumerate(files) if not line.startswith("  ")), len(files))]
    listed = {line.split()[0]: line for line in files}
    stem = f"traces/{base(test)}"
    assert "swimlane page: any browser" in listed[stem + ".html"]
    assert "ui.perfetto.dev" in listed[stem + ".trace.json"]
    assert "JSON" in listed[stem + ".json"]
    for path in listed:
        assert (inner.dir / path).exists(), path


def test_an_xfailed_test_writes_its_trace_a_passed_or_xpassed_one_none(inner):
    names = {p.name for p in inner.traces.iterdir()}
    stem = base("test_known_desync")
    assert {stem + ".json", stem + ".trace.json", stem + ".html"} <= names, names
    for test in ("test_xpasses", "test_passes"):
        assert not [n for n in names if n.startswith(base(test) + ".")], names


# -- on data -----------------------------------------------------------------------------------------

def test_trace_files_lists_this_calls_files_only(tmp_path):
    stem = tmp_path / "t.py__test_a"
    for suffix in (".json", ".trace.json", ".html"):
        (stem.parent / (stem.name + suffix)).write_text("{}")
    (tmp_path / "t.py__test_a.fr").mkdir()
    (tmp_path / "t.py__test_a.fr" / "rank_0").write_bytes(b"x")
    (tmp_path / "t.py__test_a.fr" / "rank_1").write_bytes(b"x")
    old = time.time() - 3600   # an earlier run's leftovers: not this failure's files
    os.utime(stem.parent / (stem.name + ".html"), (old, old))
    os.utime(tmp_path / "t.py__test_a.fr" / "rank_1", (old, old))
    files = trace_files(str(tmp_path), "t.py::test_a", since=time.time() - 60)
    assert [os.path.basename(p.rstrip(os.sep)) for p, _ in files] == \
        ["t.py__test_a.trace.json", "t.py__test_a.json", "t.py__test_a.fr"]
    assert files[-1][1] == (f"Flight Recorder dumps, 1 rank(s): python -m torch.distributed.flight_recorder.fr_trace "
                            f"{tmp_path / 't.py__test_a.fr'}")
    assert len(trace_files(str(tmp_path), "t.py::test_a")) == 4   # without a start, whatever is there
    assert trace_files(str(tmp_path), "t.py::test_b") == []


def test_the_long_repr_without_files_or_class_is_the_headline_and_body():
    plain = NcclLongRepr("boom", "boom\n\nbody", "t.py", 3)
    assert str(plain) == "boom\n\nbody" and plain.reprcrash.message == "boom"
    named = NcclLongRepr("boom", "boom\n\nbody", "t.py", 3, "RankRaised", [("d/t.html", "any browser")])
    assert named.reprcrash.message == "RankRaised: boom"
    assert str(named) == "RankRaised: boom\n\nbody\n\n" + format_trace_files([("d/t.html", "any browser")])
