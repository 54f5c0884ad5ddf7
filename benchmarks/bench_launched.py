"""What following the ranks tests start themselves (launched.py) costs tests that start none: whole
pytest sessions of ``--tests`` trivial tests, with it (``--nccl-adopt=on``, the default) and without
(``--nccl-adopt=off``), in A/B pairs whose order alternates, one fresh pytest per run: wall time and
the session's CPU time (user + system from wait4: the helper process, which pytest waits for at its
end, included). The pairs' differences, divided by the number of tests, give the cost per test
(the session's fixed part, the helper's start, spread over them); with ``--tests 1`` the session's
fixed cost itself.

Run: python benchmarks/bench_launched.py [--pairs 10] [--tests 500] [--json FILE]
No assertion: a benchmark reports, it does not gate (target: nothing measurable per test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_watch_startup import order, run, summarize  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_module(n: int) -> str:
    return "\n".join(f"def test_{i}():\n    assert {i} == {i}\n" for i in range(n))


def compare(directory: str, tests: int, pairs: int) -> dict:
    with open(os.path.join(directory, "test_trivial.py"), "w") as f:
        f.write(test_module(tests))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTEST_ADDOPTS", None)

    def argv(side: str) -> list:
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={directory}",
                f"--nccl-adopt={'off' if side == 'A' else 'on'}", os.path.join(directory, "test_trivial.py")]

    run(argv("A"), env)
    run(argv("B"), env)
    a, b = [], []
    for side in order(pairs):
        (a if side == "A" else b).append(run(argv(side), env))
    return {"tests": tests, "wall": summarize([w for w, _ in a], [w for w, _ in b]),
            "cpu": summarize([c for _, c in a], [c for _, c in b])}


def main(argv: list | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-launched-") as directory:
        for tests in sorted({1, args.tests}):
            r = results[f"{tests} tests"] = compare(directory, tests, args.pairs)
            for what in ("wall", "cpu"):
                s = r[what]
                print(f"{tests} trivial tests, {what}: {s['without_ms']:.0f} ms off -> {s['with_ms']:.0f} ms on; "
                      f"on costs {s['cost_ms']:+.1f} ms per session (median of {s['pairs']} pairs; p10 "
                      f"{s['cost_p10_ms']:+.1f}, p90 {s['cost_p90_ms']:+.1f}), "
                      f"{s['cost_ms'] * 1e3 / tests:+.1f} us per test", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
