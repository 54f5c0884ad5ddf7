"""``pytest-nccl explain`` against torch's own Flight Recorder analyzer (``fr_trace``) on synthesized NCCL dumps
of large jobs: whole processes, wall time and peak RSS.

For each world size (default 128, 1024, 4096 ranks; TP groups of 8, 2,000 entries per rank, scenario tp_skip)
the dumps are generated once (benchmarks/fr_synth.py) into a temporary directory, then the two commands run in
turn, A B A B ... (``--pairs`` pairs; pairing keeps their comparison fair while the machine's speed drifts):

    A  python -m pytest_nccl explain DIR
    B  python -m torch.distributed.flight_recorder.fr_trace DIR --prefix nccl_trace_rank_

Each run is timed from its start to its exit (``time.perf_counter``) and its peak RSS is the kernel's
``ru_maxrss`` of the reaped child (``os.wait4``): the largest resident set of that process; its CPU seconds
(user + system, same accounting) are printed with each run, a check on a loaded machine. A run past
``--cap`` seconds is killed and shown as "> cap" (fr_trace's matching is quadratic in the ranks; at 4,096 it
may take very long); a command that failed once (or hit the cap) is not run again for that size. explain exits
0 or 3 (no rank diverges / one does); fr_trace exits 0. Their output goes to a log file next to the dumps.
fr_trace holds every entry of every rank as Python objects (about 1.7 KB each over a ~250 MB base, measured
on torch 2.13): a command whose peak at the previous size, scaled by the number of entries, would exceed
``--max-rss-gb`` (default: 60% of the memory available at start) is not run at the next size ("> mem").

Prints per-run figures as they come, then a Markdown table of the medians::

    | ranks | files MB | explain s | explain MB | fr_trace s | fr_trace MB |

Run it niced on a shared machine (``--nice``, default 10) and say that the timings were taken under load.
``--only explain`` / ``--only fr_trace`` runs one side; ``--keep`` keeps the dumps (their path is printed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fr_synth  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Command:
    name: str
    argv: list[str]
    ok: tuple[int, ...] = (0,)


@dataclass
class Run:
    wall: float | None          # None: killed at the cap
    rss_mb: float | None
    rc: int | None
    cpu: float = 0.0            # user + system seconds of the process (and what it waited for)


@dataclass
class Side:
    command: Command
    runs: list[Run] = field(default_factory=list)
    failed: str = ""            # why it is not run again for this size

    def cell(self) -> tuple[str, str]:
        done = [r for r in self.runs if r.wall is not None and r.rc in self.command.ok]
        if self.failed and not done:
            return self.failed, "-"
        if not done:
            return "-", "-"
        return (f"{statistics.median(r.wall for r in done):.1f}",
                f"{statistics.median(r.rss_mb for r in done):.0f}")


def run_once(cmd: Command, log_path: str, cap: float, cwd: str = REPO) -> Run:
    """``cmd`` as one whole process in a session of its own; killed (with anything it started) at ``cap`` s."""
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(cmd.argv)}\n".encode())
        log.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = start + cap
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    wall = time.perf_counter() - start
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    return Run(wall, usage.ru_maxrss / 1024.0, proc.returncode, usage.ru_utime + usage.ru_stime)
                if time.perf_counter() >= deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    _, _, usage = os.wait4(proc.pid, 0)
                    proc.returncode = -9
                    return Run(None, usage.ru_maxrss / 1024.0, None, usage.ru_utime + usage.ru_stime)
                time.sleep(0.02)
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            raise


def commands(dump_dir: str, prefix: str) -> dict[str, Command]:
    return {
        "explain": Command("explain", [sys.executable, "-m", "pytest_nccl", "explain", dump_dir], ok=(0, 3)),
        "fr_trace": Command("fr_trace", [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                                         dump_dir, "--prefix", prefix]),
    }


def mem_available_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return 0.0


def projected_gb(side: Side, scale: float) -> float:
    """The side's median peak so far (GB), scaled; 0 when it has none."""
    peaks = [r.rss_mb for r in side.runs if r.rss_mb]
    return statistics.median(peaks) / 1024 * scale if peaks else 0.0


