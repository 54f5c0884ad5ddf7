"""What ``pytest-nccl watch``'s start-up hook costs a process of the job that stays idle (a launcher,
a data loader worker, a Ray daemon): whole-process wall time of ``python -c pass`` with the hook (its
directory first on PYTHONPATH and the job directory set, as the watch starts a job) and without,
in A/B pairs whose order alternates (ABBA...), one fresh interpreter per run: wall time, and the
process's CPU time (user + system, from wait4: less disturbed by other load). The pairs'
differences give the cost: their median, and the 10th-90th percentiles. And the hook's own time
inside the interpreter (``-X importtime``'s line for ``sitecustomize``).

Also, for the record: ``python -c "import torch"`` with and without the hook (a process that
imports torch and creates no group: the hook loads the tracer and wraps ``init_process_group``).

Run: python benchmarks/bench_watch_startup.py [--pairs 60] [--torch-pairs 10] [--json FILE]
No assertion: a benchmark reports, it does not gate (target: about 1 ms for an idle process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTUP_DIR = os.path.join(REPO, "pytest_nccl", "watch", "inrank", "startup")


def environments(job_dir: str, base: dict | None = None) -> tuple[dict, dict]:
    """(without the hook, with it): the same environment but for what the watch adds."""
    plain = dict(os.environ if base is None else base)
    for key in ("PYTEST_NCCL_WATCH_DIR", "PYTEST_NCCL_WATCH_PKG"):
        plain.pop(key, None)
    hooked = dict(plain)
    hooked["PYTHONPATH"] = os.pathsep.join(p for p in (STARTUP_DIR, plain.get("PYTHONPATH")) if p)
    hooked.update(PYTEST_NCCL_WATCH_DIR=job_dir, PYTEST_NCCL_WATCH_PKG=REPO)
    return plain, hooked


def order(pairs: int) -> list[str]:
    """ABBA ABBA ...: neither side always runs first."""
    return [side for i in range(pairs) for side in (("A", "B") if i % 2 == 0 else ("B", "A"))]


def run(argv: list, env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one whole process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def compare(argv: list, plain: dict, hooked: dict, pairs: int, warmup: int = 2) -> dict:
    for _ in range(warmup):
        run(argv, plain)
        run(argv, hooked)
    a, b = [], []
    for side in order(pairs):
        (a if side == "A" else b).append(run(argv, plain if side == "A" else hooked))
    return {"wall": summarize([w for w, _ in a], [w for w, _ in b]),
            "cpu": summarize([c for _, c in a], [c for _, c in b])}


def summarize(a: list, b: list) -> dict:
    diffs = sorted(y - x for x, y in zip(a, b, strict=True))

    def pct(q: float) -> float:
        return diffs[min(len(diffs) - 1, int(q * len(diffs)))]

    return {"pairs": len(diffs), "without_ms": round(statistics.median(a) * 1e3, 2),
            "with_ms": round(statistics.median(b) * 1e3, 2),
            "cost_ms": round(statistics.median(diffs) * 1e3, 2),
            "cost_p10_ms": round(pct(0.1) * 1e3, 2), "cost_p90_ms": round(pct(0.9) * 1e3, 2)}


def hook_import_us(env: dict, runs: int) -> float:
    """Time inside the interpreter: ``-X importtime``'s cumulative time of the ``sitecustomize``
    import (with the hook: ours, and the one it chains to), median over ``runs``."""
    times = []
    for _ in range(runs):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env, check=True,
                             capture_output=True, text=True).stderr
        rows = [line.split("|") for line in err.splitlines() if line.startswith("import time:")]
        times.append(sum(int(row[1]) for row in rows if len(row) == 3 and row[2].strip() == "sitecustomize"))
    return statistics.median(times)


def main(argv: list | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--torch-pairs", type=int, default=10)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    results = {"python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as job_dir:
        for label, bytecode in (("idle, bytecode cached", None), ("idle, PYTHONDONTWRITEBYTECODE=1", "1")):
            base = dict(os.environ)
            base.pop("PYTHONDONTWRITEBYTECODE", None)
            if bytecode:
                base["PYTHONDONTWRITEBYTECODE"] = bytecode
            plain, hooked = environments(job_dir, base)
            results[label] = compare([sys.executable, "-c", "pass"], plain, hooked, args.pairs)
            results[label]["sitecustomize_us"] = hook_import_us(hooked, 21)
            results[label]["sitecustomize_without_us"] = hook_import_us(plain, 21)
            print(f"{label}: python -c pass\n{fmt(results[label])}", flush=True)
        if args.torch_pairs:
            plain, hooked = environments(job_dir)
            label = "imports torch, no group"
            results[label] = compare([sys.executable, "-c", "import torch"], plain, hooked, args.torch_pairs,
                                     warmup=1)
            print(f"{label}: python -c 'import torch'\n{fmt(results[label])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def fmt(result: dict) -> str:
    lines = []
    for what in ("wall", "cpu"):
        r = result[what]
        lines.append(f"  {what:4s} {r['without_ms']:7.1f} ms -> {r['with_ms']:7.1f} ms; the hook costs "
                     f"{r['cost_ms']:+.2f} ms (median of {r['pairs']} pairs; p10 {r['cost_p10_ms']:+.2f}, "
                     f"p90 {r['cost_p90_ms']:+.2f})")
    if "sitecustomize_us" in result:
        lines.append("  sitecustomize (-X importtime, cumulative, median): "
                     f"{result['sitecustomize_without_us']:.0f} us "
                     f"without the hook (this environment's own), {result['sitecustomize_us']:.0f} us with it "
                     "(ours, chaining to that one)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
