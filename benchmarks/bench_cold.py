"""Whole-process start-up: the wall time a user waits for `pytest FILE` to come back, ours against
torch's own harnesses, measured A B A B so that a comparison holds while the machine's speed drifts.

Each comparison runs its two commands in turn, A then B, for N pairs (after one warm-up run of every
command, not counted), and reports each side's median and the ratio A/B pair by pair with its
median. The commands, each a whole process started from nothing:

  ours-1    python -m pytest -q -p no:cacheprovider ours_1.py --nccl-world=4    (one @pytest.mark.nccl test)
  ours-20   the same on a file of 20 such tests
  mpct-1    python mpct_1.py      torch's MultiProcContinuousTest, world 4, gloo (run_tests(), as
  mpct-20   python mpct_20.py     torch's own test files are run; --theirs-runner=pytest for pytest)
  mptc-1    python mptc_1.py      torch's MultiProcessTestCase (a spawn of 4 ranks per test)
  mptc-20   python mptc_20.py
  floor     python -c "import torch, pytest"
  pytest-floor  python -m pytest -q -p no:cacheprovider plain.py   (one plain test that imports torch:
            what any pytest session costs on this host, its other pytest plugins included; on a GPU
            image with hypothesis, jaxtyping, pytest-benchmark, -cov and anyio that is ~2 s over the floor)

Every test is the same trivial all_reduce of a one-element tensor at world 4. The files are written
into a temporary directory; every process a run starts carries a tag in its environment, and
anything still alive with that tag shortly after the run's own process exited is killed and
counted as a leftover, so nothing outlives the benchmark.

Run: python benchmarks/bench_cold.py [--pairs 5] [--spawn-pairs 2] [--quick] [--json FILE]
     python benchmarks/bench_cold.py --timeline 3   (where our one-test session's wall time goes)
No assertion: a benchmark reports, it does not gate. Warm per-test costs, the fresh group after a
failure and the tracer's cost per collective are in bench_startup.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from whole_process import LEFTOVER_GRACE, Command, Run, RunFailed, run_once

WORLD = 4

OURS = '''\
import pytest, torch
import torch.distributed as dist

{tests}'''

OURS_TEST = '''
@pytest.mark.nccl
def test_{i:03d}(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
'''

MPCT = '''\
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest
from torch.testing._internal.common_utils import run_tests


class AllReduce(MultiProcContinuousTest):
    world_size = {world}

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"
{tests}

if __name__ == "__main__":
    run_tests()
'''

MPCT_TEST = '''
    def test_{i:03d}(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), self.world_size)
'''

MPTC = '''\
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests


class AllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return {world}

    def setUp(self):
        super().setUp()
        self._spawn_processes()
{tests}

if __name__ == "__main__":
    run_tests()
'''

MPTC_TEST = '''
    def test_{i:03d}(self):
        dist.init_process_group("gloo", store=dist.FileStore(self.file_name, self.world_size),
                                rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), self.world_size)
        dist.destroy_process_group()
'''

FLOOR = "import torch, pytest"
PLAIN = "import torch\n\n\ndef test_plain():\n    assert torch.ones(1).item() == 1\n"


def write_files(workdir: str, tests: int, world: int = WORLD) -> dict[str, str]:
    """The benchmark's test files, 1 and ``tests`` tests each, for the three harnesses."""
    paths = {}
    for n in sorted({1, tests}):
        for name, module, test in (("ours", OURS, OURS_TEST), ("mpct", MPCT, MPCT_TEST), ("mptc", MPTC, MPTC_TEST)):
            body = "".join(test.format(i=i) for i in range(n))
            path = os.path.join(workdir, f"{name}_{n}.py")
            with open(path, "w") as f:
                f.write(module.format(world=world, tests=body))
            paths[f"{name}-{n}"] = path
    paths["plain"] = os.path.join(workdir, "plain.py")
    with open(paths["plain"], "w") as f:
        f.write(PLAIN)
    return paths


