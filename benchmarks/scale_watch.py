"""The watch at scale (issue 39, item 5): a job of N simulated nodes on this one host, each node under
its own real ``pytest-nccl watch`` process, with the real channel between the watches.

Each node is ``python -m pytest_nccl watch --timeout T --json FILE -- python benchmarks/scale_node.py``:
the node process (standard library only, no torch) plays R ranks of that node and writes, in the
watch's job directory, what a real rank writes there (``rank-R.json``, the tracer's journal at a
stated rate of all_reduces per second per rank, the exit record). This script hosts the job's store
(a ``torch.distributed.TCPStore``, standing in for torchrun's agent store at MASTER_ADDR:MASTER_PORT):
the watches find each other through it as on a real cluster (the watch of rank 0's node hosts the
channel's store and announces it there; ``pytest_nccl/watch/channel.py``).

Measured, per node count N (``--nodes 2,8,32,128``), R ranks per node at a rate of collectives per
second per rank (``--ranks``, default 8; ``--rate``, default 50: what this host keeps up with at 54
nodes; each row states both, and the nodes' "late ticks" say whether they kept up):
- store calls per node per second over the channel, for the deciding watch (rank 0's node) and for
  the others (median, max): from each watch's ``PYTEST_NCCL_WATCH_STATS`` file (``<pid>.json`` at
  its exit: calls, bytes_out, bytes_in, seconds, decides), so averaged over the watch's life, its
  start included; "n/a" when the watch writes none (a watch without that hook);
- bytes per node per second over the channel during the healthy run's collectives: the kernel's
  counts of each watch's connections to the channel's store (``ss -tinp``), and what that store
  (in the deciding watch's process) served;
- CPU seconds per second of the deciding watch and the others' median (utime + stime of the watch
  process, ``/proc/PID/stat``, over the healthy run's collectives);
- the job store's own set/get latency p50/p99: a probe client doing set + get at ``--probe-hz``
  (200) during the healthy run, watched and unwatched (the same node processes without watches);
- the time from the stall to the verdict (the watch's "ending the job" line on stderr, from the
  moment the last node wrote the stall's last journal line), and the verdict itself (``--json``:
  kind, headline, ranks, verdict) for (a) a slow rank: the last rank of the last node stops before
  collective #k while every other rank enters #k and waits; (b) a cross-node shape mismatch: that
  rank enters #k with another shape; and (c) a healthy run: every watch must exit 0, verdict false.
Goals printed against: per-node traffic flat in N; the verdict right, the same on every node and
within --timeout + 5 s; the job store's p99 unchanged within noise.

Run:  .venv/bin/python benchmarks/scale_watch.py [--nodes 2,8,32,128] [--ranks 8 | --ranks 2=8,32=2]
      [--rate 50 | --rate 2=500,128=50] [--timeout 10] [--healthy-s 20] [--stall-after-s 5]
      [--scenarios baseline,healthy,slow,shape] [--max-nodes N] [--start-batch 4] [--watch-from REV]
      [--json FILE] [--keep DIR]
Each N costs 4 runs (unwatched baseline, healthy, slow, shape): 1-2 minutes each at 2 and 8 nodes,
3-5 at 32 and more. A node count whose watches do not fit in memory (a watch's RSS, measured on a
first job of 2 nodes, against 60% of MemAvailable: about 250 MB a node, so about 50 nodes on 24 GiB)
runs at the largest count that fits, and its row says so (``--max-nodes`` caps it further). The
watches start as on a cluster, where each imports torch on a host of its own: rank 0's node first,
then ``--start-batch`` (4) at a time once the ones before joined the channel; ``--start-batch 0``
starts all at once (on this host, tens of watches importing torch together take longer than the
watch's connect wait, and some never join). ``--watch-from REV`` runs the watches from a commit's
``pytest_nccl`` (``git archive``), to measure one version while the working tree changes, or to
compare two. ``--keep DIR`` keeps each run's logs, ``--json`` files and stats. Ctrl-C (or SIGTERM)
ends every process it started, by pid; nothing outlives it, and its temporary directories go.

What one host cannot measure: the N watches, N node processes and the store share this host's
cores (2 here): from about 16 nodes on the host is oversubscribed (each watch takes about 3% of a
core while the job runs), so times (CPU per second, latency, time to the verdict) are of a
loaded host, not of a node of a cluster, and a starved watch ticks less often, so its traffic is
then a lower bound; read counts and bytes per node, and their growth with N. 128 nodes do not fit in
24 GiB. The network is loopback (no latency, no bandwidth limit) and every watch's store client is
on the deciding watch's host. The ranks are simulated: their agents do not answer (no stacks nor
Flight Recorder progress in the report), and their collectives are paced on the wall clock, not
synchronized by a real collective.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

# The parts, each in this folder: scale_run.py (one job's processes, from start to end), scale_measure.py
# (what is measured: /proc, ss, the job store's probe, the watches' channel stats), scale_scenario.py (one
# scenario at one node count: run, measured, judged), scale_table.py (the table and the goals).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale_measure import mem_available_mb, rss_mb  # noqa: E402
from scale_run import REPO, Run, kill, tagged  # noqa: E402
from scale_scenario import run_one  # noqa: E402
from scale_table import goals, print_table  # noqa: E402

SCENARIOS = ("baseline", "healthy", "slow", "shape")


# -- the code the watches run ----------------------------------------------------------------------------

def package(args, root: str) -> tuple[str, str]:
    """(the directory the watches import pytest_nccl from, what code that is)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", REPO, *argv], capture_output=True, text=True).stdout.strip()
    if not args.watch_from:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "pytest_nccl")
        return REPO, f"the working tree at {git('rev-parse', '--short', 'HEAD')}" + (
            " (with uncommitted changes to pytest_nccl)" if dirty else "")
    commit = git("rev-parse", "--verify", f"{args.watch_from}^{{commit}}")
    if not commit:
        raise SystemExit(f"scale_watch: --watch-from {args.watch_from}: no such commit")
    into = os.path.join(root, "package")
    os.makedirs(into)
    archive = subprocess.Popen(["git", "-C", REPO, "archive", commit, "pytest_nccl"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", into], stdin=archive.stdout, check=True)
    archive.wait()
    return into, f"commit {commit[:10]} ({git('log', '-1', '--format=%s', commit)[:70]})"


# -- sizing: how many nodes fit ------------------------------------------------------------------------

def per_node_mb(calibration: dict | None) -> float | None:
    """Memory one simulated node takes: its watch (the largest seen), guardian and node process."""
    if not calibration:
        return None
    return calibration["watch_rss_mb"] + calibration["helpers_mb"]


def calibrate(args, root: str, tag: str, log) -> dict:
    """One watched job of 2 nodes, 1 rank each, a few seconds: each watch's RSS once its channel is up."""
    saved = args.healthy_s
    args.healthy_s = 4.0
    run = Run(args, root, 2, 1, 10.0, "healthy", tag)
    try:
        run.start(args.sync_wait, log)
        run.go_now(0.2)
        time.sleep(3.0)
        run.sample()
        helpers_mb = 0.0
        for pid, _ in run.nodes[0].helpers:
            helpers_mb += rss_mb(pid) or 0.0
        run.wait(time.time() + args.exit_wait)
        watch = max(node.rss_max for node in run.nodes)
    finally:
        run.close()
        shutil.rmtree(run.dir, ignore_errors=True)
        args.healthy_s = saved
    out = {"watch_rss_mb": round(watch, 1), "helpers_mb": round(max(helpers_mb, 20.0), 1)}
    log(f"  one watch: {out['watch_rss_mb']:.0f} MB RSS (its guardian and node process: {out['helpers_mb']:.0f} MB); "
        f"MemAvailable {mem_available_mb():.0f} MB")
    return out


def fitting(n: int, calibration: dict | None, max_nodes: int | None) -> int:
    fit = n
    each = per_node_mb(calibration)
    if each:
        fit = min(fit, max(2, int(0.6 * mem_available_mb() / each)))
    if max_nodes:
        fit = min(fit, max_nodes)
    return fit



# -- the arguments ----------------------------------------------------------------------------------------

def by_n(text: str, kind, name: str) -> dict:
    """"8" (every N) or "2=8,32=2" (per N; an N not named takes the value of the largest N named below
    it, else the smallest named)."""
    text = text.strip()
    if "=" not in text:
        return {None: kind(text)}
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        try:
            out[int(key)] = kind(value)
        except ValueError:
            raise SystemExit(f"scale_watch: --{name}: {item!r} is not N=VALUE") from None
    return out


def pick(table: dict, n: int):
    if None in table:
        return table[None]
    below = [k for k in table if k <= n]
    return table[max(below)] if below else table[min(table)]



# -- main -------------------------------------------------------------------------------------------------------

def parse(argv: list | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="2,8,32,128", help="node counts, comma-separated (default 2,8,32,128)")
    p.add_argument("--ranks", default="8", help="ranks per node: 8, or per node count: 2=8,32=2,128=1")
    p.add_argument("--rate", default="50", help="collectives per second per rank: 50, or per node count: 2=500,32=50")
    p.add_argument("--timeout", type=float, default=10.0, help="the watches' --timeout (default 10)")
    p.add_argument("--healthy-s", type=float, default=20.0, help="seconds of collectives in a healthy run (20)")
    p.add_argument("--stall-after-s", type=float, default=5.0, help="seconds of collectives before the stall (5)")
    p.add_argument("--probe-hz", type=float, default=200.0, help="set + get pairs per second on the job's store")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {','.join(SCENARIOS)}")
    p.add_argument("--max-nodes", type=int, help="run at most this many nodes (else: as many as fit in memory)")
    p.add_argument("--sync-wait", type=float, default=60.0,
                   help="how long the watches may take to reach the channel before the job starts, plus 2 s a node")
    p.add_argument("--verdict-wait", type=float, default=120.0,
                   help="slow, shape: how long after the stall the watches may take to give their verdict (120)")
    p.add_argument("--exit-wait", type=float, default=30.0,
                   help="how long the watches may take to exit, plus 0.5 s a node")
    p.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python") if os.path.exists(
        os.path.join(REPO, ".venv", "bin", "python")) else sys.executable, help="the interpreter of the watches")
    p.add_argument("--start-batch", type=int, default=4,
                   help="start the watches as on a cluster: rank 0's node first, then this many at a time, "
                        "each batch once the one before joined the channel (0: all at once; default 4)")
    p.add_argument("--watch-from", metavar="REV",
                   help="run the watches from this commit's pytest_nccl (git archive), not the working tree")
    p.add_argument("--debug", action="store_true",
                   help="the deciding watch writes its timeline (PYTEST_NCCL_WATCH_DEBUG) in its log (--keep)")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--keep", help="keep each run's logs, --json files and stats in this directory")
    args = p.parse_args(argv)
    args.node_counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    args.ranks_by = by_n(args.ranks, int, "ranks")
    args.rate_by = by_n(args.rate, float, "rate")
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    unknown = set(args.scenario_list) - set(SCENARIOS)
    if unknown or any(n < 2 for n in args.node_counts):
        p.error(f"unknown scenarios {sorted(unknown)}" if unknown else "a job has at least 2 nodes")
    return args


