"""One scenario of ``scale_watch.py`` at one node count (the command, its options and its results: that
script's docstring): the job run (``scale_run.py``), measured while it runs (``scale_measure.py``), and
judged once it ended: the healthy run's traffic, CPU and job store latency; the verdict of a slow rank
or a shape mismatch, the time to it from the stall, and whether every watch agrees.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter

from scale_measure import channel_rates, cpu_seconds, median, socket_bytes, traffic, window_rates
from scale_run import Run

EXPECTED_KIND = {"slow": "slow-rank", "shape": "shape-mismatch"}


def run_one(args, root: str, n: int, ranks: int, rate: float, scenario: str, tag: str, log) -> dict:
    run = Run(args, root, n, ranks, rate, scenario, tag)
    out: dict = {"scenario": scenario, "nodes": n, "ranks_per_node": ranks, "rate": rate}
    t_begin = time.monotonic()
    try:
        ready, waited = run.start(args.sync_wait + 3.0 * n, log)
        out["watches_in_sync"], out["start_s"], out["watches_joined"] = ready, round(waited, 1), run.joined
        if not ready:
            log(f"    {scenario}: the watches not all joined and in sync after {waited:.0f} s "
                f"({run.joined} of {n} joined); going on")
        start = run.go_now()
        if scenario in ("baseline", "healthy"):
            while time.time() < start:
                time.sleep(0.01)
            run.probe.recording.set()
            cpu0 = {node.index: cpu_seconds(node.proc.pid) for node in run.nodes}
            net0 = socket_bytes(run.channel_port) if run.channel_port else {}
            t_cpu0 = time.monotonic()
            time.sleep(max(0.0, args.healthy_s - 0.3))   # the collectives' window, less the ends
            cpu1 = {node.index: cpu_seconds(node.proc.pid) for node in run.nodes}
            net1 = socket_bytes(run.channel_port) if run.channel_port else {}
            span = time.monotonic() - t_cpu0
            if run.channel_port:
                out["window"] = window_rates(run, traffic(net0, net1), span)
            run.probe.recording.clear()
            out["store"] = run.probe.summary()
            cpu = {i: (cpu1[i] - cpu0[i]) / span for i in cpu0 if cpu0[i] is not None and cpu1[i] is not None}
            out["cpu_per_s"] = {"deciding": cpu.get(0), "others_median": median([v for i, v in cpu.items() if i]),
                                "others_max": max([v for i, v in cpu.items() if i], default=None),
                                "what": "watch processes" if run.watched else "node processes"}
            run.wait(time.time() + args.exit_wait + 0.5 * n)
            ended = start + args.healthy_s   # the node processes' last lines and exit records
            exits = [node.exited_at - ended for node in run.nodes if node.exited_at is not None]
            out["exit_after_job_s"] = {"deciding": _round(run.nodes[0].exited_at - ended)
                                       if run.nodes[0].exited_at is not None else None,
                                       "median": _round(median(exits)), "max": _round(max(exits, default=None))}
        else:
            run.wait(start + args.stall_after_s + args.verdict_wait + args.exit_wait)
        out["wall_s"] = round(time.monotonic() - t_begin, 1)
    finally:
        run.close()
    reports = run.node_reports()
    out["node_late_ticks_max"] = max((r.get("late_ticks", 0) for r in reports), default=0)
    out["collectives"] = max((r.get("collectives", 0) for r in reports), default=0)
    codes = [node.proc.returncode for node in run.nodes]
    out["exit_codes"] = codes
    out["rss_mb"] = {"deciding": round(run.nodes[0].rss_max, 1),
                     "max": round(max(node.rss_max for node in run.nodes), 1)}
    if not run.watched:
        out["ok"] = all(c == 0 for c in codes)
        _cleanup_dir(run, args)
        return out
    out["channel"] = channel_rates(run)
    summaries = run.summaries()
    first = summaries[0] or {}
    out["verdict"] = {k: first.get(k) for k in ("verdict", "kind", "headline", "ranks", "exit_code")}
    out["verdicts_agree"] = None not in summaries and len({s.get("headline") for s in summaries}) == 1
    out["kinds"] = {str(k): v for k, v in Counter((s or {}).get("kind") for s in summaries).items()}
    out["summaries_missing"] = sum(s is None for s in summaries)
    last_rank = n * ranks - 1
    if scenario == "healthy":
        out["ok"] = all(c == 0 for c in codes) and all(s is not None and s.get("verdict") is False for s in summaries)
        bad = [i for i, (c, s) in enumerate(zip(codes, summaries, strict=True)) if c != 0 or not s or s.get("verdict")]
        out["bad_nodes"] = bad
        for i in bad[:2]:
            log(f"    healthy: node {i} exit {codes[i]}, verdict {(summaries[i] or {}).get('headline')!r}\n"
                + _indent(run.tail(i)))
    else:
        stalled = [r.get("stalled_at") for r in reports if r.get("stalled_at")]
        stall = max(stalled) if stalled else None
        out["stall_written_by_nodes"] = len(stalled)
        times = {node.index: node.verdict_at - stall for node in run.nodes
                 if node.verdict_at is not None and stall is not None}
        out["to_verdict_s"] = {"deciding": _round(times.get(0)),
                               "others_median": _round(median([t for i, t in times.items() if i])),
                               "others_max": _round(max([t for i, t in times.items() if i], default=None)),
                               "watches_with_verdict": len(times)}
        right = (first.get("verdict") is True and first.get("kind") == EXPECTED_KIND[scenario]
                 and last_rank in (first.get("ranks") or []))
        if scenario == "slow":
            right = right and first.get("ranks") == [last_rank]
        in_time = times.get(0) is not None and times[0] <= args.timeout + 5.0
        out["expected"] = {"kind": EXPECTED_KIND[scenario], "ranks": [last_rank], "collective": run.stall_at}
        out["right"], out["in_time"] = right, in_time
        out["all_exit_3"] = all(c == 3 for c in codes)
        out["ok"] = right and in_time and out["verdicts_agree"] and out["all_exit_3"]
        if not right:
            log(f"    {scenario}: deciding watch: exit {codes[0]}, {first.get('kind')} {first.get('ranks')}: "
                f"{first.get('headline')!r}\n" + _indent(run.tail(0)))
        if not out["verdicts_agree"]:
            log(f"    {scenario}: the watches' verdicts differ: {out['kinds']} (exit codes "
                f"{dict(Counter(codes))}); node {n - 1}: {(summaries[-1] or {}).get('headline')!r}")
    _cleanup_dir(run, args)
    return out


def _cleanup_dir(run: Run, args) -> None:
    if args.keep:
        dest = os.path.join(args.keep, os.path.basename(run.dir))
        shutil.copytree(run.dir, dest, ignore=shutil.ignore_patterns("jobdir-*"), dirs_exist_ok=True)
    shutil.rmtree(run.dir, ignore_errors=True)


def _round(value, digits: int = 1):
    return None if value is None else round(value, digits)


def _indent(text: str) -> str:
    return "".join(f"      | {line}\n" for line in text.rstrip("\n").splitlines())

