"""One simulated node of a job for ``benchmarks/scale_watch.py``: R ranks of a job of N nodes, played by
this one process (standard library only, no torch), writing in ``$PYTEST_NCCL_WATCH_DIR`` the files
a real rank of a watched job writes there (``pytest_nccl/core/jobdir.py``):

- ``torch-PID`` (the start-up hook's marker: a process of the job imported torch);
- ``rank-R.json`` per rank (``RankInfo``: world N*R, local_world R, node, this process's pid and
  start, the job's store as MASTER_ADDR/MASTER_PORT, one run id for every node, attempt 0);
- ``journal-R.txt`` per rank, in the tracer's format (``core/journal.py``; no header line): an E line
  when the rank enters all_reduce #k of the default group, its C line when it completes. As the
  tracer does (``trace_core.enter``: the pending C line goes with the next E line), each rank writes
  "C #k-1" and "E #k" in one ``os.write``, so a rank always sits inside its latest collective;
- ``exit-R.json`` per rank at a clean end (``RankReport(rank, PASSED)``).

Collectives are paced on the wall clock from a start time every node shares (the go file): #k is
entered at ``start + (k - 1) / rate`` on every node, so the nodes' ranks stay in step as a real
job's do (a node the host's scheduler held back catches up in one write per rank). Writes are
batched per tick (``--tick``, 20 ms): the journal's content is the same as one write per collective.

Scenarios (``--scenario``):
- ``healthy``: ``--duration`` seconds of collectives, then the last C line, the exit records, exit 0;
- ``slow``: at collective ``--stall-at`` the last rank of the last node stops before it (its journal
  ends with the C line of the one before); every other rank enters it and waits there (E, no C);
- ``shape``: at ``--stall-at`` every rank enters it, the last rank of the last node with another
  shape, and all wait there.
Waiting ranks sleep until the watch ends the job (SIGTERM) or ``--hold`` seconds pass.

``--report FILE``: written when the stall's last line is written (``stalled_at``: time.time()), and at
the end (collectives written, ticks late), for the benchmark to time the verdict from the stall.

Run by scale_watch.py under ``python -m pytest_nccl watch ... -- python benchmarks/scale_node.py ...``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pytest_nccl.core import jobdir  # noqa: E402
from pytest_nccl.core.reports import RankReport  # noqa: E402  (stdlib-only modules)
from pytest_nccl.core.states import RankState  # noqa: E402

SITE = "/bench/train.py:42"     # the call site every rank's E line names
SHAPE, ODD_SHAPE = "[1024]", "[1025]"


def parse(argv: list | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--ranks", type=int, default=8, help="ranks of this node (each node the same)")
    p.add_argument("--rate", type=float, default=50.0, help="collectives per second per rank")
    p.add_argument("--store", required=True, help="the job's store, host:port (MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--run-id", default="bench")
    p.add_argument("--go", required=True, help="a file the benchmark writes with the shared start time")
    p.add_argument("--scenario", choices=("healthy", "slow", "shape"), default="healthy")
    p.add_argument("--duration", type=float, default=20.0, help="healthy: seconds of collectives")
    p.add_argument("--stall-at", type=int, default=0, help="slow, shape: the collective of the stall")
    p.add_argument("--hold", type=float, default=600.0, help="how long waiting ranks wait at most")
    p.add_argument("--tick", type=float, default=0.02)
    p.add_argument("--report", help="a JSON file: when the stall was written, and counts at the end")
    p.add_argument("--dir", default=os.environ.get(jobdir.ENV_DIR), help="default: $PYTEST_NCCL_WATCH_DIR")
    return p.parse_args(argv)


class Rank:
    """One simulated rank: its journal's descriptor and its clock (the tracer's ``t0``)."""

    def __init__(self, directory: str, rank: int, t0_ns: int):
        self.rank, self.t0_ns = rank, t0_ns
        self.fd = os.open(jobdir.journal(directory, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                          0o600)
        self.seq = 0  # the last collective entered

    def t(self) -> str:
        return f"{time.perf_counter_ns() - self.t0_ns}e-9"

    def enter_lines(self, upto: int, shape: str = SHAPE) -> bytes:
        """Complete the collective it is in and enter each next one up to #``upto``."""
        out = []
        t = self.t()
        for seq in range(self.seq + 1, upto + 1):
            if self.seq:
                out.append(f"C\tdefault\t{self.seq}\t{t}\n")
            out.append(f"E\tdefault\t{seq}\tall_reduce\t0\t{t}\t{shape if seq == upto else SHAPE}\tfloat32\t"
                       f"{seq}\t{SITE}\tred=SUM\n")
            self.seq = seq
        return "".join(out).encode()

    def complete_line(self) -> bytes:
        return f"C\tdefault\t{self.seq}\t{self.t()}\n".encode() if self.seq else b""

    def write(self, data: bytes) -> None:
        if data:
            os.write(self.fd, data)


