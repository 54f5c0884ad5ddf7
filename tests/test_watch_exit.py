"""A watch's exit while one of its threads is inside torch's store (issue 39: healthy jobs of 8 and
16 nodes, watches dead of SIGABRT after the job ended). The monitor's connect thread and the relay
call torch's C++ with the GIL released; one that returned while the interpreter finalized was ended
by ``pthread_exit``, whose unwinding through those frames called ``std::terminate``. The exit now
waits for the calls under way and lets none start (``channel_store.IN_TORCH``). Also the whole job: 16
one-rank torchrun "nodes" on one host, each under its own watch, every one exiting 0."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import assert_no_leftovers
from watch_support import free_port, job_env

from pytest_nccl.watch.engine.channel_store import _InTorch

REPO = Path(__file__).resolve().parents[1]

# A daemon thread inside a store call (CALL s) when the main thread returns; the interpreter then
# finalizes for up to HELD s (a loaded host's watch took seconds to: 16 nodes on 2 cores), as long
# as the thread lives. Without the wait at exit, its call returns in that window: SIGABRT.
JOB = """
import subprocess, sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from pytest_nccl.watch.engine.channel import Channel, connect
from pytest_nccl.core.jobdir import RankInfo

CALL = 2.0
SILENT = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8); "
          "print(s.getsockname()[1], flush=True); time.sleep(float(sys.argv[1]))")

class HeldOpen:
    # collected while the interpreter finalizes: it finalizes until the store call has returned
    # (``returned``: said by the thread, in Python, once the call's C++ is done), for up to 60 s
    sleep, monotonic, returned = staticmethod(time.sleep), staticmethod(time.monotonic), []

    def __del__(self):
        until = self.monotonic() + 60.0
        while not self.returned and self.monotonic() < until:
            self.sleep(0.05)


def said(call):
    def returns(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        finally:
            HeldOpen.returned.append(call)
    return returns

if sys.argv[1] == "connect":   # the monitor's connect thread, making a client of the job's store
    # a job's store that accepts and never answers, and ends CALL s later (as a launcher ends): the
    # client's handshake waits for it, then fails
    peer = subprocess.Popen([sys.executable, "-c", SILENT, str(CALL)], stdout=subprocess.PIPE, text=True)
    info = RankInfo(master_addr="127.0.0.1", master_port=peer.stdout.readline().strip())
    dist.TCPStore = said(dist.TCPStore)
    target = lambda: connect(info, decides=lambda: False, timeout=CALL)
else:                          # the relay, in a store call that waits (a loaded store)
    waited = dist.HashStore()
    waited.set_timeout(timedelta(seconds=CALL))

    class Waiting:
        def check(self, keys):
            return True

        def get(self, key):
            return said(waited.get)(key)   # never set: waits CALL s in C++

    target = Channel(Waiting(), "job").verdict
held = HeldOpen()
threading.Thread(target=target, daemon=True).start()
time.sleep(0.5)                # the thread is inside torch's C++ now
print("main returns", flush=True)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["connect", "relay"])
def test_a_thread_inside_a_store_call_at_exit_never_aborts_the_watch(tmp_path, where):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB).lstrip("\n"))
    proc = subprocess.run([sys.executable, "job.py", where], cwd=tmp_path, capture_output=True, text=True,
                          timeout=150, env={"PYTHONPATH": str(REPO), "TORCH_CPP_LOG_LEVEL": "FATAL",
                                            "PATH": "/usr/bin:/bin"})
    assert "main returns" in proc.stdout, proc.stderr
    assert "terminate called" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr


def test_the_exit_waits_for_the_calls_under_way_and_refuses_new_ones():
    flight = _InTorch()
    entered, release, done = threading.Event(), threading.Event(), []

    def call():
        with flight.call() as allowed:
            assert allowed
            entered.set()
            release.wait(30)
        done.append(time.monotonic())

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    assert entered.wait(30)
    threading.Timer(0.3, release.set).start()
    assert flight.settle(wait=30) is True       # returned only once the call had
    assert done, "settle returned while a call was under way"
    with flight.call() as allowed:
        assert allowed is False                 # none starts once the process exits
    thread.join(30)


