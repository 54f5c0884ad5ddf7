"""Tests written against torch's own harnesses (MultiProcessTestCase, MultiProcContinuousTest,
MultiThreadedTestCase; PyTorch's TestDistBackend + DistributedTest._DistTestBase, DTensorTestBase and
FSDPTest, from the installed torch) run unchanged under the plugin: their ranks come from the fork
server, a desync is a bounded failure with the plugin's headline, a continuous class goes on after a
failed test, and every other test ends as it does under torch's own harness (the same session with
--nccl-adopt=off, which also proves the switch)."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

import pytest
from conftest import line_of, run_inner_once

pytest.importorskip("torch.testing._internal.common_distributed")

# Each test's name says whether torch's own harness can run it in reasonable time: "fault" tests hang
# or take minutes there (that is what the plugin fixes) and are left out of the reference session.
HARNESS_TESTS = """
import os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.common_distributed import (
    TEST_SKIPS, MultiProcContinuousTest, MultiProcessTestCase, MultiThreadedTestCase)
from torch.testing._internal.common_fsdp import FSDPTest
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    # test/distributed/test_distributed_spawn.py's class, line for line
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class ProcessTests(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _group(self):
        dist.init_process_group("gloo", store=dist.FileStore(self.file_name, self.world_size),
                                rank=self.rank, world_size=self.world_size)

    def test_fault_rank_skips_all_reduce(self):
        self._group()
        if self.rank == 0:
            dist.all_reduce(torch.ones(2))
        dist.barrier()

    def test_passes(self):
        self._group()
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t.tolist(), [2.0, 2.0])

    def test_skip_code(self):
        sys.exit(TEST_SKIPS["small_worldsize"].exit_code)

    def test_skip_code_on_rank_1_only(self):
        if self.rank == 1:
            sys.exit(TEST_SKIPS["odd_worldsize"].exit_code)

    def test_skip_test(self):
        self.skipTest("no frobnicator here")


class ContinuousTests(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

    def test_1_first(self):
        t = torch.ones(3)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((3,), 2.0))

    def test_2_fault_per_rank_shapes(self):
        t = torch.ones(1 + self.rank)
        dist.all_gather([torch.empty(1 + self.rank) for _ in range(self.world_size)], t)

    def test_3_after(self):
        t = torch.ones(3)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((3,), 2.0))


