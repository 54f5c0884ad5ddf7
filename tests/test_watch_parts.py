"""``pytest-nccl watch``'s parts on data: usage errors, the rolling bound on a fake view, the journal
followed by offset and across rotations, a long job's window. The real torchrun jobs under the
watch are in test_watch.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from collective_records import record
from watch_support import job_env

from pytest_nccl.core import jobdir
from pytest_nccl.core.journal import JournalTail
from pytest_nccl.core.referee import TIMING, Referee
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import RankState, Reason
from pytest_nccl.watch.engine import present
from pytest_nccl.watch.engine.follow import JournalFile
from pytest_nccl.watch.engine.monitor import Monitor
from pytest_nccl.watch.engine.window import KEEP
from pytest_nccl.watch.frontends.cli import EXIT_USAGE, main


def test_usage_errors_are_one_line(capsys):
    assert main([]) == EXIT_USAGE
    assert main(["--timeout", "0", "--", "true"]) == EXIT_USAGE
    assert main(["--bogus", "--", "true"]) == EXIT_USAGE
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 3 and all(e.startswith("pytest-nccl watch: error: ") for e in errors), errors
    assert "no command to watch" in errors[0] and "--timeout must be a positive" in errors[1]


def test_command_not_found(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest_nccl", "watch", "--", "no-such-launcher-xyz"],
                          capture_output=True, text=True, timeout=30, env=job_env("none"))
    assert proc.returncode == 127 and "command not found: no-such-launcher-xyz" in proc.stderr


class FakeView:
    def __init__(self, journals):
        self.journals_now, self.progress = journals, 0

    def journals(self):
        return self.journals_now

    def journal_sizes(self):
        return [self.progress]

    def flight_recorder_journals(self):
        return None


def _rec(rank, seq, state="completed"):
    return record(rank, seq, shapes="[2]", state=state, site="/w/train.py:9")


def test_rolling_bound_counts_a_stall_not_the_job():
    busy = FakeView({0: [_rec(0, 1)], 1: [_rec(1, 1)]})
    referee = Referee(2, bound=5.0, t0=0.0, rolling=True)
    for now in range(0, 60):  # progress every second: never a timeout
        busy.progress = now
        assert referee.step(float(now), busy) is None
    for now in range(60, 120):  # no progress, but nobody waits in a collective: busy, not stuck
        assert referee.step(float(now), busy) is None
    busy.journals_now[0].append(_rec(0, 2, state="entered"))  # rank 0 now waits, nothing moves
    busy.progress = -1
    steps = [round(120 + i * 0.01, 2) for i in range(1000)]
    timeout_at = next(now for now in steps if referee.step(now, busy) == Reason.TIMEOUT)
    assert 125 < timeout_at <= 125 + 2 * TIMING.poll  # seen waiting twice, a poll apart


def test_rolling_bound_ignores_a_collective_caught_completing():
    view = FakeView({0: [_rec(0, 1, state="entered")], 1: [_rec(1, 1)]})
    referee = Referee(2, bound=5.0, t0=0.0, rolling=True)
    assert referee.step(0.0, view) is None
    assert referee.step(5.0, view) is None          # at the deadline rank 0 seems to wait...
    view.journals_now[0][0].state = "completed"     # ...it was completing: the journal grows
    view.progress = 1
    assert referee.step(5.05, view) is None and referee.deadline == 10.05


def test_journal_tail_reads_a_growing_journal():
    text = ("E\tdefault\t1\tall_reduce\t0\t0.1\t[2]\tfloat32\t1\t/w/t.py:3\n"
            "C\tdefault\t1\t0.2\n"
            "E\tdefault\t2\tall_reduce\t1\t0.3\t[2]\tfloat32\t2\t/w/t.py:4\n"
            "W\tdefault\t2\t0.4\n").encode()
    tail = JournalTail(0)
    cut = text.index(b"\n") + 5
    first = tail.feed(text[:cut])   # the first line and a part of the next
    assert [r.seq for r in first] == [1] and first[0].state == "entered"
    second = tail.feed(text[cut:])
    assert first[0].state == "completed" and abs(first[0].duration - 0.1) < 1e-9
    assert [(r.seq, r.state, r.async_op) for r in second] == [(2, "waiting", True)]


def test_journal_is_followed_across_rotations(tmp_path):
    from pytest_nccl.watch.inrank.agent import rotate
    path = str(tmp_path / "journal-0.txt")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    reader = JournalFile(path)
    seen = b""
    for i in range(30):  # up to two rotations between two reads
        os.write(fd, f"line {i}\n".encode())
        if i % 5 == 4:
            rotate(path, fd)
        if i % 8 == 0:
            seen += reader.read()
    os.close(fd)
    for _ in range(3):
        seen += reader.read()
    assert seen.decode().splitlines() == [f"line {i}" for i in range(30)]
    assert os.path.getsize(path) < 8 * 8 and os.path.exists(path + ".1")  # the last segments only


def _journal_line(seq, state_done=True):
    line = f"E\tdefault\t{seq}\tall_reduce\t0\t{seq * 0.001:.6f}\t[2]\tfloat32\t{seq}\t/w/train.py:9\n"
    return line + (f"C\tdefault\t{seq}\t{seq * 0.001 + 0.0005:.6f}\n" if state_done else "")


def test_long_job_keeps_a_window_and_reports_the_ranks_own_numbers(tmp_path):
    """5000 collectives each, then rank 1 exits and rank 0 waits in #5001: the monitor keeps at
    most 2 * KEEP records per rank, and the headline still says #5001."""
    d = str(tmp_path)
    n = 5 * KEEP
    for rank in (0, 1):
        jobdir.write_json(jobdir.rank_info(d, rank), {"rank": rank, "world": 2, "pid": os.getpid(),
                                                      "start": jobdir.process_start(os.getpid()),
                                                      "host": socket.gethostname(), "backend": "gloo"})
        with open(jobdir.journal(d, rank), "w") as f:
            f.write("".join(_journal_line(s) for s in range(1, n + 1)))
    monitor = Monitor(d, timeout=60.0)
    try:
        for i in range(40):  # a few ticks: the journals are read a chunk a tick
            assert monitor.poll(i * 0.01) is None
        assert all(len(f.records) <= 2 * KEEP for f in monitor.ranks.values())
        with open(jobdir.journal(d, 0), "a") as f:
            f.write(_journal_line(n + 1, state_done=False))
        jobdir.write_text(jobdir.exit_record(d, 1), RankReport(1, RankState.PASSED).to_json())
        reason = None
        for i in range(40, 100):
            reason = monitor.poll(i * 0.01)
            if reason:
                break
        assert reason == Reason.DECIDED
        finding = monitor.conclude(reason, 1.0)
    finally:
        monitor.close()
    assert finding.views[1].status == RankState.PASSED
    assert present.headline(finding, 60.0) == (
        f"rank 1 exited normally after {n} collectives in group default; rank 0 waits in all_reduce "
        f"#{n + 1} of group default from /w/train.py:9")
    report = present.report_text(finding, 60.0)
    assert f"  ... {n - 2} matching collectives folded\n  #{n - 1} all_reduce [2]" in report, report
    assert f"\n>>#{n + 1} all_reduce [2] .." in report and f"at collective #{n + 1} of group default:" in report
    assert f"[{n + 1} collectives]" in report and f"[{n} collectives]" in report
    present.to_absolute(finding, 60.0)
    assert finding.diagnosis.seq == n + 1
    assert max(r.seq for r in finding.views[0].records) == n + 1
