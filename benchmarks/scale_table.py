"""What ``scale_watch.py`` prints at the end (the command, its options and its results: that script's
docstring): the table, a row per node count, its legend, and the goals, each MET or NOT MET.
"""

from __future__ import annotations

import sys


def fmt(value, spec: str = ".0f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def row_cells(row: dict) -> list[str]:
    runs = row["runs"]
    healthy, base = runs.get("healthy", {}), runs.get("baseline", {})
    ch, win = healthy.get("channel", {}), healthy.get("window")
    cells = [f"{row['asked']}" + (f"->{row['nodes']}" if row["nodes"] != row["asked"] else ""),
             str(row["ranks"]), fmt(row["rate"], "g")]
    if ch.get("available"):
        d, o = ch["deciding"] or {}, ch["others"]["calls_s"]
        cells += [fmt(d.get("calls_s")), f"{fmt(o['median'])}/{fmt(o['max'])}"]
    else:
        cells += ["n/a", "n/a"]
    if win:
        d, o = win["deciding"], win["others"]
        cells += [fmt(_kb(d.get("bytes_s")), ".1f"), f"{fmt(_kb(o['median']), '.1f')}/{fmt(_kb(o['max']), '.1f')}",
                  fmt(_kb(d.get("store_serves_bytes_s")), ".1f")]
    else:
        cells += ["n/a"] * 3
    cpu = healthy.get("cpu_per_s", {})
    cells += [fmt(cpu.get("deciding"), ".3f"), fmt(cpu.get("others_median"), ".3f")]
    s0, s1 = base.get("store", {}), healthy.get("store", {})
    cells += [f"{fmt(s0.get('set_p50_ms'), '.2f')}/{fmt(s0.get('set_p99_ms'), '.2f')}",
              f"{fmt(s1.get('set_p50_ms'), '.2f')}/{fmt(s1.get('set_p99_ms'), '.2f')}",
              f"{fmt(s0.get('get_p99_ms'), '.2f')}->{fmt(s1.get('get_p99_ms'), '.2f')}"]
    if "healthy" in runs:
        bad = healthy.get("bad_nodes", [])
        cells.append("ok" if healthy.get("ok") else f"FAIL({len(bad)})")
    else:
        cells.append("-")
    for scenario in ("slow", "shape"):
        r = runs.get(scenario)
        if r is None:
            cells.append("-")
            continue
        v = r.get("verdict", {})
        t = r.get("to_verdict_s", {}).get("deciding")
        mark = "ok" if r.get("ok") else ("WRONG" if not r.get("right") else "LATE" if not r.get("in_time") else "FAIL")
        cells.append(f"{v.get('kind') or 'none'} {v.get('ranks') or ''} {fmt(t, '.1f')}s {mark}")
    return cells


def _kb(value):
    return None if value is None else value / 1e3


HEADER = ["nodes", "R", "rate", "calls/s dec", "calls/s oth med/max", "kB/s dec", "kB/s oth med/max",
          "store kB/s", "CPU dec", "CPU oth", "job store set p50/p99 ms: unwatched", "watched", "get p99 ms",
          "healthy", "slow rank: verdict, s", "shape mismatch: verdict, s"]
LEGEND = """\
  nodes: asked->run (what fits); R: ranks per node; rate: collectives/s per rank
  calls/s: store calls per second of the watch's channel life (its PYTEST_NCCL_WATCH_STATS file; n/a: none
    written), deciding watch (dec) and the others (oth, median/max)
  kB/s: bytes sent + received on the watch's connections to the channel's store during the healthy run's
    collectives (ss, the kernel's counts); store kB/s: what the deciding watch's store served (every node)
  CPU: the watch process's CPU seconds per second during the healthy run's collectives
  job store: the probe's set and get latency on the job's own store, unwatched run vs watched run
  healthy: every watch exit 0 with verdict false; verdicts: the deciding watch's --json kind and ranks,
    seconds from the stall's last journal line to its "ending the job" line; ok = right, the same on every
    node, every watch exit 3, within --timeout + 5 s"""


def print_table(rows: list, out=sys.stdout) -> None:
    table = [HEADER] + [row_cells(r) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    print(LEGEND, file=out)


def _growth(rows: list, value) -> tuple | None:
    """(first N, last N, ratio of ``value`` between them) over the rows that have it."""
    have = [(r["nodes"], value(r)) for r in rows]
    have = [(n, v) for n, v in have if v]
    if len(have) < 2 or have[0][0] == have[-1][0]:
        return None
    return have[0][0], have[-1][0], have[-1][1] / have[0][1]


def goals(rows: list, args) -> list[str]:
    out = []
    def others(r, key, field):
        src = r["runs"].get("healthy", {}).get(key) or {}
        if key == "channel":
            return src.get("others", {}).get("calls_s", {}).get("median") if src.get("available") else None
        return src.get("others", {}).get(field)
    calls = _growth(rows, lambda r: others(r, "channel", None))
    moved = _growth(rows, lambda r: others(r, "window", "median"))
    if calls or moved:
        parts, met = [], True
        for what, g in (("store calls/s (life)", calls), ("bytes/s (window)", moved)):
            if g:
                parts.append(f"{what} x{g[2]:.1f} from {g[0]} to {g[1]} nodes (nodes x{g[1] / g[0]:g})")
                met = met and g[2] < 1.5
        out.append(f"per-node traffic flat in N (a non-deciding watch, median; flat: < 1.5x): "
                   f"{'MET' if met else 'NOT MET'}: " + "; ".join(parts))
    else:
        out.append("per-node traffic flat in N: n/a (fewer than two node counts with a measured channel)")
    for scenario, what in (("slow", "slow rank"), ("shape", "cross-node shape mismatch")):
        cases = [(r["nodes"], r["runs"][scenario]) for r in rows if scenario in r["runs"]]
        if not cases:
            continue
        bad = [f"{n} nodes: {c.get('verdict', {}).get('kind')} {c.get('verdict', {}).get('ranks')} in "
               f"{fmt(c.get('to_verdict_s', {}).get('deciding'), '.1f')} s"
               f"{'' if c.get('verdicts_agree') else ', the watches disagree'}"
               f"{'' if c.get('all_exit_3') else ', exit codes ' + str(sorted(set(c.get('exit_codes', []))))}"
               for n, c in cases if not c.get("ok")]
        out.append(f"{what}: verdict right and within --timeout + 5 s ({args.timeout + 5:g} s), the same on "
                   f"every node: {'MET' if not bad else 'NOT MET: ' + '; '.join(bad)}")
    cases = [(r["nodes"], r["runs"]["healthy"]) for r in rows if "healthy" in r["runs"]]
    if cases:
        bad = [f"{n} nodes: {len(c.get('bad_nodes', []))} watches not exit 0 or with a verdict"
               for n, c in cases if not c.get("ok")]
        out.append("healthy run: every watch exit 0, verdict false: "
                   + ("MET" if not bad else "NOT MET: " + "; ".join(bad)))
    pairs = [(r["nodes"], r["runs"]["baseline"].get("store", {}), r["runs"]["healthy"].get("store", {}))
             for r in rows if "baseline" in r["runs"] and "healthy" in r["runs"]]
    if pairs:
        parts, met = [], True
        for n, b, w in pairs:
            for op in ("set", "get"):
                p0, p1 = b.get(f"{op}_p99_ms"), w.get(f"{op}_p99_ms")
                if p0 is None or p1 is None:
                    met = False
                    continue
                # within noise: at most 1.5x, or 1 ms more (a loaded host's scheduler quantum)
                if p1 > max(1.5 * p0, p0 + 1.0):
                    met = False
                parts.append(f"{n} nodes {op} {p0:.2f}->{p1:.2f} ms")
        out.append(f"job store p99 unchanged within noise (<= 1.5x or +1 ms): {'MET' if met else 'NOT MET'}: "
                   + ", ".join(parts))
    return out

