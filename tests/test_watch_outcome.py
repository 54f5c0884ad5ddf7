"""The watch's decisions on data: what a verdict does to the job (restarts), the exit status, peers
that never appeared, the line for a job with no rank; and the files of the launcher's attempts."""

from __future__ import annotations

import os
import socket

import pytest

from pytest_nccl.core import jobdir
from pytest_nccl.core.diagnosis import Diagnosis
from pytest_nccl.core.jobdir import RankInfo
from pytest_nccl.core.states import Kind, RankState, Reason
from pytest_nccl.watch.engine.monitor import Monitor
from pytest_nccl.watch.engine.outcome import (
    EXIT_DIAGNOSED,
    EXIT_DIAGNOSED_KEPT,
    Action,
    Attempt,
    Joining,
    Waits,
    attempt_of,
    exit_status,
    no_rank_line,
    on_verdict,
    peers_line,
    waited_for_peers,
)

DIED, HANG, RAISED, RANK_LEFT = Kind.DIED, Kind.HANG, Kind.RAISED, Kind.RANK_LEFT
SHAPE_MISMATCH, SLOW_RANK = Kind.SHAPE_MISMATCH, Kind.SLOW_RANK

FIRST_OF_TWO, LAST_OF_TWO, NO_RESTARTS = Attempt(0, 1), Attempt(1, 1), Attempt(0, 0)


@pytest.mark.parametrize("kind", [RAISED, DIED])
def test_a_failed_attempt_with_restarts_left_is_the_launchers_to_restart(kind):
    diag = Diagnosis(kind, "rank 1 raised ValueError")
    assert on_verdict(diag, FIRST_OF_TWO, keep_running=False) == Action.FOLLOW_NEXT_ATTEMPT
    assert on_verdict(diag, LAST_OF_TWO, keep_running=False) == Action.END_JOB
    assert on_verdict(diag, NO_RESTARTS, keep_running=True) == Action.KEEP_RUNNING


@pytest.mark.parametrize("kind", [HANG, SLOW_RANK, SHAPE_MISMATCH, RANK_LEFT])
def test_a_hang_or_desync_ends_the_job_whatever_restarts_are_left(kind):
    assert on_verdict(Diagnosis(kind, "..."), FIRST_OF_TWO, keep_running=False) == Action.END_JOB


def test_one_exit_status_per_outcome():
    for job_status in (0, 1, 3, 143):  # whoever ended the job, whatever the launcher said
        assert exit_status(verdict=True, kept_running=False, job_status=job_status) == EXIT_DIAGNOSED
        assert exit_status(verdict=True, kept_running=True, job_status=job_status) == EXIT_DIAGNOSED_KEPT
        assert exit_status(verdict=False, kept_running=False, job_status=job_status) == job_status


def test_attempt_of_the_ranks_records():
    assert attempt_of([]) == Attempt(0, 0) and not attempt_of([]).restartable
    infos = [RankInfo(attempt=1, max_restarts=2), RankInfo(attempt=1, max_restarts=2)]
    assert attempt_of(infos) == Attempt(1, 2) and attempt_of(infos).restartable
    assert attempt_of(infos).describe() == "attempt 2 of 3"
    assert not attempt_of([RankInfo(attempt=2, max_restarts=2)]).restartable


def test_peers_that_never_appeared():
    j0 = Joining(pid=10, since=100.0, rank=0, world=4, site="train.py:7")
    j2 = Joining(pid=12, since=101.0, rank=2, world=4, site="train.py:7")
    assert waited_for_peers([j0, j2], ranks_seen=0, now=129.9, timeout=30) == []
    assert waited_for_peers([j0, j2], ranks_seen=1, now=500.0, timeout=30) == []  # a group exists
    waiting = waited_for_peers([j2, j0], ranks_seen=0, now=130.0, timeout=30)
    assert waiting == [j0, j2]
    assert peers_line(waiting, 30) == (
        "peers never appeared: rank 0 (pid 10) (and 1 more) waited 30 s (--timeout) in init_process_group at "
        "train.py:7; ranks 1,3 of 4 never joined (a node or process that never started, or another "
        "MASTER_ADDR/MASTER_PORT)")
    agent = Joining(pid=5, since=0.0, rank=0, world=2, waits=Waits.RENDEZVOUS)
    assert peers_line([agent], 9) == (
        "peers never appeared: the launcher (pid 5) waited 9 s (--timeout) in its rendezvous as node 0 of 2; "
        "node 1 of 2 never joined (a node or process that never started, or another MASTER_ADDR/MASTER_PORT)")
    unknown = Joining(pid=7, since=0.0)
    assert "pid 7 waited 9 s (--timeout) in init_process_group (a node" in peers_line([unknown], 9)


def test_no_rank_line():
    assert no_rank_line(0).startswith("not a distributed job: no process of it imported torch")
    assert no_rank_line(1).startswith("no rank reported: 1 process imported torch, none created")
    assert no_rank_line(3).startswith("no rank reported: 3 processes imported torch")


