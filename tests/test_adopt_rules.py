"""Which of torch's harness classes are adopted (on torch's real classes), and torch's rules for the
outcome of a test whose ranks all finished (on data), as ``_check_return_codes`` and the continuous
worker loop apply them."""

from __future__ import annotations

import sys
import types

import pytest

from pytest_nccl.adopt.classes import harness_of, verdict_for
from pytest_nccl.adopt.rules import ANY_EXIT, torch_outcome
from pytest_nccl.core.diagnosis.findings import Diagnosis
from pytest_nccl.core.messages import Harness
from pytest_nccl.core.records import RankView
from pytest_nccl.core.reports import CallOutcome
from pytest_nccl.core.states import Kind, RankState, Reason

common = pytest.importorskip("torch.testing._internal.common_distributed")


def _module(**classes):
    module = types.ModuleType("adopt_rules_fixture")
    vars(module).update(classes)
    return module


def test_harness_classes_and_verdicts():
    class Plain(common.MultiProcessTestCase):
        pass

    class Continuous(common.MultiProcContinuousTest):
        pass

    class Threads(common.MultiThreadedTestCase):
        pass

    class OwnJoin(common.MultiProcessTestCase):
        def _join_processes(self, fn):
            pass

    class OwnLoop(common.MultiProcContinuousTest):
        @classmethod
        def _worker_loop(cls, *args):
            pass

    module = _module(Plain=Plain, Continuous=Continuous, Threads=Threads, OwnJoin=OwnJoin, OwnLoop=OwnLoop)
    assert harness_of(Plain) == Harness.PROCESS and harness_of(Continuous) == Harness.CONTINUOUS
    assert harness_of(int) is None and harness_of("Plain") is None
    assert verdict_for(Plain, module, "Plain").adopted
    assert verdict_for(Continuous, module, "Continuous").adopted
    assert "threads" in verdict_for(Threads, module, "Threads").why_not
    assert verdict_for(OwnJoin, module, "OwnJoin").why_not.startswith("OwnJoin._join_processes is overridden")
    assert verdict_for(OwnLoop, module, "OwnLoop").why_not.startswith("OwnLoop._worker_loop is overridden")
    # a rank finds the class by the name pytest collected it by
    assert "not the name" in verdict_for(Plain, module, "Alias").why_not
    assert verdict_for(object, module, "object") is None


def test_pytorch_suite_classes_are_adopted():
    from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase
    assert verdict_for(DTensorTestBase, _module(DTensorTestBase=DTensorTestBase), "DTensorTestBase").adopted
    if "BACKEND" in __import__("os").environ or "torch.testing._internal.distributed.distributed_test" in sys.modules:
        from torch.testing._internal.distributed.distributed_test import TestDistBackend
        assert harness_of(TestDistBackend) == Harness.PROCESS


def _result(*states, reason=Reason.COMPLETED, messages=(), diagnosis=None, exit_codes=(), signals=()):
    views = [RankView(r, status=s, message=messages[r] if r < len(messages) else "",
                      exit_code=exit_codes[r] if r < len(exit_codes) else None,
                      signal_name=signals[r] if r < len(signals) else None) for r, s in enumerate(states)]
    return CallOutcome(views=views, reason=reason, diagnosis=diagnosis)


P, S, F, D, R = RankState.PASSED, RankState.SKIPPED, RankState.FAILED, RankState.DEAD, RankState.RUNNING


def test_rank_0_decides_a_skip_of_a_process_test():
    assert torch_outcome(_result(P, P), Harness.PROCESS).skipped is False
    skip = torch_outcome(_result(S, S, messages=("Need at least 2 CUDA devices",) * 2), Harness.PROCESS)
    assert skip.skipped and skip.reason == "Need at least 2 CUDA devices"
    assert torch_outcome(_result(P, S), Harness.PROCESS).skipped is False  # rank 1's code is not read
    assert torch_outcome(_result(S, P, messages=("why", "")), Harness.PROCESS).reason == "why"


def test_first_skipping_rank_decides_a_continuous_test():
    out = torch_outcome(_result(P, S, messages=("", "rank 1's reason")), Harness.CONTINUOUS)
    assert out.skipped and out.reason == "rank 1's reason"


def test_failures_are_the_plugins_verdict():
    assert torch_outcome(_result(P, F), Harness.PROCESS) is None
    assert torch_outcome(_result(P, D, exit_codes=(None, 3)), Harness.PROCESS) is None
    assert torch_outcome(_result(P, R, reason=Reason.DECIDED), Harness.CONTINUOUS) is None
    assert torch_outcome(_result(P, P, reason=Reason.TIMEOUT), Harness.PROCESS) is None


def test_ranks_that_disagree_but_pass_are_a_pass_with_a_note():
    diag = Diagnosis(Kind.OP_MISMATCH, "op mismatch at collective #1 of group default")
    out = torch_outcome(_result(P, P, diagnosis=diag), Harness.PROCESS)
    assert out is not None and not out.skipped and out.note == diag.headline


def test_expected_exit_codes():
    # skip_return_code_checks: any exit is accepted, but not a rank that raised
    assert torch_outcome(_result(D, P, exit_codes=(1,)), Harness.PROCESS, ANY_EXIT) is not None
    assert torch_outcome(_result(D, F, exit_codes=(1,)), Harness.PROCESS, ANY_EXIT) is None
    # special_return_code_checks: rank 0's code (a signal as multiprocessing reports it: -6)
    assert torch_outcome(_result(D, D, signals=("SIGABRT", "SIGABRT")), Harness.PROCESS, -6) is not None
    assert torch_outcome(_result(D, D, exit_codes=(3, 3)), Harness.PROCESS, 3) is not None
    assert torch_outcome(_result(D, D, exit_codes=(4, 4)), Harness.PROCESS, 3) is None