def test_a_call_that_outlives_the_wait_is_said_so():
    flight = _InTorch()
    release = threading.Event()

    def call():
        with flight.call():
            release.wait(30)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    while flight.calls == 0:
        time.sleep(0.01)
    assert flight.settle(wait=0.2) is False
    release.set()
    thread.join(30)


# -- a healthy job of many one-rank nodes on one host, each under its own watch ------------------------
NODES = 16
STEPS = 200           # the abort came at the job's end, whatever its length: a short job is enough
NODES_LIMIT = 420     # the whole job: 16 watches, launchers and ranks start torch on 2 loaded cores

HEALTHY = f"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2)
for _ in range({STEPS}):
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(NODES_LIMIT + 60)
def test_a_healthy_job_of_16_one_rank_nodes_ends_with_exit_0_on_every_node(tmp_path):
    """Before: 5 to 10 of the 16 watches died of SIGABRT after the job ended (issue 39)."""
    (tmp_path / "job.py").write_text(HEALTHY.lstrip("\n"))
    port, tag = free_port(), uuid.uuid4().hex
    env = {k: v for k, v in job_env(tag).items() if not k.startswith("PYTEST_NCCL_WATCH")}
    procs = []
    for node in range(NODES):
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--node-rank={node}",
                  "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", "job.py"]
        with open(tmp_path / f"node{node}.err", "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-m", "pytest_nccl", "watch", "--timeout", "15", "--json",
                                           str(tmp_path / f"node{node}.json"), "--", *launch], cwd=tmp_path,
                                          env=env, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + NODES_LIMIT
    try:
        codes = [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    failed = {node: (code, (tmp_path / f"node{node}.err").read_text()[-2000:])
              for node, code in enumerate(codes) if code != 0}
    assert not failed, f"{len(failed)} of {NODES} watches failed: {failed}"
    for node in range(NODES):
        summary = json.loads((tmp_path / f"node{node}.json").read_text())
        assert summary["verdict"] is False, (node, summary)
    assert_no_leftovers(tag, wait=15.0)


# A rank whose last collective's C line is still deferred (trace_core.pending) when it exits: the
# flusher's period is made long, so only the exit path writes it. The journal, as it is when the exit
# record is written, must already hold that line.
LAST_LINE_JOB = """
import os, sys
import torch, torch.distributed as dist
from pytest_nccl.rank import trace_completion
from pytest_nccl.core import jobdir
from pytest_nccl.watch.inrank import inject

trace_completion.FLUSH_EVERY = 60.0
inject.after_torch()
real, seen = jobdir.write_text, {}

def write_text(path, text):
    if path.endswith(os.path.basename(jobdir.exit_record("", 0))):
        journal = [os.path.join(r, n) for r, _, ns in os.walk(sys.argv[1]) for n in ns
                   if n == os.path.basename(jobdir.journal("", 0))]
        seen["journal"] = open(journal[0]).read()
    real(path, text)

jobdir.write_text = write_text
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
inject._rank.at_exit()
print(repr(seen["journal"]))
"""


def test_the_journal_is_complete_before_the_exit_record_is_written(tmp_path):
    from pytest_nccl.core.journal import JournalTail

    (tmp_path / "job.py").write_text(textwrap.dedent(LAST_LINE_JOB).lstrip("\n"))
    env = job_env("exit-record", PYTEST_NCCL_WATCH_DIR=str(tmp_path / "job"), MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    proc = subprocess.run([sys.executable, "job.py", str(tmp_path / "job")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    journal = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307  (a repr the job printed)
    (record,) = [r for r in JournalTail(0).feed(journal.encode()) if r.op == "all_reduce"]
    assert not record.pending, journal
