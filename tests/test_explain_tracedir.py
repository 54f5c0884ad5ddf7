"""``pytest-nccl explain`` on the ``.fr`` dumps a failed test left in its trace folder gives that test's
own headline: a rank that left the test, and an op mismatch, in one inner session with
``--nccl-trace-dir``; the second test runs on the same forked group, so its dumps hold the first
test's collectives too, and the headline still numbers them as the test did."""

from __future__ import annotations

import io
import os

import pytest
from conftest import run_inner_once

from pytest_nccl.explain.cli import main

INNER = """
import pytest, torch, torch.distributed as dist

@pytest.mark.nccl(world=2, timeout=8)
def test_left():
    x = torch.ones(4)
    dist.all_reduce(x)
    if dist.get_rank() == 0:
        dist.all_reduce(x)

@pytest.mark.nccl(world=2, timeout=8)
def test_op():
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.all_reduce(x)
    if dist.get_rank() == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, 0)
"""
NAME = "test_fr_folder"


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):
        pytest.skip(f"torch {torch.__version__} does not record gloo in its Flight Recorder")
    return run_inner_once(tmp_path_factory, INNER, "--nccl-trace-dir=traces", name=NAME)


@pytest.mark.parametrize("test", ["test_left", "test_op"])
def test_explain_on_a_failed_tests_fr_folder_gives_the_tests_headline(inner, test):
    said = inner.headline(test)
    assert said, inner.text
    fr = os.path.join(rootdir(inner), "traces", f"{NAME}.py__{test}.fr")
    assert os.path.isdir(fr), inner.text
    out, err = io.StringIO(), io.StringIO()
    code = main([fr], out=out, err=err)
    assert code == 3, out.getvalue() + err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("pytest-nccl explain: with the test's trace ")
    assert lines[2].split(": ", 1)[1] == said, (lines[2], said)


def rootdir(inner) -> str:
    """The folder the inner session ran in (its trace folder is relative to it)."""
    for line in inner.result.stdout.lines:
        if line.startswith("rootdir: "):
            return line.split("rootdir: ", 1)[1].split(",")[0].strip()
    raise AssertionError(inner.text)
