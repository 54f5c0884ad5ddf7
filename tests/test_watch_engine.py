"""The watch's engine on its public surface (``engine.job.Engine``, ``FrontEnd``), with a front-end
that records what it is told: on journals written as a job's ranks write them."""

from __future__ import annotations

import os
import socket
import time

from pytest_nccl.core import jobdir
from pytest_nccl.core.states import Kind
from pytest_nccl.watch.engine.job import Ended, Engine


class Front:
    """A front-end that keeps what the engine says and asks."""

    def __init__(self):
        self.said, self.reports, self.ended = [], [], []

    def say(self, text):
        self.said.append(text)

    def report(self, finding, title=None, where=""):
        self.reports.append((finding, title, where))

    def end_job(self, finding):
        self.ended.append(finding)


def _ranks(d: str, ops: tuple, alive: bool, completed: bool) -> None:
    """Two ranks of one job, each entering collective #1 (``ops``: each rank's op)."""
    pid = os.getpid() if alive else 2 ** 22 + 7
    start = jobdir.process_start(pid) if alive else 1
    for rank, op in enumerate(ops):
        jobdir.write_json(jobdir.rank_info(d, rank), {"rank": rank, "world": 2, "pid": pid, "start": start,
                                                      "host": socket.gethostname(), "backend": "gloo"})
        with open(jobdir.journal(d, rank), "w") as f:
            f.write(f"E\tdefault\t1\t{op}\t0\t0.1\t[2]\tfloat32\t1\t/w/train.py:{9 + rank}\n")
            if completed:
                f.write("C\tdefault\t1\t0.15\n")


def test_a_mismatch_while_the_job_runs_is_reported_and_the_job_ended(tmp_path):
    d = str(tmp_path)
    _ranks(d, ("all_reduce", "barrier"), alive=True, completed=False)
    front = Front()
    engine = Engine(d, front, timeout=60.0)
    try:
        deadline = time.monotonic() + 30
        while not engine.tick(time.monotonic()):
            assert time.monotonic() < deadline, front.said
            time.sleep(max(0.0, min(0.05, engine.wake_at(time.monotonic()) - time.monotonic())))
    finally:
        engine.close()
    (finding, title, where), = front.reports
    assert finding.diagnosis.kind == Kind.OP_MISMATCH and title is None and where == ""
    assert front.ended == [finding] and engine.finding is finding and engine.ended_by_watch


def test_ranks_that_vanished_are_the_verdict_only_when_the_launcher_failed(tmp_path):
    d = str(tmp_path)
    _ranks(d, ("all_reduce", "all_reduce"), alive=False, completed=True)
    for status, how in ((0, Ended.NOTHING), (1, Ended.JOURNALS)):
        front = Front()
        engine = Engine(d, front, timeout=60.0)
        try:
            ending = engine.conclude(status)
        finally:
            engine.close()
        assert ending.how == how, (status, ending)
        assert (ending.finding is not None) == (status != 0) and not front.reports and not front.ended
