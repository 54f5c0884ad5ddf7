"""Warm and in-process costs of distributed tests, measured side by side in one run:

- torch's MultiProcessTestCase (a spawn per test) and MultiProcContinuousTest (workers reused),
  from torch.testing._internal.common_distributed (needs `expecttest`);
- pytest-nccl through real pytest sessions, and its group pool directly (first group, warm call,
  fresh group after a failure);
- the tracer: 5000 one-element all_reduces with tracing on and off, in one group.

Run: python benchmarks/bench_startup.py [--world 4] [--tests 20] [--spawn-tests 5]
Prints the figures and the ratios against the targets of the issue. No assertion: a benchmark
reports, it does not gate.

What a user waits for, the wall time of a whole `pytest` process against torch's harnesses and
against `python -c "import torch, pytest"`, is bench_cold.py's (A/B pairs, medians, ratios).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

HARNESS = """
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase, MultiProcContinuousTest
from torch.testing._internal.common_utils import run_tests

class Spawned(MultiProcessTestCase):
    @property
    def world_size(self):
        return {world}

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _trivial(self):
        dist.init_process_group("gloo", store=dist.FileStore(self.file_name, self.world_size),
                                rank=self.rank, world_size=self.world_size)
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()

{spawned_tests}

class Continuous(MultiProcContinuousTest):
    world_size = {world}

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

{continuous_tests}
"""

OURS = """
import pytest, torch
import torch.distributed as dist

{tests}
"""


def _session_durations(path: str, args: list[str], cwd: str) -> list[float]:
    """Per-test durations (setup + call + teardown) as pytest's JUnit XML reports them, in order."""
    import xml.etree.ElementTree as ET
    junit = path + ".xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path,
                           f"--junitxml={junit}", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark session failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return [float(case.get("time")) for case in ET.parse(junit).getroot().iter("testcase")]


def torch_harness(world: int, tests: int, spawn_tests: int, workdir: str) -> dict:
    spawned = "\n".join(f"    def test_s{i:03d}(self):\n        self._trivial()\n" for i in range(spawn_tests))
    continuous = "\n".join(f"    def test_c{i:03d}(self):\n        dist.all_reduce(torch.ones(1))\n"
                           for i in range(tests + 1))
    path = os.path.join(workdir, "test_harness.py")
    with open(path, "w") as f:
        f.write(HARNESS.format(world=world, spawned_tests=spawned, continuous_tests=continuous))
    spawn = _session_durations(path, ["-p", "no:nccl", "-k", "Spawned"], workdir)
    cont = _session_durations(path, ["-p", "no:nccl", "-k", "Continuous"], workdir)
    return {"spawn_per_test": sum(spawn) / len(spawn), "continuous_start": cont[0],
            "continuous_per_test": sum(cont[1:]) / len(cont[1:])}


def ours_sessions(world: int, tests: int, workdir: str) -> dict:
    """The first test (its group started, the fork server already importing torch since
    collection) and the warm tests after it, in a real pytest session."""
    body = "\n".join(f"@pytest.mark.nccl(world={world})\ndef test_{i:03d}(rank):\n    pass\n"
                     for i in range(tests + 1))
    path = os.path.join(workdir, "test_ours.py")
    with open(path, "w") as f:
        f.write(OURS.format(tests=body))
    on = _session_durations(path, [], workdir)
    off = _session_durations(path, ["--nccl-trace=off"], workdir)
    return {"first_test": on[0], "per_test": sum(on[1:]) / tests, "per_test_untraced": sum(off[1:]) / tests}