class ThreadedTests(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_threads(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


class DTensorTests(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_shard_and_gather(self):
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        t = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
        self.assertEqual(t.full_tensor(), torch.arange(8.0))

    @with_comms
    def test_fault_one_rank_gathers(self):
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        t = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
        if self.rank == 0:
            t.full_tensor()
        dist.barrier()


class FSDPTests(FSDPTest):
    def test_fsdp_wraps(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(torch.nn.Linear(4, 4).to(torch.device("cuda", self.rank)))
        model(torch.ones(2, 4, device=torch.device("cuda", self.rank))).sum().backward()
"""

ENV = {"BACKEND": "gloo", "WORLD_SIZE": "2"}
# two tests of PyTorch's own suite (one runs everywhere, one needs CUDA), and every other class
SUITE = "not TestDistBackend or test_all_reduce_sum_async or test_all_reduce_sum_cuda_async"


def _session(tmp_path_factory, *args):
    previous = {k: os.environ.get(k) for k in (*ENV, "TEMP_DIR")}
    os.environ.update(ENV, TEMP_DIR=str(tmp_path_factory.mktemp("temp_dir")))
    try:
        junit = tmp_path_factory.mktemp("junit") / "junit.xml"
        inner = run_inner_once(tmp_path_factory, HARNESS_TESTS, f"--junitxml={junit}", *args,
                               name="test_harnesses")
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return inner, _outcomes(junit)


def _outcomes(junit) -> dict:
    """test name -> (outcome, message, seconds) from a JUnit XML file."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = {"failure": "failed", "error": "error"}.get(child.tag, child.tag), \
                    child.get("message", "")
        found[f"{case.get('classname').rsplit('.', 1)[-1]}.{case.get('name')}"] = \
            (outcome, message, float(case.get("time", 0)))
    return found


@pytest.fixture(scope="module")
def adopted(tmp_path_factory):
    return _session(tmp_path_factory, "-k", SUITE)


# torch's harness spawns interpreters that import the test module: a light one for the switch's test
OFF_TESTS = """
import sys
import torch.distributed as dist
from torch.testing._internal.common_distributed import TEST_SKIPS, MultiProcessTestCase


class ProcessTests(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_skip_code(self):
        sys.exit(TEST_SKIPS["small_worldsize"].exit_code)
"""


@pytest.fixture(scope="module")
def not_adopted(tmp_path_factory):
    """The switch: --nccl-adopt=off, and torch's harness runs the test."""
    junit = tmp_path_factory.mktemp("junit") / "junit.xml"
    inner = run_inner_once(tmp_path_factory, OFF_TESTS, f"--junitxml={junit}", "--nccl-adopt=off", name="test_off",
                           timeout=600)
    return inner, _outcomes(junit)


def test_session_says_what_it_adopted(adopted):
    text = adopted[0].text
    for name, harness in (("TestDistBackendWithSpawn", "MultiProcessTestCase"),
                          ("ContinuousTests", "MultiProcContinuousTest"), ("DTensorTests", "MultiProcessTestCase"),
                          ("FSDPTests", "MultiProcessTestCase")):
        assert re.search(rf"nccl: adopted onto the fork server: .*{name} \({harness}, \d+ tests\)", text), text
    assert "not adopted, runs under its own harness: ThreadedTests (MultiThreadedTestCase runs its ranks as " \
           "threads of this process)" in text


def test_off_runs_them_under_their_own_harness(not_adopted):
    inner, outcomes = not_adopted
    assert "not adopted, runs under its own harness: ProcessTests (--nccl-adopt=off)" in inner.text
    assert "adopted onto the fork server" not in inner.text
    # torch's own harness: spawned ranks, their exit code read by _check_return_codes
    assert outcomes["ProcessTests.test_skip_code"][:2] == ("skipped", "Skipped due to small world size.")


def test_a_rank_that_skips_a_collective_fails_fast_with_the_headline(adopted):
    inner, outcomes = adopted
    outcome, message, seconds = outcomes["ProcessTests.test_fault_rank_skips_all_reduce"]
    assert outcome in ("failed", "error") and seconds < 15, (outcome, seconds)
    line = line_of(HARNESS_TESTS, "dist.all_reduce(torch.ones(2))")
    # rank 0 waits in all_reduce #1 while rank 1 waits in barrier #1: the ops differ there
    assert re.search(rf"op mismatch at collective #1 of group default: rank 0 all_reduce, rank 1 barrier "
                     rf"\(from test_harnesses.py:{line}", message), message
    assert "CollectiveMismatch" in inner.section("test_fault_rank_skips_all_reduce") or "mismatch" in message


def test_a_continuous_class_goes_on_after_a_failed_test(adopted):
    outcomes = adopted[1]
    failed = outcomes["ContinuousTests.test_2_fault_per_rank_shapes"]
    assert failed[0] in ("failed", "error") and failed[2] < 15, failed
    assert re.search(r"shape mismatch in all_gather #1 of group default: rank 0 \[1\], rank 1 \[2\]", failed[1]), failed
    assert outcomes["ContinuousTests.test_3_after"][0] == "passed"


def test_dtensor_desync_is_named(adopted):
    outcome, message, seconds = adopted[1]["DTensorTests.test_fault_one_rank_gathers"]
    assert outcome in ("failed", "error") and seconds < 15, (outcome, seconds)
    assert re.search(r"(mismatch|left).*rank 0.*rank 1|rank 1.*rank 0", message), message


def test_torch_skip_codes_are_skips_with_torch_reason(adopted):
    outcomes = adopted[1]
    assert outcomes["ProcessTests.test_skip_code"][:2] == ("skipped", "Skipped due to small world size.")
    assert outcomes["ProcessTests.test_skip_test"][:2] == ("skipped", "no frobnicator here")
    # torch's harness reads rank 0's exit code only
    assert outcomes["ProcessTests.test_skip_code_on_rank_1_only"][0] == "passed"


def test_outcomes_of_pytorch_suites_as_under_torch_harness(adopted):
    """What torch's harness gives these tests (benchmarks/bench_adopt.py --compare runs both harnesses
    over a whole _DistTestBase selection and lists every difference)."""
    import torch
    outcomes = adopted[1]
    from torch.testing._internal.common_distributed import TEST_SKIPS
    plain = outcomes["TestDistBackendWithSpawn.test_all_reduce_sum_async"]
    if 0 < torch.cuda.device_count() < 2:  # TestDistBackend._run: a GPU host needs one per rank
        assert plain[:2] == ("skipped", TEST_SKIPS["multi-gpu-2"].message), plain
    else:
        assert plain[0] == "passed", plain
    cuda = outcomes["TestDistBackendWithSpawn.test_all_reduce_sum_cuda_async"]
    if not torch.cuda.is_available():
        assert cuda[:2] == ("skipped", "CUDA is not available.")
    assert outcomes["DTensorTests.test_shard_and_gather"][0] == "passed"
    # FSDPTest runs one rank per accelerator; without one, torch's _run exits with its skip code
    fsdp = outcomes["FSDPTests.test_fsdp_wraps"]
    if torch.accelerator.device_count() == 0:
        assert fsdp[0] == "skipped" and fsdp[1].startswith("Need at least"), fsdp
    else:
        assert fsdp[0] == "passed", fsdp
    assert outcomes["ContinuousTests.test_1_first"][0] == "passed"
    assert outcomes["ThreadedTests.test_threads"][0] == "passed"
    assert outcomes["ProcessTests.test_passes"][0] == "passed"
