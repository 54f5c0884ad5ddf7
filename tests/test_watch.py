"""``pytest-nccl watch``: real torchrun jobs (gloo, world 2) under the watch (its parts on data:
test_watch_parts.py).

Each job scenario is a real ``python -m torch.distributed.run`` run of a small training script,
bounded in time; afterwards no process carrying the run's tag (through the environment, which the
launcher and the ranks inherit) may be alive."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import assert_no_leftovers, line_of
from watch_support import Watched, free_port, job_env

from pytest_nccl.watch.engine.outcome import EXIT_DIAGNOSED_KEPT
from pytest_nccl.watch.frontends.cli import EXIT_DIAGNOSED

REPO = Path(__file__).resolve().parents[1]
JOB_TIMEOUT = 90  # one watched job; longer is itself a hang

TRAIN = """
import atexit, datetime, os, subprocess, sys, time
import torch
import torch.distributed as dist

case = sys.argv[1]
if case in ("left", "keep", "raise") and os.environ["RANK"] == "1":
    # gloo tells rank 0 at once when rank 1's process is gone (NCCL would let it wait for good):
    # rank 1 lingers at exit, after its exit record, so that the watch finds it, not gloo
    atexit.register(time.sleep, 3)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "120"))))
rank = dist.get_rank()
t = torch.ones(2)
for step in range(3):
    dist.all_reduce(t)  # the training loop
print(f"rank {rank} trained", flush=True)
if case == "clean":
    import sitecustomize
    chained = getattr(sitecustomize, "USER_MARK", None)
    loaded = "import sys; print(sorted(m for m in sys.modules if m.startswith(('pytest_nccl', 'torch'))))"
    child = subprocess.run([sys.executable, "-c", loaded],
                           env={k: v for k, v in os.environ.items() if k != "RANK"}, capture_output=True, text=True)
    print(f"rank {rank}: result {t.tolist()} traced {getattr(dist.all_reduce, '_pytest_nccl_traced', False)} "
          f"chained {chained} child {child.stdout.strip()}", flush=True)
    dist.destroy_process_group()
elif case == "left":
    if rank == 1:
        sys.exit(0)
    dist.all_reduce(t)  # rank 0 waits here
elif case == "raise":
    if rank == 1:
        raise ValueError("corrupt sample")  # rank 1 raises
    dist.all_reduce(t)  # rank 0 waits here too
elif case == "shape":
    dist.all_reduce(torch.ones(4 if rank else 1))  # the mismatch
    dist.all_reduce(t)
elif case == "hang":
    dist.recv(torch.zeros(1), src=1 - rank)  # each rank waits for the other
elif case == "slow":
    if rank == 1:
        time.sleep(300)  # the slow rank
    dist.all_reduce(t)  # rank 0 waits for it
elif case == "keep":
    if rank == 0:
        try:
            dist.all_reduce(t)  # rank 1 never comes
        except Exception as exc:
            print(f"rank 0 gave up on its own: {type(exc).__name__}", flush=True)
"""

DDP = """
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 4))
for step in range(60):
    if step == 5 and rank == 1 and sys.argv[1] == "slow":
        time.sleep(300)  # the slow rank
    model(torch.randn(8, 4)).sum().backward()  # the reducer's all_reduce, issued from C++
    time.sleep(0.01)
    if step == 30:
        time.sleep(4)  # every rank busy: an evaluation, longer than --timeout
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""

USER_SITECUSTOMIZE = """
import os, sys
sys.stderr.write(f"user sitecustomize in pid {os.getpid()}\\n")
USER_MARK = 42
"""


def _command(tmp_path: Path, case: str, watch_args: tuple, source: str = TRAIN) -> list:
    (tmp_path / "train.py").write_text(textwrap.dedent(source).lstrip("\n"))
    return [sys.executable, "-m", "pytest_nccl", "watch", *watch_args, "--json", str(tmp_path / "verdict.json"),
            "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", "train.py", case]


def watch(tmp_path: Path, case: str, *watch_args: str, pythonpath: list | None = None, source: str = TRAIN,
          **env) -> Watched:
    tag = uuid.uuid4().hex
    command = _command(tmp_path, case, watch_args, source)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=tmp_path, env=job_env(tag, pythonpath, **env), capture_output=True,
                              text=True, timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the watch did not finish within {JOB_TIMEOUT} s:\n{exc.stdout}\n{exc.stderr}")
    elapsed = time.monotonic() - t0
    assert_no_leftovers(tag, wait=10.0)
    path = tmp_path / "verdict.json"
    summary = json.loads(path.read_text()) if path.exists() else None
    return Watched(proc.returncode, proc.stdout, proc.stderr, elapsed, tag, summary)


def line(snippet: str) -> int:
    return line_of(TRAIN, snippet)


# -- real jobs ----------------------------------------------------------------------------------------