def commands(paths: dict[str, str], tests: int, theirs_runner: str = "python",
             world: int = WORLD) -> dict[str, Command]:
    py = sys.executable
    pytest_argv = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmds = {"floor": Command("floor", [py, "-c", FLOOR], "", 'python -c "import torch, pytest"'),
            "pytest-floor": Command("pytest-floor", [*pytest_argv, paths["plain"]], "1 passed",
                                    "pytest, one plain torch test")}
    for n in sorted({1, tests}):
        plural = "s" if n > 1 else ""
        cmds[f"ours-{n}"] = Command(f"ours-{n}", [*pytest_argv, paths[f"ours-{n}"], f"--nccl-world={world}"],
                                    f"{n} passed", f"pytest-nccl, {n} test{plural}")
        for kind, label in (("mpct", "MultiProcContinuousTest"), ("mptc", "MultiProcessTestCase")):
            path = paths[f"{kind}-{n}"]
            if theirs_runner == "pytest":  # plain pytest as their users have it: without our plugin
                argv, expect = [*pytest_argv, "-p", "no:nccl", path], f"{n} passed"
            else:  # run_tests() -> unittest, how torch's own distributed test files are run
                argv, expect = [py, path], f"Ran {n} test{plural}"
            # a spawn of `world` ranks per test: about 7-8 s a test on 2 cores
            timeout = 120.0 + (40.0 * n if kind == "mptc" else 60.0)
            cmds[f"{kind}-{n}"] = Command(f"{kind}-{n}", argv, expect, f"{label}, {n} test{plural}", timeout)
    return cmds


# -- A B A B comparisons ----------------------------------------------------------------------------

@dataclass
class Comparison:
    key: str
    a: Command
    b: Command
    pairs: int
    runs_a: list[Run] = field(default_factory=list)
    runs_b: list[Run] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [ra.wall / rb.wall for ra, rb in zip(self.runs_a, self.runs_b, strict=True)]

    def summary(self) -> dict:
        return summarize(self.key, self.a, self.b, self.runs_a, self.runs_b)


def summarize(key: str, a: Command, b: Command, runs_a: list[Run], runs_b: list[Run]) -> dict:
    ratios = [ra.wall / rb.wall for ra, rb in zip(runs_a, runs_b, strict=True)]
    return {
        "key": key, "a": a.name, "b": b.name, "a_label": a.label, "b_label": b.label,
        "a_argv": a.argv, "b_argv": b.argv, "pairs": len(ratios),
        "a_wall": [r.wall for r in runs_a], "b_wall": [r.wall for r in runs_b],
        "a_cpu": [r.cpu for r in runs_a], "b_cpu": [r.cpu for r in runs_b],
        "a_leftovers": sum(r.leftovers for r in runs_a), "b_leftovers": sum(r.leftovers for r in runs_b),
        "ratios": ratios,
        "a_median": median(r.wall for r in runs_a), "b_median": median(r.wall for r in runs_b),
        "a_cpu_median": median(r.cpu for r in runs_a), "b_cpu_median": median(r.cpu for r in runs_b),
        "ratio_median": median(ratios),
    }


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def plan(cmds: dict[str, Command], tests: int, pairs: int, spawn_pairs: int) -> list[Comparison]:
    many = f"-{tests}"
    plan = [Comparison("one-test vs MultiProcContinuousTest", cmds["ours-1"], cmds["mpct-1"], pairs),
            Comparison("one-test vs import floor", cmds["ours-1"], cmds["floor"], pairs),
            Comparison("one-test vs pytest floor", cmds["ours-1"], cmds["pytest-floor"], pairs)]
    if tests > 1:
        plan.append(Comparison(f"{tests}-test vs MultiProcContinuousTest", cmds["ours" + many],
                               cmds["mpct" + many], pairs))
    plan.append(Comparison("one-test vs MultiProcessTestCase", cmds["ours-1"], cmds["mptc-1"], pairs))
    if tests > 1 and spawn_pairs > 0:
        plan.append(Comparison(f"{tests}-test vs MultiProcessTestCase", cmds["ours" + many],
                               cmds["mptc" + many], spawn_pairs))
    return plan


