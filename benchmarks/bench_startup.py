"""Start-up and per-test cost of distributed tests, measured side by side in one run:

- torch's MultiProcessTestCase (a spawn per test) and MultiProcContinuousTest (workers reused),
  from torch.testing._internal.common_distributed (needs `expecttest`);
- pytest-nccl through real pytest sessions, and its group pool directly (first group, warm call,
  fresh group after a failure);
- the tracer: 5000 one-element all_reduces with tracing on and off, in one group.

Run: python benchmarks/bench_startup.py [--world 4] [--tests 20] [--spawn-tests 5]
Prints the figures and the ratios against the targets of the issue. No assertion: a benchmark
reports, it does not gate.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
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


def _session_seconds(path: str, args: list[str], cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, *args],
                          cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark session failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def torch_harness(world: int, tests: int, spawn_tests: int, workdir: str) -> dict:
    def write(n_spawned, n_continuous):
        spawned = "\n".join(f"    def test_s{i}(self):\n        self._trivial()\n" for i in range(n_spawned))
        continuous = "\n".join(f"    def test_c{i}(self):\n        dist.all_reduce(torch.ones(1))\n"
                               for i in range(n_continuous))
        path = os.path.join(workdir, f"test_harness_{n_spawned}_{n_continuous}.py")
        with open(path, "w") as f:
            f.write(HARNESS.format(world=world, spawned_tests=spawned or "    pass",
                                   continuous_tests=continuous or "    pass"))
        return path

    baseline = _session_seconds(write(0, 0), ["-p", "no:nccl"], workdir)
    spawned = _session_seconds(write(spawn_tests, 0), ["-p", "no:nccl", "-k", "Spawned"], workdir)
    one = _session_seconds(write(0, 1), ["-p", "no:nccl", "-k", "Continuous"], workdir)
    many = _session_seconds(write(0, tests + 1), ["-p", "no:nccl", "-k", "Continuous"], workdir)
    return {"spawn_per_test": (spawned - baseline) / spawn_tests,
            "continuous_start": one - baseline,
            "continuous_per_test": (many - one) / tests}


def ours_sessions(world: int, tests: int, workdir: str) -> dict:
    def write(n):
        body = "\n".join(f"@pytest.mark.nccl(world={world})\ndef test_{i}(rank):\n    pass\n" for i in range(n))
        path = os.path.join(workdir, f"test_ours_{n}.py")
        with open(path, "w") as f:
            f.write(OURS.format(tests=body))
        return path

    baseline = _session_seconds(write(0), [], workdir) if False else None
    one = _session_seconds(write(1), [], workdir)
    many = _session_seconds(write(tests + 1), [], workdir)
    many_off = _session_seconds(write(tests + 1), ["--nccl-trace=off"], workdir)
    one_off = _session_seconds(write(1), ["--nccl-trace=off"], workdir)
    return {"session_per_test": (many - one) / tests, "session_per_test_untraced": (many_off - one_off) / tests}


def ours_pool(world: int, tests: int) -> dict:
    from pytest_nccl import protocol
    from pytest_nccl.group import GroupPool

    pool = GroupPool(None, [], trace=True, count_gpus=False)
    try:
        t0 = time.perf_counter()
        pool.get(world, "gloo", 60, time.monotonic() + 120)
        first = time.perf_counter() - t0

        def call(fn, *args, trace=True):
            import pickle
            c = protocol.Call(0, protocol.KIND_FUNCTION, "collectives", os.path.join(HERE, "collectives.py"), fn,
                              pickle.dumps((args, {})), journal_dir=pool.new_call_dir(), trace=trace,
                              sys_path=list(sys.path))
            group = pool.get(world, "gloo", 60, time.monotonic() + 60)
            result = group.run(c, 60)
            assert result.all_passed, [v.message for v in result.ranks]
            return [pickle.loads(result.outcomes[r].value) for r in range(world)]

        call("trivial")  # the module import in the ranks, once
        t0 = time.perf_counter()
        for _ in range(tests):
            call("trivial")
        warm = (time.perf_counter() - t0) / tests

        respawns = []
        for _ in range(3):
            pool.release()
            t0 = time.perf_counter()
            pool.get(world, "gloo", 60, time.monotonic() + 60)
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
        harness = None if args.skip_torch else torch_harness(args.world, args.tests, args.spawn_tests, workdir)

    ms = 1000.0
    print(f"world {args.world}, gloo, {os.cpu_count()} cores")
    print(f"pytest-nccl  first group ready (fork server + {args.world} ranks joined): {pool['first_group']:.2f} s")
    print(f"pytest-nccl  warm call, trivial function (pool API):         {pool['warm_call'] * ms:.2f} ms")
    print(f"pytest-nccl  warm test in a pytest session, trace on / off:  {sessions['session_per_test'] * ms:.1f} / "
          f"{sessions['session_per_test_untraced'] * ms:.1f} ms")
    print(f"pytest-nccl  fresh group after a failure (kill + fork + join): {pool['respawn']:.3f} s")
    overhead_us = (pool["collective_traced"] - pool["collective_untraced"]) * 1e6
    print(f"pytest-nccl  one-element all_reduce, traced / untraced:       {pool['collective_traced'] * 1e6:.1f} / "
          f"{pool['collective_untraced'] * 1e6:.1f} us (tracing adds {overhead_us:.1f} us)")
    if harness:
        print(f"torch MultiProcessTestCase      per test (spawn each time):   {harness['spawn_per_test']:.2f} s")
        print(f"torch MultiProcContinuousTest   start:                        {harness['continuous_start']:.2f} s")
        print(f"torch MultiProcContinuousTest   per test:                     {harness['continuous_per_test'] * ms:.1f} ms")
        print()
        print("ratios (target in brackets):")
        print(f"  first group / MultiProcContinuousTest start:  {pool['first_group'] / harness['continuous_start']:.2f}  [<= 0.25]")
        print(f"  MultiProcessTestCase per test / our warm test: "
              f"{harness['spawn_per_test'] / sessions['session_per_test']:.0f}x")
    print(f"  warm call overhead (pool API):                {pool['warm_call'] * ms:.2f} ms  [<= 3 ms]")
    print(f"  fresh group after a failure:                  {pool['respawn']:.3f} s  [<= 0.5 s]")
    print(f"  tracing overhead per collective:              {overhead_us:.1f} us  [<= 20 us]")


if __name__ == "__main__":
    main()