def test_clean_job_passes_through_untouched(tmp_path):
    """Exit status and output are the job's own; the ranks are traced; an existing sitecustomize
    still runs, in every process; a Python process that is not a rank imports nothing of ours."""
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text(textwrap.dedent(USER_SITECUSTOMIZE))
    run = watch(tmp_path, "clean", pythonpath=[user])
    assert run.code == 0, run.text
    rest = run.stdout
    for rank in (0, 1):  # the ranks run under python -u: their lines may interleave
        for text in (f"rank {rank} trained", f"rank {rank}: result [8.0, 8.0] traced True chained 42 child []"):
            assert text in rest, run.text
            rest = rest.replace(text, "", 1)
    assert not rest.strip(), run.text  # nothing else on stdout
    # the watch itself, the launcher and both ranks ran the user's sitecustomize
    assert run.stderr.count("user sitecustomize in pid") >= 4, run.stderr
    assert "=====" not in run.stderr and "diagnosed" not in run.stderr, run.stderr
    assert run.summary["verdict"] is False and run.summary["exit_code"] == 0 and run.summary["job_exit_code"] == 0


def test_not_a_rank_is_untouched_and_its_status_passes_through(tmp_path):
    tag = uuid.uuid4().hex
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith(('pytest_nccl', 'torch')))); sys.exit(7)"
    proc = subprocess.run([sys.executable, "-m", "pytest_nccl", "watch", "--", sys.executable, "-c", code],
                          cwd=tmp_path, env=job_env(tag), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "[]\n"
    assert "pytest-nccl watch: not a distributed job: no process of it imported torch" in proc.stderr
    assert_no_leftovers(tag)


def test_rank_that_left_is_diagnosed_at_once_and_the_job_ended(tmp_path):
    run = watch(tmp_path, "left", "--timeout", "60", "--trace-dir", str(tmp_path / "trace"))
    headline = ("rank 1 exited normally after 3 collectives in group default; rank 0 waits in all_reduce #4 "
                f"of group default from train.py:{line('# rank 0 waits here')}")
    assert run.code == EXIT_DIAGNOSED, run.text
    assert headline in run.stderr, run.stderr
    assert run.stderr.count(headline) == 2  # the report's, and the recap that ends the watch's output
    assert run.stderr.strip().splitlines()[-1] == f"pytest-nccl watch: verdict (exit 3): {headline}"
    # the same report as the test modes: the trace table, where each rank is, the stuck rank's stack
    assert ">>   #4 all_reduce [2] ..                  -" in run.stderr
    assert "-- Python stack of rank 0 (all threads) --" in run.stderr
    assert "dist.all_reduce(t)  # rank 0 waits here" in run.stderr
    # well before --timeout: decided from the journals, not by the clock
    assert run.summary["elapsed_s"] < 10, run.summary
    assert run.elapsed < 45
    assert run.summary["verdict"] and run.summary["kind"] == "rank-left" and run.summary["ranks"] == [1]
    assert (run.summary["group"], run.summary["seq"], run.summary["headline"]) == ("default", 4, headline)
    assert run.summary["ended_by_watch"] and run.summary["exit_code"] == EXIT_DIAGNOSED
    trace = json.loads(Path(run.summary["trace_files"][0]).read_text())
    assert trace["diagnosis"]["headline"] == headline
    assert [c["op"] for c in trace["ranks"][0]["collectives"]] == ["all_reduce"] * 4
    assert any(p.endswith("rank_0") for p in run.summary["trace_files"])  # Flight Recorder dump


def test_rank_that_raised_is_diagnosed_with_its_traceback(tmp_path):
    run = watch(tmp_path, "raise", "--timeout", "60")
    assert run.code == EXIT_DIAGNOSED, run.text
    assert ("rank 1 raised ValueError: corrupt sample after 3 collectives in group default; rank 0 waits in "
            f"all_reduce #4 of group default from train.py:{line('# rank 0 waits here too')}") in run.stderr
    assert "-- traceback of rank 1 --" in run.stderr and "  rank 1: raised ValueError: corrupt sample" in run.stderr
    assert run.summary["kind"] == "rank-raised" and run.summary["elapsed_s"] < 10


def test_shape_mismatch_and_its_trace_directory(tmp_path):
    """A desync; --trace-dir holds what a failing test's --nccl-trace-dir does: the JSON, the
    Perfetto trace and the swimlane page, each showing the verdict."""
    run = watch(tmp_path, "shape", "--timeout", "60", "--trace-dir", str(tmp_path / "trace"))
    assert run.code == EXIT_DIAGNOSED, run.text
    headline = (f"shape mismatch in all_reduce #4 of group default: rank 0 [1], rank 1 [4] "
                f"(from train.py:{line('# the mismatch')})")
    assert headline in run.stderr, run.stderr
    assert run.summary["kind"] == "shape-mismatch" and run.summary["elapsed_s"] < 10
    files = run.summary["trace_files"]
    base = files[0].removesuffix(".json")
    assert base + ".trace.json" in files and base + ".html" in files, files
    assert json.loads(Path(files[0]).read_text())["diagnosis"]["headline"] == headline
    assert "traceEvents" in json.loads(Path(base + ".trace.json").read_text())
    assert "shape mismatch in all_reduce #4" in Path(base + ".html").read_text()
    # torchrun's own ~25-line traceback of the watch's SIGTERM is one line; the job's output is all there
    assert "SignalException" in run.stderr and "(the watch ended the job; traceback folded)" in run.stderr
    assert "Traceback" not in run.stderr.split("diagnosed; ending the job")[1].split("=" * 20)[0], run.stderr


def test_every_rank_stuck_past_the_timeout(tmp_path):
    run = watch(tmp_path, "hang", "--timeout", "3", "--quiet")
    assert run.code == EXIT_DIAGNOSED, run.text
    headline = (f"every rank is inside recv #1 of group default:p2p from train.py:{line('dist.recv(')} and "
                "none completed within 3 s (--timeout)")
    assert headline in run.stderr, run.stderr
    # --quiet: the headline only
    ours = [line for line in run.stderr.splitlines() if "pytest-nccl" in line or "every rank" in line]
    assert len(ours) == 1, run.stderr
    assert 3 <= run.summary["elapsed_s"] < 15, run.summary


def test_slow_rank_past_the_timeout(tmp_path):
    run = watch(tmp_path, "slow", "--timeout", "3")
    assert run.code == EXIT_DIAGNOSED, run.text
    # where the slow rank is, and what it does there (its line's source; the function's name when short)
    assert re.search(rf"slow rank: rank 1 is busy outside any collective at train.py:{line('# the slow rank')}"
                     rf"( \(in <module>\))?: time\.sleep\(300\), after 3 collectives in group default; rank 0 "
                     rf"waited 3 s \(--timeout\) with no progress in all_reduce #4 of group default from "
                     rf"train.py:{line('# rank 0 waits for it')}", run.stderr), run.stderr
    assert "-- Python stack of rank 1 (all threads) --" in run.stderr
    assert 3 <= run.summary["elapsed_s"] < 15, run.summary


def test_keep_running_reports_and_lets_the_job_finish(tmp_path):
    run = watch(tmp_path, "keep", "--timeout", "60", "--keep-running", PG_TIMEOUT="30")
    assert run.code == EXIT_DIAGNOSED_KEPT, run.text
    assert "rank 1 exited normally after 3 collectives in group default; rank 0 waits in all_reduce #4" in run.stderr
    assert "--keep-running: the job goes on" in run.stderr
    assert "rank 0 gave up on its own" in run.stdout  # after the verdict, the job went on
    assert run.summary["verdict"] and not run.summary["ended_by_watch"]


def test_ddp_collectives_issued_from_cpp(tmp_path):
    """DDP's all-reduces never reach the Python tracer: the Flight Recorder's progress keeps a
    healthy job (even one pausing longer than --timeout on every rank) from looking stuck."""
    run = watch(tmp_path, "healthy", "--timeout", "2", source=DDP)
    assert run.code == 0 and "rank 0 done" in run.stdout and "rank 1 done" in run.stdout, run.text
    assert run.summary["verdict"] is False, run.text


def test_ddp_slow_rank_is_seen_by_the_flight_recorder(tmp_path):
    run = watch(tmp_path, "slow", "--timeout", "3", source=DDP)
    assert run.code == EXIT_DIAGNOSED, run.text
    assert re.search(rf"slow rank: rank 1 is busy outside any collective at train.py:{line_of(DDP, '# the slow rank')}"
                     rf"( \(in <module>\))?: time\.sleep\(300\)", run.stderr), run.stderr
    assert "rank 0 waited 3 s (--timeout) with no progress in all_reduce #" in run.stderr
    assert "(issued from C++, seen by the Flight Recorder)" in run.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_nothing_outlives_the_watch(tmp_path, sig):
    """Killed (SIGKILL: the launcher gets PR_SET_PDEATHSIG) or interrupted (Ctrl-C: the watch ends
    the job), the watch leaves no process of the job behind."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(_command(tmp_path, "hang", ("--timeout", "300")), cwd=tmp_path, env=job_env(tag),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        seen, deadline = "", time.monotonic() + 60
        while not all(f"rank {r} trained" in seen for r in (0, 1)) and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:  # both ranks are in the hang
                seen += os.read(proc.stdout.fileno(), 4096).decode()
        assert all(f"rank {r} trained" in seen for r in (0, 1)), seen
        time.sleep(0.5)
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == (-9 if sig == signal.SIGKILL else 130)
    assert_no_leftovers(tag, wait=15.0)
