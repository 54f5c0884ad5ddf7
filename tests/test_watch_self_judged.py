"""A pytest-nccl session inside a watched job (``pytest-nccl watch -- torchrun -m pytest``, or a test
that launches one, which the plugin follows as a test's own ranks): that session bounds and judges
its ranks' collectives test by test and goes on to the next test; the watch around it gives no
verdict of its own (it would end the session at the first hang its tests provoke, or fail a test
that checks the session's report), follows the job's processes, and says so in one line.

Before: the watch ended the job when a rank of a passing test was slower than its --timeout (exit
3, the later tests never ran); the outer test of tests/test_spmd.py that launches such a session
failed now and then with the follower's "rank 1 exited with code 1" (issue 30's soak).
"""

from __future__ import annotations

import textwrap

from watch_support import run_watch, torchrun

from pytest_nccl.watch.engine.outcome import SELF_JUDGED
from pytest_nccl.watch.inrank import ownranks

SESSION = """
import time

import pytest
import torch
import torch.distributed as dist


@pytest.mark.nccl
def test_a_hangs_on_rank_0(rank):
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins it


@pytest.mark.nccl
def test_b_after_the_hang(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.nccl
def test_c_slow_rank_within_the_session_s_bound(rank):
    if rank == 1:
        time.sleep(8)  # past the watch's --timeout, well within the session's
    dist.all_reduce(torch.ones(1))
"""


def test_an_spmd_session_under_the_watch_judges_itself_and_runs_to_its_end(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(SESSION))
    # the watch's --timeout (4 s) is shorter than the session's bound (30 s): the session judges
    # test a (a desync) and passes test c (a slow rank), where the watch alone would end the job
    run = run_watch(tmp_path, torchrun("-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_inner.py",
                                       "--nccl-timeout=30", "--nccl-backend=gloo"), "--timeout", "4")
    assert "diagnosed; ending the job" not in run.stderr, run.text
    assert "FAILED test_inner.py::test_a_hangs_on_rank_0" in run.stdout, run.text
    assert "PASSED test_inner.py::test_b_after_the_hang" in run.stdout, run.text
    assert "PASSED test_inner.py::test_c_slow_rank_within_the_session_s_bound" in run.stdout, run.text
    assert f"pytest-nccl watch: {SELF_JUDGED}" in run.stderr, run.text
    assert run.code == 1, run.text  # the session's own status: a test failed
    s = run.summary
    assert s is not None and not s["verdict"] and not s["ended_by_watch"], s


def test_only_pytest_nccl_s_own_ranks_are_self_judged():
    """The caller of ``init_process_group``, at any depth, is one of pytest-nccl's rank modules."""
    def called_from(module: str) -> bool:
        namespace = {"__name__": module, "ownranks": ownranks}
        exec("def create():\n    return ownranks.created_by_pytest_nccl(__import__('sys')._getframe(0))", namespace)
        return namespace["create"]()

    assert called_from("pytest_nccl.spmd.group") and called_from("pytest_nccl.rank.loop")
    assert not called_from("train") and not called_from("pytest_nccl.watch.inrank.inject")
    for module in ownranks.OWN_RANKS:  # they exist, and create the default group
        path = __import__("importlib").util.find_spec(module).origin
        assert "init_process_group(" in open(path).read(), module
