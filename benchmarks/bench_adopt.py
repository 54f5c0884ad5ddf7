"""Adopted harnesses: PyTorch's own distributed suite under this plugin against torch's harness, and
the warm cost of an adopted test against a marked one. Whole processes, run A B A B.

1. ``_DistTestBase`` (the torch wheel's DistributedTest._DistTestBase, through the three lines of
   test/distributed/test_distributed_spawn.py) at world W on gloo, a ``-k`` selection:
     A  pytest test_distributed_spawn.py -k SEL                 (the plugin adopts the class)
     B  pytest test_distributed_spawn.py -k SEL -p no:nccl      (torch's harness: a spawn per test)
   Every test whose outcome differs is listed; target: A/B <= 0.1.
2. Warm per-test cost, from the JUnit times of the 2nd..Nth test of one session (every test the
   same all_reduce of one element at world 2):
     adopted MultiProcContinuousTest test  vs  @pytest.mark.nccl test     (target: <= 2x)
     adopted MultiProcessTestCase test (fresh ranks, its own init_process_group) for reference.

Run: python benchmarks/bench_adopt.py [--world 2] [--pairs 2] [--select EXPR] [--warm-tests 20]
No assertion: a benchmark reports, it does not gate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cold  # noqa: E402

# the selection: 50 tests at world 2 on torch 2.13
DEFAULT_SELECT = "all_reduce_sum or broadcast or all_gather or barrier"

SPAWN_FILE = '''\
import torch
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
'''

WARM_FILE = '''\
import pytest, torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest, MultiProcessTestCase


class Continuous(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"
{continuous}

class Process(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()
{process}
{marked}'''

CONTINUOUS_TEST = '''
    def test_{i:03d}(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
'''
PROCESS_TEST = '''
    def test_{i:03d}(self):
        dist.init_process_group("gloo", store=dist.FileStore(self.file_name, 2), rank=self.rank, world_size=2)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
        dist.destroy_process_group()
'''
MARKED_TEST = '''
@pytest.mark.nccl(world=2)
def test_marked_{i:03d}():
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
'''


def suite_argv(workdir: str, select: str) -> dict[str, list[str]]:
    """The two whole-process runs of the selection: the plugin's and torch's harness's."""
    path = os.path.join(workdir, "test_distributed_spawn.py")
    with open(path, "w") as f:
        f.write(SPAWN_FILE)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, "-k", select]
    return {"plugin": [*argv, f"--junitxml={workdir}/plugin.xml"],
            "torch": [*argv, "-p", "no:nccl", f"--junitxml={workdir}/torch.xml"]}


def timed(argv: list[str], workdir: str, timeout: float = 3600) -> float:
    """Wall seconds of one whole process; whatever it started is gone afterwards."""
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{bench_cold.TAG_VAR: tag})
    env.pop("PYTEST_ADDOPTS", None)
    start = time.perf_counter()
    with open(os.path.join(workdir, "run.log"), "ab") as log:
        try:
            subprocess.run(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        finally:
            bench_cold.kill_tagged(tag, bench_cold.LEFTOVER_GRACE)
    return time.perf_counter() - start


def outcomes(junit: str) -> dict[str, tuple[str, str]]:
    """test -> (outcome, message) from a JUnit XML file."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, (child.get("message") or "")[:120]
        found[case.get("name", "")] = (outcome, message)
    return found


def differences(ours: dict, theirs: dict) -> list[str]:
    """Every test whose outcome differs (a skip's reason aside)."""
    lines = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name, ("missing", "")), theirs.get(name, ("missing", ""))
        if a[0] != b[0]:
            lines.append(f"  {name}: plugin {a[0]} ({a[1]}), torch's harness {b[0]} ({b[1]})")
    return lines


def warm_costs(workdir: str, tests: int) -> dict[str, list[float]]:
    """Seconds per test of one session, by kind, without each kind's first test (its group starts)."""
    path = os.path.join(workdir, "test_warm.py")
    with open(path, "w") as f:
        f.write(WARM_FILE.format(
            continuous="".join(CONTINUOUS_TEST.format(i=i) for i in range(tests)),
            process="".join(PROCESS_TEST.format(i=i) for i in range(tests)),
            marked="".join(MARKED_TEST.format(i=i) for i in range(tests))))
    junit = os.path.join(workdir, "warm.xml")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, f"--junitxml={junit}"],
                   cwd=workdir, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=900)
    costs: dict[str, list[float]] = {"continuous": [], "process": [], "marked": []}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = "marked" if case.get("name", "").startswith("test_marked") else case.get("classname", "").rsplit(
            ".", 1)[-1].lower()
        costs[kind].append(float(case.get("time", 0)))
    return {kind: times[1:] for kind, times in costs.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--select", default=DEFAULT_SELECT, help="-k expression over _DistTestBase's tests")
    parser.add_argument("--warm-tests", type=int, default=20)
    parser.add_argument("--skip-suite", action="store_true", help="only the warm per-test costs")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-adopt-")
    temp_dir = tempfile.mkdtemp(prefix="bench-adopt-temp-")
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(args.world), TEMP_DIR=temp_dir)
    print(f"torch harness vs pytest-nccl, world {args.world}, gloo, {os.cpu_count()} CPUs; workdir {workdir}")
    if not args.skip_suite:
        runs = suite_argv(workdir, args.select)
        walls: dict[str, list[float]] = {"plugin": [], "torch": []}
        for i in range(args.pairs):
            for name in ("plugin", "torch"):
                walls[name].append(timed(runs[name], workdir))
            print(f"  pair {i + 1}: plugin {walls['plugin'][-1]:.1f} s, torch's harness {walls['torch'][-1]:.1f} s, "
                  f"ratio {walls['plugin'][-1] / walls['torch'][-1]:.3f}", flush=True)
        ours, theirs = outcomes(f"{workdir}/plugin.xml"), outcomes(f"{workdir}/torch.xml")
        counts = {k: sum(1 for o in ours.values() if o[0] == k) for k in ("passed", "skipped", "failure", "error")}
        ratios = [a / b for a, b in zip(walls["plugin"], walls["torch"], strict=True)]
        print(f"_DistTestBase -k '{args.select}', world {args.world}: {len(ours)} tests ({counts}); plugin "
              f"{statistics.median(walls['plugin']):.1f} s, torch's harness {statistics.median(walls['torch']):.1f} s, "
              f"median ratio {statistics.median(ratios):.3f} (target <= 0.1)")
        diff = differences(ours, theirs)
        print(f"outcomes that differ from torch's harness (last pair): {len(diff)}", *diff, sep="\n")
    pairs = []
    for i in range(args.pairs):
        costs = warm_costs(workdir, args.warm_tests)
        med = {kind: statistics.median(times) * 1000 for kind, times in costs.items()}
        pairs.append(med)
        print(f"  warm session {i + 1}: adopted MultiProcContinuousTest {med['continuous']:.1f} ms, "
              f"marked {med['marked']:.1f} ms, adopted MultiProcessTestCase {med['process']:.1f} ms a test")
    ratio = statistics.median(p["continuous"] / p["marked"] for p in pairs)
    print(f"warm adopted test / warm marked test: {ratio:.2f} (target <= 2); adopted MultiProcessTestCase "
          f"test (fresh ranks and its own group): {statistics.median(p['process'] for p in pairs):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
