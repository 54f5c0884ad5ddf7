"""A watched torchrun job ended by another hand says where each rank was: Ctrl-C, SIGTERM (Slurm's
time limit) and SIGHUP to the watch; SIGUSR1 (and ``pytest-nccl where``) asks where each rank is and
the job goes on; a rank its launcher ended after NCCL's watchdog aborted another says where it was.
Real signals to real processes: the watch, torchrun, its ranks."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from watch_support import JOBS, Running, free_port, line_in, run_watch, torchrun

JOB = JOBS / "endings_job.py"
RAY_JOB = JOBS / "ray_job.py"
SLEEP_LINE = line_in(JOB, "time.sleep(600)")
REDUCE_LINE = SLEEP_LINE + 1
# the promise is 2 s from the signal to the report; a loaded 2-core runner gets a margin
REPORT_WITHIN = 6.0


def launch_of(launcher: str, mode: str) -> list:
    """The job under ``launcher``: torchrun, accelerate's (``accelerate launch``), or mp.spawn in it."""
    if launcher in ("accelerate", "ray") and importlib.util.find_spec(launcher) is None:
        pytest.skip(f"{launcher} is not installed")
    if launcher == "accelerate":
        return [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", "--multi_gpu",
                "--num_processes", "2", "--main_process_port", str(free_port()), str(JOB), mode]
    if launcher == "mp.spawn":
        return [sys.executable, str(JOB), mode, "mp-spawn", str(free_port())]
    if launcher == "ray":  # Ray actors as ranks (ray.init starts the cluster), as verl and OpenRLHF run
        return [sys.executable, str(RAY_JOB), mode, str(free_port())]
    return torchrun(str(JOB), mode)


@pytest.mark.parametrize("sig, launcher", [(signal.SIGINT, "torchrun"), (signal.SIGTERM, "torchrun"),
                                           (signal.SIGHUP, "torchrun"), (signal.SIGTERM, "accelerate"),
                                           (signal.SIGINT, "mp.spawn"), (signal.SIGTERM, "ray")])
def test_a_signal_to_the_watch_says_where_each_rank_was_then_ends_the_job(tmp_path, sig, launcher):
    run = Running(tmp_path, launch_of(launcher, "sleeps"))
    run.wait_ready()
    sent = time.monotonic()
    run.proc.send_signal(sig)
    code = run.end()
    assert code == 128 + sig, run.text
    said = run.first("interrupted after ", after=sent)
    assert said is not None and said - sent < REPORT_WITHIN, run.text
    job, op = (RAY_JOB, "all_gather") if launcher == "ray" else (JOB, "all_reduce")
    sleep = line_in(job, "time.sleep(600)")
    assert f"({sig.name}): rank 1 is busy outside any collective at {job}:{sleep}: time.sleep(600), after 3 " \
           f"collectives in group default; rank 0 waits in {op} #4 of group default from {job}:" in run.text, run.text
    assert f"pytest-nccl watch: interrupted (exit {128 + sig}): interrupted after" in run.text, run.text
    summary = json.loads(run.summary.read_text())
    assert summary["interrupted"] == sig.name and not summary["verdict"] and summary["exit_code"] == 128 + sig
    assert summary["ranks"] == [1], summary


def test_slurms_sigterm_to_every_nodes_watch_gives_one_report_with_each_ranks_line(tmp_path):
    """Two one-rank nodes (torchrun's static rendezvous), a watch each, both signalled at once as
    Slurm's time limit does: the deciding watch asks the other node's rank too, and both print it."""
    port = free_port()
    nodes = []
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
        launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                  "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", str(JOB), "sleeps"]
        nodes.append(Running(tmp_path / f"node{node}", launch, ready=tmp_path / "ready"))
    nodes[0].wait_ready()
    sent = time.monotonic()
    for run in nodes:
        run.proc.send_signal(signal.SIGTERM)
    for run in nodes:
        assert run.end() == 128 + signal.SIGTERM, run.text
        said = run.first("interrupted after ", after=sent)
        assert said is not None and said - sent < REPORT_WITHIN + 5, run.text  # the other node's answers too
        assert f"(SIGTERM): rank 1 is busy outside any collective at {JOB}:{SLEEP_LINE}: time.sleep(600), after " \
               f"3 collectives in group default; rank 0 waits in all_reduce #4 of group default" in run.text, run.text