def tracer_cpu_cost(n: int = 20000, rounds: int = 5) -> tuple[float, float, float]:
    """Seconds per one-element all_reduce in a one-rank gloo group in one process, tracer active and
    not, interleaved, best of ``rounds`` (free of the scheduling noise of 4 ranks on 2 cores); and
    the traced wrapper alone around a function that does nothing (its own CPU, without the
    collective it would enter)."""
    code = f"""
import os, sys, tempfile, time
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
import torch, torch.distributed as dist
from pytest_nccl.rank import tracer
tracer.install()
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
t = torch.ones(1)
def run():
    start = time.perf_counter()
    for _ in range({n}):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / {n}
on, off = [], []
journal = tempfile.mktemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
for _ in range({rounds}):
    off.append(run())
    tracer.start(journal); on.append(run()); tracer.stop()
os.unlink(journal)

def all_reduce(tensor, op=None, group=None, async_op=False):  # the same signature, no collective
    return None
wrapped = tracer._wrap("all_reduce", all_reduce)
def alone():
    start = time.perf_counter()
    for _ in range({n}):
        wrapped(t)
    return (time.perf_counter() - start) / {n}
tracer.start(journal); wrapper = min(alone() for _ in range({rounds})); tracer.stop()
os.unlink(journal)
dist.destroy_process_group()  # gloo's threads abort the interpreter's exit otherwise
print(min(on), min(off), wrapper)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    on, off, wrapper = map(float, out.split())
    return on, off, wrapper


def _gloo():
    """What GroupPool.get takes for a CPU gloo group."""
    from pytest_nccl.settings import Placement
    return Placement("gloo", "benchmark")


def ours_pool(world: int, tests: int) -> dict:
    from pytest_nccl.core import messages as protocol
    from pytest_nccl.forked.pool import GroupPool

    gloo = _gloo()
    pool = GroupPool(None, [], trace=True)
    try:
        t0 = time.perf_counter()
        pool.get(world, gloo, 60, time.monotonic() + 120)
        first = time.perf_counter() - t0

        def call(fn, *args, trace=True):
            import pickle
            c = protocol.Call(0, protocol.CallKind.FUNCTION, "collectives", os.path.join(HERE, "collectives.py"), fn,
                              pickle.dumps((args, {})), journal_dir=pool.new_call_dir(), trace=trace,
                              sys_path=list(sys.path))
            group = pool.get(world, gloo, 60, time.monotonic() + 60)
            result = group.run(c, 60)
            assert result.all_passed, [v.message for v in result.ranks]
            return [pickle.loads(result.reports[r].value) for r in range(world)]

        call("trivial")  # the module import in the ranks, once
        t0 = time.perf_counter()
        for _ in range(tests):
            call("trivial")
        warm = (time.perf_counter() - t0) / tests

        respawns = []
        for _ in range(3):
            pool.release()
            t0 = time.perf_counter()
            pool.get(world, gloo, 60, time.monotonic() + 60)
            respawns.append(time.perf_counter() - t0)
        call("trivial")

        n = 5000
        traced = max(call("all_reduces", n, trace=True)) / n
        untraced = max(call("all_reduces", n, trace=False)) / n
        traced2 = max(call("all_reduces", n, trace=True)) / n
        untraced2 = max(call("all_reduces", n, trace=False)) / n
        return {"first_group": first, "warm_call": warm, "respawn": sorted(respawns)[1],
                "collective_traced": min(traced, traced2), "collective_untraced": min(untraced, untraced2)}
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--spawn-tests", type=int, default=5, help="MultiProcessTestCase tests (7-8 s each here)")
    parser.add_argument("--skip-torch", action="store_true", help="skip torch's harness (it needs expecttest)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        pool = ours_pool(args.world, args.tests)
        sessions = ours_sessions(args.world, args.tests, workdir)
        traced, untraced, wrapper = tracer_cpu_cost()
        harness = None if args.skip_torch else torch_harness(args.world, args.tests, args.spawn_tests, workdir)

    ms = 1000.0
    overhead_us = (traced - untraced) * 1e6
    ring_us = (pool["collective_traced"] - pool["collective_untraced"]) * 1e6
    print(f"world {args.world}, gloo, {os.cpu_count()} cores, {args.tests} trivial tests")
    print(f"pytest-nccl  fork server + first group, cold (pool API):     {pool['first_group']:.2f} s")
    print(f"pytest-nccl  first test of a session (group start included): {sessions['first_test']:.2f} s")
    print(f"pytest-nccl  warm test in a session, trace on / off:         {sessions['per_test'] * ms:.2f} / "
          f"{sessions['per_test_untraced'] * ms:.2f} ms")
    print(f"pytest-nccl  warm call, trivial function (pool API):         {pool['warm_call'] * ms:.2f} ms")
    print(f"pytest-nccl  fresh group after a failure (kill + fork + join): {pool['respawn']:.3f} s")
    print(f"pytest-nccl  all_reduce, 1 rank, in process, traced / untraced: {traced * 1e6:.1f} / "
          f"{untraced * 1e6:.1f} us")
    print(f"pytest-nccl  the traced wrapper alone (no collective inside):    {wrapper * 1e6:.1f} us")
    print(f"pytest-nccl  all_reduce at world {args.world}, traced / untraced:        "
          f"{pool['collective_traced'] * 1e6:.0f} / {pool['collective_untraced'] * 1e6:.0f} us "
          f"(difference {ring_us:.0f} us: scheduling noise of {args.world} ranks on {os.cpu_count()} cores)")
    if harness:
        print(f"torch MultiProcessTestCase      per test (a spawn each):      {harness['spawn_per_test']:.2f} s")
        print(f"torch MultiProcContinuousTest   first test (spawn included):  {harness['continuous_start']:.2f} s")
        print(f"torch MultiProcContinuousTest   warm test:                    {harness['continuous_per_test'] * ms:.2f} ms")
    print()
    print("ratios (target in brackets):")
    if harness:
        print(f"  first test / MultiProcContinuousTest's first test, in-session durations: "
              f"{sessions['first_test'] / harness['continuous_start']:.2f}  (not what a user waits for: "
              f"whole processes, the [<= 0.25] target, are bench_cold.py's)")
        print(f"  cold fork server + group / MultiProcContinuousTest's first test: "
              f"{pool['first_group'] / harness['continuous_start']:.2f}")
        print(f"  MultiProcessTestCase per test / our warm test: "
              f"{harness['spawn_per_test'] / sessions['per_test']:.0f}x")
        print(f"  MultiProcContinuousTest's warm test / our warm test: "
              f"{harness['continuous_per_test'] / sessions['per_test']:.1f}x")
    print(f"  warm call overhead (pool API), trace on:       {pool['warm_call'] * ms:.2f} ms  [<= 3 ms]")
    print(f"  fresh group after a failure:                   {pool['respawn']:.3f} s  [<= 0.5 s]")
    print(f"  tracing, added per collective (1 rank, in process): {overhead_us:.1f} us  [<= 20 us]")
    print(f"  tracing, the wrapper's own CPU per collective:      {wrapper * 1e6:.1f} us")


if __name__ == "__main__":
    main()