def write_rank_files(args, directory: str) -> None:
    host, _, port = args.store.rpartition(":")
    pid = os.getpid()
    jobdir.touch(jobdir.torch_marker(directory, pid))
    world = args.nodes * args.ranks
    for local in range(args.ranks):
        rank = args.node * args.ranks + local
        jobdir.write_json(jobdir.rank_info(directory, rank), jobdir.RankInfo(
            rank=rank, world=world, local_rank=str(local), pid=pid, start=jobdir.process_start(pid),
            host=socket.gethostname(), backend="gloo", t0=time.time(), argv=["/bench/train.py"],
            attempt=0, max_restarts=0, local_world=str(args.ranks), node=str(args.node),
            master_addr=host, master_port=port, run_id=args.run_id).to_dict())


def wait_for_go(path: str) -> float:
    """The shared start time (time.time()), once the benchmark wrote it."""
    while True:
        data = jobdir.read_json(path)
        if data is not None and "start" in data:
            return float(data["start"])
        time.sleep(0.05)


def main(argv: list | None = None) -> int:
    args = parse(argv)
    directory = args.dir
    if not directory:
        print("scale_node: no $PYTEST_NCCL_WATCH_DIR (run under pytest-nccl watch, or give --dir)", file=sys.stderr)
        return 2
    os.makedirs(directory, exist_ok=True)
    t0_ns = time.perf_counter_ns()
    ranks = [Rank(directory, args.node * args.ranks + i, t0_ns) for i in range(args.ranks)]
    # the journal exists before rank-R.json, as with the real tracer (tracer.start, then the info)
    write_rank_files(args, directory)
    start = wait_for_go(args.go)
    last_node = args.node == args.nodes - 1
    odd = ranks[-1] if last_node else None        # the last rank of the last node
    stall = args.stall_at if args.scenario in ("slow", "shape") else 0
    end = start + args.duration
    late = 0
    report: dict = {"node": args.node, "pid": os.getpid()}
    while True:
        now = time.time()
        if now < start:
            time.sleep(min(args.tick, start - now))
            continue
        due = int((now - start) * args.rate) + 1     # collectives entered by now
        if stall and due >= stall:
            for r in ranks:
                if r is odd and args.scenario == "slow":
                    r.write(r.enter_lines(stall - 1) + r.complete_line())  # busy outside #stall
                else:
                    r.write(r.enter_lines(stall, ODD_SHAPE if r is odd else SHAPE))
            report["stalled_at"] = time.time()
            break
        if not stall and now >= end:
            due = int(args.duration * args.rate)
            for r in ranks:
                r.write(r.enter_lines(due) + r.complete_line())
            break
        for r in ranks:
            r.write(r.enter_lines(due))
        after = time.time()
        if after - now > args.tick:
            late += 1
        time.sleep(max(0.0, args.tick - (after - now)))
    report.update(collectives=ranks[0].seq, late_ticks=late)
    if args.report:
        jobdir.write_json(args.report, report)
    if stall:  # wait in the collective until the watch ends the job
        time.sleep(args.hold)
        return 1
    for r in ranks:
        jobdir.write_text(jobdir.exit_record(directory, r.rank), RankReport(r.rank, RankState.PASSED).to_json())
        os.close(r.fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