def test_sigusr1_says_where_each_rank_is_and_the_healthy_job_goes_on_untouched(tmp_path):
    run = Running(tmp_path, launch_of("torchrun", "healthy"), "--progress", "1")
    run.wait_ready(timeout=90.0)
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGUSR1)
    asked = subprocess.run([sys.executable, "-m", "pytest_nccl", "where", str(run.proc.pid)],
                           capture_output=True, text=True, timeout=30)
    code = run.end()
    assert code == 0, run.text  # the job's own status: nothing ended it
    said = run.first("where each rank is, ", after=sent)
    assert said is not None and said - sent < REPORT_WITHIN, run.text
    assert "  rank 0: " in run.text and "collectives, the last completed all_reduce #" in run.text, run.text
    assert asked.returncode == 0 and "where each rank is, " in asked.stdout, asked.stdout + asked.stderr
    assert "  rank 1: " in asked.stdout and f" of group default from {JOB}:" in asked.stdout, asked.stdout
    assert "progress at " in run.text and "ranks 0,1 running, " in run.text, run.text
    assert "=====" not in run.text and "interrupted" not in run.text, run.text
    summary = json.loads(run.summary.read_text())
    assert not summary["verdict"] and summary["interrupted"] is None and summary["exit_code"] == 0, summary


def test_a_rank_its_launcher_ended_after_nccls_watchdog_aborted_another_says_where_it_was(tmp_path):
    """The NCCL model's watchdog aborts rank 0 (5 s) in all_reduce #4; torchrun then ends rank 1 with
    SIGTERM while it sleeps before it: the verdict names rank 1's line, and rank 0's abort."""
    run = run_watch(tmp_path, torchrun(str(JOB), "watchdog"), "--timeout", "300",
                    ENDINGS_READY=str(tmp_path / "ready"))
    assert run.code == 3, run.text
    assert f"rank 1 killed by SIGTERM at {JOB}:{SLEEP_LINE}: time.sleep(600) after 3 collectives in " \
           f"group default; rank 0 waited in all_reduce #4 of group default from {JOB}:{REDUCE_LINE} " \
           "(enqueued, not completed) until it was killed by SIGABRT (NCCL's watchdog" in run.stderr, run.stderr
    assert f"rank 1: killed by SIGTERM at {JOB}:{SLEEP_LINE}: time.sleep(600)" in run.stderr, run.stderr


def test_a_rank_killed_by_sigkill_is_said_so_with_its_last_journaled_place(tmp_path):
    """SIGKILL (the OOM killer, kill -9) leaves no stack: the rank's last completed collective says
    where it was."""
    run = Running(tmp_path, launch_of("torchrun", "sleeps"))
    run.wait_ready()
    os.kill(int(Path(f"{run.ready}.1").read_text()), signal.SIGKILL)
    assert run.end() == 3, run.text
    # the signal's name only when the watch saw the process as a zombie (its launcher reaps it, not us)
    how = "killed by SIGKILL" if "rank 1 killed by SIGKILL" in run.text else \
        "ended without an exit record (killed by a signal, or os._exit)"
    assert f"rank 1 {how} after 3 collectives in group default, the last all_reduce #3 of group default from " \
           f"{JOB}:{line_in(JOB, 'for _ in range(3)') + 1}; rank 0 waits in all_reduce #4" in run.text, run.text


def test_where_without_a_watch_or_with_a_bad_argument_says_so_in_one_line(tmp_path):
    gone = subprocess.run([sys.executable, "-m", "pytest_nccl", "where", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr
    assert "is neither a pid nor the job directory of a running pytest-nccl watch" in gone.stderr
    both = subprocess.run([sys.executable, "-m", "pytest_nccl", "where", "1", "2"],
                          capture_output=True, text=True, timeout=30)
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "Traceback" not in both.stderr, both.stderr


ENDED_BY_SIGNAL = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from pytest_nccl.watch.inrank import endsignals
endsignals.install({directory!r}, 0)
if sys.argv[1] == "handler":  # the job's own handler, installed after ours: it still runs, ours first
    def handler(signum, frame):
        print("handled", signum, flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, handler)
if sys.argv[1] == "child":  # a forked child's end is not the rank's: it writes nothing
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    os.waitpid(pid, 0)
    sys.exit(0)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
"""


@pytest.mark.parametrize("how", ["default", "handler", "child"])
def test_sigterm_writes_the_ranks_stacks_and_keeps_the_signals_own_effect(tmp_path, how):
    script = tmp_path / "rank.py"
    script.write_text(ENDED_BY_SIGNAL.format(repo=str(Path(__file__).resolve().parents[1]), directory=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=60)
    stacks = (tmp_path / "signal-0-SIGTERM.txt").read_text()
    if how == "child":
        assert proc.returncode == 0 and stacks == "", (proc.returncode, stacks)
        return
    assert 'rank.py", line' in stacks and "in <module>" in stacks, stacks
    if how == "default":  # killed by SIGTERM, as without the watch
        assert proc.returncode == -signal.SIGTERM, proc
    else:
        assert proc.returncode == 7 and f"handled {int(signal.SIGTERM)}" in proc.stdout, proc