def main(argv: list | None = None) -> int:
    args = parse(argv)
    tag = uuid.uuid4().hex
    root = tempfile.mkdtemp(prefix="scale-watch-")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def on_signal(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    rows: list = []
    result = {"host": {"cores": os.cpu_count(), "mem_available_mb": round(mem_available_mb()),
                       "load": os.getloadavg()}, "args": {k: v for k, v in vars(args).items()
                                                        if k not in ("ranks_by", "rate_by")}, "rows": rows}
    code = 0
    try:
        args.package, result["watch_code"] = package(args, root)
        log(f"scale_watch: the watches run {result['watch_code']}")
        log(f"scale_watch: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; --timeout {args.timeout:g} s; "
            f"scenarios {','.join(args.scenario_list)}")
        calibration = calibrate(args, root, tag, log) if any(s != "baseline" for s in args.scenario_list) else None
        result["calibration"] = calibration
        for asked in args.node_counts:
            n = fitting(asked, calibration, args.max_nodes)
            ranks, rate = pick(args.ranks_by, asked), pick(args.rate_by, asked)
            log(f"{asked} nodes" + (f" (running {n}: what fits)" if n != asked else "") +
                f", {ranks} ranks each, {rate:g} collectives/s per rank")
            row = {"asked": asked, "nodes": n, "ranks": ranks, "rate": rate, "runs": {}}
            rows.append(row)
            for scenario in args.scenario_list:
                t0 = time.monotonic()
                r = run_one(args, root, n, ranks, rate, scenario, tag, log)
                row["runs"][scenario] = r
                log(f"  {scenario}: {'ok' if r.get('ok') else 'NOT ok'} ({time.monotonic() - t0:.0f} s, of them "
                    f"{r.get('start_s', 0):.0f} s to start the watches and reach the channel; load "
                    f"{os.getloadavg()[0]:.1f}; nodes' late ticks max {r.get('node_late_ticks_max')})")
        print()
        print(f"pytest-nccl watch at scale: simulated nodes on one host ({os.cpu_count()} cores), --timeout "
              f"{args.timeout:g} s, healthy run {args.healthy_s:g} s; the watches: {result['watch_code']}, started "
              + (f"{args.start_batch} at a time" if args.start_batch > 0 else "all at once"))
        print_table(rows)
        print()
        for line in goals(rows, args):
            print(f"goal: {line}")
        result["goals"] = goals(rows, args)
    except KeyboardInterrupt:
        log("scale_watch: interrupted; ending every process it started")
        code = 130
    finally:
        left = tagged(tag)
        for pid in left:
            kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1, default=str)
    return code


if __name__ == "__main__":
    sys.exit(main())
