"""Soak: the watch's multi-node tests, SPMD mode's two-node test, the watch's healthy-job tests and
its jobs of two default worlds, run N rounds in a row with every core kept busy by load processes
this script starts and stops itself. A benchmark, not a timed test: it counts, it does not gate.

- a **false verdict**: a healthy job's test failed (the watch failed a clean job, or did not let it
  end untouched);
- a **flaky outcome**: a faulty job's test failed in some round and passed in another (its verdict
  changed); one that fails every round is counted apart (broken, not flaky).

Run:  python benchmarks/soak_watch.py [--rounds 20] [--load N] [--only TEXT] [--json FILE] [--keep DIR]
      [--gate] [--scale]
(``--only``: the tests whose id contains TEXT; ``--load``: busy processes, default one per core minus
one: with the tests themselves, every core is busy; ``--keep``: each round's JUnit file, with every
failure's whole text, kept in DIR; ``--scale``: the healthy jobs at scale too, ``SCALE``). Prints
one line per round, a healthy job's failure in full, and the counts at the end; exit status 0, or
with ``--gate`` (.ci/run) 1 when there was a false verdict (a healthy job failed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (pytest node id selection, healthy?)
HEALTHY = [
    "tests/test_watch_nodes.py::test_a_clean_job_on_two_nodes_passes_through_untouched",
    "tests/test_watch.py::test_clean_job_passes_through_untouched",
    "tests/test_watch_launchers.py::test_multiprocessing_ranks[good-mp-spawn]",
    "tests/test_watch_launchers.py::test_multiprocessing_ranks[good-mp-fork]",
    "tests/test_watch_worlds.py::test_two_healthy_worlds_pass_untouched",
    "tests/test_watch_worlds.py::test_ranks_outside_the_watch_are_unseen_never_not_started",
]
# healthy jobs at scale, with --scale: over CI's budget (16 nodes on one host: ~1.5 min a round)
SCALE = [
    "tests/test_watch_exit.py::test_a_healthy_job_of_16_one_rank_nodes_ends_with_exit_0_on_every_node",
]
FAULTY = [
    "tests/test_watch_nodes.py::test_a_slow_rank_on_the_other_node_is_named_by_both_watches",
    "tests/test_watch_nodes.py::test_a_shape_mismatch_across_nodes_names_every_rank_s_shape",
    "tests/test_watch_nodes.py::test_a_watch_alone_says_which_ranks_it_cannot_see",
    "tests/test_spmd.py::test_torchrun_two_nodes_one_rank_each",
    "tests/test_watch.py::test_every_rank_stuck_past_the_timeout",
    "tests/test_watch_worlds.py::test_another_world_is_judged_after_the_first_ended_clean",
]


def start_load(n: int) -> list:
    """``n`` processes that keep a core busy each (pure Python loops, no I/O)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(n)]


def stop_load(procs: list) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def one_round(tests: list, junit: str, env: dict) -> tuple[dict, float]:
    """test id -> (passed, its failure's text); the round's seconds."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                             *tests], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Ctrl-C works
    try:
        proc.wait()
    except KeyboardInterrupt:  # pytest ends its jobs on SIGINT (the watch's, the fork server's)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        raise
    elapsed = time.monotonic() - t0
    results: dict = {}
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return {t: (False, "no junit report") for t in tests}, elapsed
    for case in root.iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        test_id = f"{path}::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped") is not None
        message = f"{bad.get('message') or ''}\n{bad.text or ''}".strip() if bad is not None else ""
        results[test_id] = (bad is None and not skipped, "skipped" if skipped else message)
    return {t: results.get(t, (False, "not run")) for t in tests}, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--load", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--only", default="", help="only the tests whose id contains this text")
    parser.add_argument("--json", help="write the counts here")
    parser.add_argument("--keep", help="keep each round's JUnit file (failures in full) in this folder")
    parser.add_argument("--scale", action="store_true", help="also the healthy jobs at scale (SCALE)")
    parser.add_argument("--gate", action="store_true",
                        help="exit 1 on a false verdict: a healthy job failed (CI); else 0 always")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    healthy = [t for t in HEALTHY + (SCALE if args.scale else []) if args.only in t]
    faulty = [t for t in FAULTY if args.only in t]
    tests = healthy + faulty
    if not tests:
        parser.error(f"--only {args.only!r}: no test of the soak's has that in its id")
    history: dict = {t: [] for t in tests}
    times = []
    def interrupted(signum, frame):
        raise KeyboardInterrupt
    for sig in (signal.SIGTERM, signal.SIGINT):  # a background job starts with SIGINT ignored
        signal.signal(sig, interrupted)
    load = start_load(args.load)
    print(f"soak: {args.rounds} rounds of {len(tests)} tests ({len(healthy)} healthy jobs, {len(faulty)} faulty), "
          f"{args.load} load process(es) on {os.cpu_count()} cores", flush=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = args.keep or tmp
            os.makedirs(folder, exist_ok=True)
            for n in range(1, args.rounds + 1):
                results, elapsed = one_round(tests, os.path.join(folder, f"round{n}.xml"), env)
                times.append(elapsed)
                failed, said = 0, []
                for t, (ok, message) in results.items():
                    history[t].append(ok)
                    if not ok:
                        failed += 1
                        said.append(f"{t.split('::')[1]}: {(message.splitlines() or [''])[0][:200]}")
                    if not ok and t in healthy:  # a false verdict: what it said, whole (the last 60 lines)
                        said.append("\n    ".join(["", *message.splitlines()[-60:]]))
                print(f"round {n}: {elapsed:.0f} s, {failed} failed" + "".join(f"\n  {f}" for f in said), flush=True)
    except KeyboardInterrupt:
        print("soak: interrupted; counts of the rounds done", flush=True)
    finally:
        stop_load(load)
    rounds = len(times)
    false_verdicts = sum(not ok for t in healthy for ok in history[t])
    flaky = [t for t in faulty if any(history[t]) and not all(history[t])]
    broken = [t for t in faulty if history[t] and not any(history[t])]
    counts = {"rounds": rounds, "tests_per_round": len(tests), "load_processes": args.load,
              "false_verdicts": false_verdicts, "flaky_outcomes": len(flaky), "always_failing": broken,
              "flaky_tests": flaky, "per_test_passes": {t: sum(h) for t, h in history.items()},
              "round_seconds": [round(x) for x in times]}
    print(f"soak: {rounds} rounds; healthy jobs: {false_verdicts} false verdicts in {rounds * len(healthy)} runs; "
          f"faulty jobs: {len(flaky)} flaky outcomes, {len(broken)} failing every round, in "
          f"{rounds * len(faulty)} runs; a round took {min(times or [0]):.0f}-{max(times or [0]):.0f} s")
    for t, h in history.items():
        if not all(h):
            print(f"  {t}: passed {sum(h)} of {len(h)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(counts, f, indent=1)
    # the gate is the promise that a clean job is never failed; a faulty job's verdict that changes
    # under load (a cross-node mismatch judged before the other node's records came: less detail,
    # same kind) is counted and printed above, and each faulty test gates once in the test run
    return 1 if args.gate and false_verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