def measure(sides: list[Side], pairs: int, cap: float, log_path: str, out=sys.stdout) -> None:
    """Run the sides in turn, ``pairs`` times: A B A B ...; a side that failed or hit the cap stops."""
    for i in range(pairs):
        for side in sides:
            if side.failed:
                continue
            run = run_once(side.command, log_path, cap)
            side.runs.append(run)
            if run.wall is None:
                side.failed = f"> {cap:.0f}"
                print(f"  {side.command.name} run {i + 1}: > cap ({cap:.0f} s; {run.cpu:.1f} s CPU), "
                      f"peak {run.rss_mb:.0f} MB at the kill", file=out, flush=True)
                continue
            print(f"  {side.command.name} run {i + 1}: {run.wall:.2f} s ({run.cpu:.1f} s CPU), "
                  f"peak {run.rss_mb:.0f} MB, exit {run.rc}", file=out, flush=True)
            if run.rc not in side.command.ok:
                side.failed = f"failed (exit {run.rc})"


def table(rows: list[dict]) -> str:
    lines = ["| ranks | files MB | explain s | explain MB | fr_trace s | fr_trace MB |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['files_mb']:.0f} | {r['explain'][0]} | {r['explain'][1]} | "
                     f"{r['fr_trace'][0]} | {r['fr_trace'][1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--scenario", choices=fr_synth.SCENARIOS, default="tp_skip")
    ap.add_argument("--version", choices=fr_synth.VERSIONS, default="2.10")
    ap.add_argument("--prefix", default="nccl_trace_rank_")
    ap.add_argument("--pairs", type=int, default=2, help="A B pairs per size (default 2)")
    ap.add_argument("--cap", type=float, default=600.0, help="seconds a run may take (default 600)")
    ap.add_argument("--only", choices=("explain", "fr_trace"), default=None)
    ap.add_argument("--workdir", default=None, help="where the dumps go (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the dumps")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=None, help="processes that write the dumps")
    ap.add_argument("--max-rss-gb", type=float, default=None,
                    help="skip a command projected past this peak (default: 60%% of MemAvailable)")
    a = ap.parse_args(argv)
    if a.nice:
        os.nice(a.nice)
    work = a.workdir or tempfile.mkdtemp(prefix="bench_explain_")
    os.makedirs(work, exist_ok=True)
    max_gb = a.max_rss_gb if a.max_rss_gb is not None else 0.6 * mem_available_gb()
    rows = []
    previous: dict[str, Side] = {}
    previous_ranks = 0
    try:
        for n in a.ranks:
            dump_dir = os.path.join(work, f"ranks_{n}")
            shutil.rmtree(dump_dir, ignore_errors=True)
            t = time.perf_counter()
            made = fr_synth.generate(dump_dir, jobs=a.jobs, ranks=n, tp=a.tp, entries=a.entries,
                                     scenario=a.scenario, version=a.version, prefix=a.prefix)
            files_mb = made["bytes"] / 1e6
            print(f"{n} ranks: {made['files']} dumps, {files_mb:.0f} MB, generated in {time.perf_counter() - t:.1f} s "
                  f"({dump_dir})", flush=True)
            cmds = commands(dump_dir, a.prefix)
            names = [a.only] if a.only else ["explain", "fr_trace"]
            sides = {name: Side(cmds[name]) for name in names}
            for name, side in sides.items():
                before = previous.get(name)
                if before is not None and before.failed.startswith(">") and n > previous_ranks:
                    side.failed = before.failed  # past the cap or the memory already at a smaller size
                    print(f"  {name}: not run ({before.failed} at {previous_ranks} ranks)", flush=True)
                    continue
                gb = projected_gb(before, n / previous_ranks) if before is not None else 0.0
                if max_gb and gb > max_gb:
                    side.failed = "> mem"
                    print(f"  {name}: not run, projected peak {gb:.1f} GB > {max_gb:.1f} GB", flush=True)
            measure(list(sides.values()), a.pairs, a.cap, os.path.join(work, f"ranks_{n}.log"))
            previous, previous_ranks = sides, n
            rows.append({"ranks": n, "files_mb": files_mb,
                         "explain": sides["explain"].cell() if "explain" in sides else ("-", "-"),
                         "fr_trace": sides["fr_trace"].cell() if "fr_trace" in sides else ("-", "-")})
            if not a.keep:
                shutil.rmtree(dump_dir, ignore_errors=True)
    finally:
        if rows:
            print()
            print(table(rows))
        if a.keep or a.workdir:
            print(f"\ndumps and logs: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