def execute(comparisons: list[Comparison], workdir: str, warmup: int, progress=print) -> None:
    log = os.path.join(workdir, "run.log")
    seen = set()
    for comp in comparisons:  # warm-up: every command (but the 20 spawns a test) once, not counted
        for cmd in (comp.a, comp.b):
            if cmd.name not in seen and not (cmd.name.startswith("mptc-") and cmd.name != "mptc-1"):
                seen.add(cmd.name)
                for _ in range(warmup):
                    r = run_once(cmd, workdir, log)
                    progress(f"  warm-up  {cmd.name:<8} {r.wall:6.2f} s")
    for comp in comparisons:
        progress(f"{comp.key}: A = {comp.a.name}, B = {comp.b.name}, {comp.pairs} pairs")
        for i in range(comp.pairs):
            ra = run_once(comp.a, workdir, log)
            rb = run_once(comp.b, workdir, log)
            comp.runs_a.append(ra)
            comp.runs_b.append(rb)
            progress(f"  pair {i + 1}: {comp.a.name} {ra.wall:6.2f} s  {comp.b.name} {rb.wall:6.2f} s  "
                     f"ratio {ra.wall / rb.wall:.3f}"
                     + (f"  leftovers {ra.leftovers}/{rb.leftovers}" if ra.leftovers or rb.leftovers else ""))


def table(summaries: list[dict], tests: int) -> str:
    by_key = {s["key"]: s for s in summaries}
    lines = [f"{'comparison (A / B)':<42} {'pairs':>5} {'A median':>9} {'B median':>9} "
             f"{'A cpu':>7} {'B cpu':>7} {'median A/B':>10}  ratios of the pairs"]
    for s in summaries:
        lines.append(f"{s['a'] + ' / ' + s['b']:<42} {s['pairs']:>5} {s['a_median']:>8.2f}s {s['b_median']:>8.2f}s "
                     f"{s['a_cpu_median']:>6.1f}s {s['b_cpu_median']:>6.1f}s {s['ratio_median']:>10.3f}  "
                     + " ".join(f"{r:.2f}" for r in s["ratios"]))
    leftovers = sum(s["a_leftovers"] + s["b_leftovers"] for s in summaries)
    lines.append(f"(wall seconds of whole processes; cpu: user+sys of the process tree; processes alive "
                 f"{LEFTOVER_GRACE:g} s after their run exited, killed: {leftovers})")
    one = by_key.get("one-test vs MultiProcContinuousTest")
    floor = by_key.get("one-test vs import floor")
    pytest_floor = by_key.get("one-test vs pytest floor")
    many = by_key.get(f"{tests}-test vs MultiProcContinuousTest")
    lines.append("")
    if many and one and tests > 1:
        ours_per = (many["a_median"] - one["a_median"]) / (tests - 1)
        mpct_per = (many["b_median"] - one["b_median"]) / (tests - 1)
        lines.append(f"each test after the first, from medians of separate blocks (noisy; warm figures: "
                     f"bench_startup.py): ours {ours_per * 1000:.0f} ms, "
                     f"MultiProcContinuousTest {mpct_per * 1000:.0f} ms")
    if many:
        lines.append(f"{tests}-test world-{WORLD} session: ours {many['a_median']:.2f} s, MultiProcContinuousTest "
                     f"{many['b_median']:.2f} s, ratio {many['ratio_median']:.2f}")
    for spawn in (by_key.get("one-test vs MultiProcessTestCase"), by_key.get(f"{tests}-test vs MultiProcessTestCase")):
        if spawn:
            n = spawn["a"].split("-")[1]
            lines.append(f"{'one' if n == '1' else n}-test world-{WORLD} session: ours {spawn['a_median']:.2f} s, "
                         f"MultiProcessTestCase {spawn['b_median']:.2f} s, ratio {spawn['ratio_median']:.2f}")
    if one:
        lines.append(f"one-test world-{WORLD} session: ours {one['a_median']:.2f} s, MultiProcContinuousTest "
                     f"{one['b_median']:.2f} s, ratio {one['ratio_median']:.2f} (target <= 0.25)")
    if floor:
        lines.append(f"ours / import-torch-pytest floor: {floor['ratio_median']:.2f} (target <= 1.3)"
                     f"  [floor {floor['b_median']:.2f} s, ours {floor['a_median']:.2f} s]")
    if pytest_floor:
        lines.append(f"ours / a plain pytest session on this host: {pytest_floor['ratio_median']:.2f}"
                     f"  [pytest floor {pytest_floor['b_median']:.2f} s, ours {pytest_floor['a_median']:.2f} s]")
    return "\n".join(lines)