def test_attempt_directories(tmp_path):
    d = str(tmp_path)
    assert jobdir.attempts(d) == [0] and jobdir.attempt_dir(d, 0) == d
    os.makedirs(jobdir.attempt_dir(d, 2))
    os.makedirs(os.path.join(d, "restart-x"))
    assert jobdir.attempts(d) == [0, 2] and jobdir.attempt_dir(d, 2) == os.path.join(d, "restart-2")
    env = {jobdir.ENV_RESTART: "2", jobdir.ENV_MAX_RESTARTS: "3"}
    assert jobdir.attempt_of(env) == 2 and jobdir.max_restarts_of(env) == 3
    assert jobdir.attempt_of({}) == 0 == jobdir.max_restarts_of({jobdir.ENV_MAX_RESTARTS: "x"})


def _vanished_ranks(d: str) -> None:
    """Two ranks that issued the same two collectives and are gone without an exit record."""
    for rank in (0, 1):
        jobdir.write_json(jobdir.rank_info(d, rank), {"rank": rank, "world": 2, "pid": 2 ** 22 + 7 + rank,
                                                      "start": 1, "host": socket.gethostname(), "backend": "gloo"})
        with open(jobdir.journal(d, rank), "w") as f:
            for seq in (1, 2):
                f.write(f"E\tdefault\t{seq}\tall_reduce\t0\t0.{seq}\t[2]\tfloat32\t{seq}\t/w/train.py:9\n"
                        f"C\tdefault\t{seq}\t0.{seq}5\n")


@pytest.mark.parametrize("launcher_ok", [True, False])
@pytest.mark.parametrize("seen_status", [None, 1 << 8])  # not seen; seen exiting with status 1
def test_ranks_that_vanished_with_a_successful_launcher_ended_with_the_job(tmp_path, launcher_ok, seen_status):
    """Ray ends its actors once the driver is done (SIGTERM, which its handler turns into status 1,
    or a quick exit from C++): no exit record. With the launcher's success that is the job's end;
    without it, ranks that died."""
    d = str(tmp_path)
    _vanished_ranks(d)
    monitor = Monitor(d, timeout=60.0)
    try:
        for i in range(5):
            monitor.poll(i * 0.05)
        for f in monitor.ranks.values():
            f.exit_code = seen_status
        finding = monitor.after_exit(1.0, launcher_ok=launcher_ok)
    finally:
        monitor.close()
    if launcher_ok:
        assert finding is None
    else:
        assert finding is not None and finding.reason == Reason.COMPLETED
        assert {v.status for v in finding.views} == {RankState.DEAD} and finding.diagnosis.kind == DIED


def test_ranks_that_came_and_went_before_the_first_scan_are_judged(tmp_path):
    """A job of a second can start and die between two of the watch's scans (a rank's gloo abort
    right after init): the journals it left are judged when the launcher returns, not ignored."""
    d = str(tmp_path)
    _vanished_ranks(d)
    monitor = Monitor(d, timeout=60.0)
    try:
        finding = monitor.after_exit(1.0, launcher_ok=False)  # no poll: the ranks were never seen alive
    finally:
        monitor.close()
    assert finding is not None and finding.diagnosis.kind == DIED
    assert sorted(monitor.ranks) == [0, 1]


def test_a_rank_whose_exit_record_comes_between_two_reads_is_judged_on_its_whole_journal(tmp_path, monkeypatch):
    """A rank writes its collective's completion, then its exit record; when both land between the
    watch's read of its journal and its look for the record, the record must not make its last
    collective look left pending: the other rank, still completing it, is not 'waiting for a finished
    rank' (a healthy job was ended as a hang this way under load)."""
    from pytest_nccl.core.reports import RankReport
    from pytest_nccl.watch.engine.follow import LocalRank

    d = str(tmp_path)
    for rank in (0, 1):
        jobdir.write_json(jobdir.rank_info(d, rank), {"rank": rank, "world": 2, "pid": os.getpid(),
                                                      "start": None, "host": socket.gethostname(), "backend": "gloo"})
        with open(jobdir.journal(d, rank), "w") as f:
            f.write("E\tdefault\t1\tall_reduce\t0\t0.1\t[2]\tfloat32\t1\t/w/train.py:9\n")
    original = LocalRank.exit_report

    def exit_report(source):
        if source.rank == 1 and not os.path.exists(jobdir.exit_record(d, 1)):
            with open(jobdir.journal(d, 1), "a") as f:   # what rank 1 wrote just before its record
                f.write("C\tdefault\t1\t0.15\n")
            with open(jobdir.exit_record(d, 1), "w") as f:
                f.write(RankReport(1, RankState.PASSED).to_json())
        return original(source)   # found in the same tick, after this tick's read of the journal

    monitor = Monitor(d, timeout=60.0)
    try:
        for i in range(3):
            assert monitor.poll(i * 0.05) is None      # both inside all_reduce #1
        monkeypatch.setattr(LocalRank, "exit_report", exit_report)
        reasons = [monitor.poll(0.2 + i * 0.05) for i in range(6)]
    finally:
        monitor.close()
    assert monitor.ranks[1].state == RankState.PASSED
    assert reasons == [None] * 6, reasons
