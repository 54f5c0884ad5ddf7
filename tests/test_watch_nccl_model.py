"""``pytest-nccl watch`` over a job on the NCCL model (issue 38): a collective that returned and never
completed is what the rank waits for at its sync point, in the watch's verdict as in a test's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
from watch_support import JOBS, Running, line_in, run_watch, torchrun, untouched, verdict_ok

JOB = JOBS / "nccl_model_job.py"


def test_a_healthy_job_with_collectives_in_flight_passes_untouched(tmp_path):
    untouched(run_watch(tmp_path, torchrun(str(JOB), "good"), "--timeout", "20"))


def test_an_uneven_last_step_names_the_collective_the_rank_waits_for_at_its_sync_point(tmp_path):
    run = run_watch(tmp_path, torchrun(str(JOB), "uneven"), "--timeout", "20")
    verdict_ok(run, 20)
    # rank 1's 11 steps of 4 collectives; rank 0's 12th step's first bucket, waited, never completes
    assert (f"rank 1 exited normally after 44 collectives in group default; rank 0 waits for all_reduce #45 of "
            f"group default from {JOB}:{line_in(JOB, 'gradient buckets')} (enqueued, not completed) at "
            f"{JOB}:{line_in(JOB, '# the sync point')}: print(") in run.stderr, run.text
    # whatever torchrun wrote while it was being ended, the verdict is the watch's last line (issue 40)
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("pytest-nccl watch: verdict (exit 3): rank 1 exited normally after 44 collectives"), last


# One rank (NCCL refuses two on one GPU): on a GPU host real NCCL, else the model. The job's own
# NCCL watchdog (10 min) is far past the watch's bound.
SYNC_JOB = JOBS / "sync_point_job.py"
ON_GPU = torch.cuda.device_count() > 0
JOB_ENV = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")} if ON_GPU else {}


def test_a_healthy_job_whose_collectives_complete_after_they_return_passes_untouched(tmp_path):
    untouched(run_watch(tmp_path, torchrun(str(SYNC_JOB), "good", nproc=1), "--timeout", "8", **JOB_ENV), ranks=1)


def test_a_rank_blocked_at_its_sync_point_behind_a_long_kernel_is_named_at_the_bound(tmp_path):
    run = run_watch(tmp_path, torchrun(str(SYNC_JOB), "stuck", nproc=1), "--timeout", "8", **JOB_ENV)
    verdict_ok(run, 8)
    # step 6's all_reduce returned (the loop reached its sync point) and never completed
    loss = line_in(SYNC_JOB, "the step's loss")
    at = f"all_reduce #6 of group default from {SYNC_JOB}:{loss} (enqueued, not completed)"
    assert f"every rank is waiting for {at} and none completed within 8 s (--timeout) (every rank enqueued it" \
        in run.stderr, run.text
    assert f"rank 0: waits for {at} at {SYNC_JOB}:{line_in(SYNC_JOB, 'return t.item()')}" in run.stderr, run.text


def test_the_rank_behind_a_long_kernel_is_named_when_asked_and_when_ctrl_c_ends_the_watch(tmp_path):
    """Issue 45 on NCCL (on a GPU this job runs on real NCCL, else on the model): SIGUSR1 says the rank
    waits for the enqueued all_reduce at its sync point, the job going on; Ctrl-C then says the same
    as the report of an interrupted watch, before the job is ended."""
    loss, sync = line_in(SYNC_JOB, "the step's loss"), line_in(SYNC_JOB, "return t.item()")
    at = f"all_reduce #6 of group default from {SYNC_JOB}:{loss} (enqueued, not completed)"
    run = Running(tmp_path, torchrun(str(SYNC_JOB), "stuck", nproc=1), env=JOB_ENV)
    deadline = time.monotonic() + 90
    asked = ""
    while f"waits for {at}" not in asked:
        assert run.proc.poll() is None and time.monotonic() < deadline, f"{asked}\n{run.text}"
        time.sleep(1.0)
        where = subprocess.run([sys.executable, "-m", "pytest_nccl", "where", str(run.proc.pid)],
                               capture_output=True, text=True, timeout=30)
        asked = where.stdout
    assert f"rank 0: waits for {at} at {SYNC_JOB}:{sync}" in asked, asked
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    assert run.end() == 128 + signal.SIGINT, run.text
    said = run.first("interrupted after ", after=sent)
    assert said is not None and said - sent < 6.0, run.text
    assert f"(SIGINT): every rank is waiting for {at} and none completed within " in run.text, run.text