def timeline(cmd: Command, workdir: str, runs: int, progress=print) -> None:
    """Run ``cmd`` (a pytest-nccl session) with the bench_timeline plugin and print where its wall
    time went, stage by stage, next to the wall time seen from outside."""
    here = os.path.dirname(os.path.abspath(__file__))
    argv = [*cmd.argv, "-p", "bench_timeline"]
    traced = Command(cmd.name + "+timeline", argv, cmd.expect, cmd.label, cmd.timeout)
    log = os.path.join(workdir, "timeline.log")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = here + (os.pathsep + old if old else "")
    try:
        for i in range(runs):
            run = run_once(traced, workdir, log)
            with open(log, errors="replace") as f:
                lines = [line.rstrip() for line in f if line.startswith("[timeline]")]
            progress(f"{' '.join(cmd.argv[1:])} -p bench_timeline: run {i + 1}, wall {run.wall:.2f} s "
                     f"from outside, cpu {run.cpu:.2f} s")
            for line in lines:
                progress("  " + line)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs per comparison (default 5)")
    parser.add_argument("--spawn-pairs", type=int, default=2,
                        help="pairs for the many-test MultiProcessTestCase comparison, 2-3 minutes a pair "
                             "on 2 cores (default 2; 0 skips it)")
    parser.add_argument("--tests", type=int, default=20, help="tests in the many-test files (default 20)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs of each command first (default 1)")
    parser.add_argument("--theirs-runner", choices=("python", "pytest"), default="python",
                        help="run torch's harness files as `python FILE` (run_tests(), the default) or "
                             "`python -m pytest FILE` (without this plugin)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 pairs, no warm-up, "
                        "no many-test MultiProcessTestCase")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    parser.add_argument("--timeline", type=int, metavar="RUNS", default=0,
                        help="instead: run our one-test session RUNS times with the bench_timeline plugin "
                             "and print when each stage happened")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.spawn_pairs, args.warmup = min(args.pairs, 2), 0, 0
    if args.pairs < 1 or args.tests < 1:
        parser.error("--pairs and --tests must be >= 1")

    def on_sigterm(signum, frame):  # unwind, so that run_once kills what the current run started
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as workdir:
        cmds = commands(write_files(workdir, args.tests), args.tests, args.theirs_runner)
        if args.timeline:
            try:
                timeline(cmds["ours-1"], workdir, args.timeline, progress=lambda line: print(line, flush=True))
            except RunFailed as exc:
                print(exc, file=sys.stderr)
                return 1
            return 0
        comparisons = plan(cmds, args.tests, args.pairs, args.spawn_pairs)
        print(f"world {WORLD}, gloo, {os.cpu_count()} cores, load average {load_before[0]:.2f}; "
              f"torch's harness run as: {args.theirs_runner} FILE", flush=True)
        try:
            execute(comparisons, workdir, args.warmup, progress=lambda line: print(line, flush=True))
        except RunFailed as exc:
            print(exc, file=sys.stderr)
            return 1
    summaries = [c.summary() for c in comparisons]
    print()
    print(table(summaries, args.tests))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": WORLD, "tests": args.tests, "cores": os.cpu_count(),
                       "python": platform.python_version(), "theirs_runner": args.theirs_runner,
                       "load_before": load_before, "load_after": os.getloadavg(),
                       "seconds": time.time() - started, "comparisons": summaries}, f, indent=1)
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
