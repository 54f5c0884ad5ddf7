"""pytest-nccl watch on several nodes: one watch per node, as srun or a cluster's scheduler runs it,
each seeing the whole job through the job's own store. Proven on one host with two real torchrun
"nodes" (static rendezvous, node 0's agent hosting the store), each under its own watch: every
watch gives the same verdict, naming the slow or diverging rank on either node and its line; a watch
that cannot see the other node says so. The channel itself, on a store fake: test_watch_channel.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import assert_no_leftovers, line_of
from watch_support import free_port, job_env

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 6           # the watches' --timeout
JOB_LIMIT = 120       # a run of two watches, whatever happens
SLACK_S = 12          # seconds past --timeout a loaded runner may take to decide and write its summary

JOB = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
case = sys.argv[1]
last = world - 1                                        # a rank of the last node
# A job trains minutes before it fails: time for the watches, which import torch, to reach each other
# (10 s and more on a loaded host). Here: until rank 0's watch announced the channel (up to 60 s).
from pytest_nccl.watch.engine.channel import announcement_key
from pytest_nccl.core.jobdir import attempt_of
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
key = announcement_key(f"{os.environ.get('TORCHELASTIC_RUN_ID') or 'job'}/{attempt_of(os.environ)}")
for _ in range(600):
    if store.check([key]):
        break
    time.sleep(0.1)
t = torch.ones(2)
for step in range(1, 9):
    time.sleep(1.0 if step < 6 else 0)                  # then it trains a while (5 s), then fails
    with open(f"progress.{rank}", "w") as stamp:        # this rank's last step, for the test's clock
        stamp.write(str(time.time()))
    if case == "slow" and step == 6 and rank == last:
        time.sleep(120)                                 # the slow rank
    if case == "shape" and step == 6:
        out = [torch.empty(3 if r == last else 2) for r in range(world)]
        dist.all_gather(out, torch.ones(3 if rank == last else 2))   # the odd shape
    dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


# -- real jobs: two torchrun nodes on one host, each under its own watch --------------------------------

def _env(tag: str) -> dict:
    return {k: v for k, v in job_env(tag).items() if not k.startswith("PYTEST_NCCL_WATCH")}


def _kill_when_connected(proc: subprocess.Popen, port: int, after: float) -> None:
    """SIGKILL ``proc`` (a node's watch) ``after`` seconds past the channel's announcement."""
    import datetime

    import torch.distributed as dist

    from pytest_nccl.watch.engine.channel import announcement_key
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    keys = [announcement_key(f"{run_id}/0") for run_id in ("none", "job")]  # torchrun's static run id
    deadline = time.monotonic() + JOB_LIMIT
    while not any(store.check([key]) for key in keys):
        assert time.monotonic() < deadline and proc.poll() is None, "the watches never connected"
        time.sleep(0.1)
    time.sleep(after)
    proc.kill()


def run_nodes(tmp_path: Path, case: str, watched=(0, 1), nproc: int = 2, kill_watch: int | None = None) -> dict:
    """Start node 0 and node 1 of one job (each a torchrun), each under its own watch when listed in
    ``watched``; node -> (exit status, stderr, --json summary or None). ``kill_watch``: that node's
    watch is killed (SIGKILL) two seconds into the job."""
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB).lstrip("\n"))
    port, tag = free_port(), uuid.uuid4().hex
    procs = {}
    for node in (0, 1):
        launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                  f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}", "job.py", case]
        if node in watched:
            launch = [sys.executable, "-m", "pytest_nccl", "watch", "--timeout", str(TIMEOUT),
                      "--json", str(tmp_path / f"node{node}.json"), "--", *launch]
        procs[node] = subprocess.Popen(launch, cwd=tmp_path, env=_env(tag), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    out = {}
    try:
        if kill_watch is not None:
            _kill_when_connected(procs[kill_watch], port, after=2.0)
        for node, proc in sorted(procs.items(), key=lambda item: item[0] not in watched):
            if node not in watched:  # nothing ends an unwatched node's slow rank (120 s) but its launcher
                proc.terminate()
            _, err = proc.communicate(timeout=JOB_LIMIT)
            path = tmp_path / f"node{node}.json"
            out[node] = (proc.returncode, err, json.loads(path.read_text()) if path.exists() else None)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert_no_leftovers(tag, wait=15.0)
    return out


def headline_of(stderr: str) -> str:
    return next((line for line in stderr.splitlines() if "stalled (" in line or "diagnosed (" in line), "")


@pytest.mark.timeout(JOB_LIMIT + 60)
def test_a_slow_rank_on_the_other_node_is_named_by_both_watches(tmp_path):
    """Rank 3 (node 1) sleeps before its sixth all_reduce: both watches, each launched on its own
    node, give the same headline, naming rank 3 and its line, within --timeout (plus a loaded
    runner's slack) of the last step any rank made."""
    out = run_nodes(tmp_path, "slow")
    sleep_line = line_of(JOB, "time.sleep(120)")
    for node, (code, err, summary) in out.items():
        assert code == 3, f"node {node}:\n{err}"
        assert summary["kind"] == "slow-rank" and summary["ranks"] == [3], (node, summary)
        assert f"job.py:{sleep_line}: time.sleep(120)" in summary["headline"], (node, summary["headline"])
        assert "rank 3 is busy outside any collective" in summary["headline"], summary["headline"]
        assert "ranks 0-2 waited 6 s (--timeout) with no progress in all_reduce #6" in summary["headline"]
    assert out[0][2]["headline"] == out[1][2]["headline"], (out[0][2]["headline"], out[1][2]["headline"])
    # timed from the job's own clock, not from the launch: starting two launchers, two watches and four
    # ranks on a loaded 2-core runner has taken anything from 20 s to 90 s, and is not what this claims
    last_step = max(float(path.read_text()) for path in tmp_path.glob("progress.*"))
    for node in out:
        decided = (tmp_path / f"node{node}.json").stat().st_mtime - last_step
        assert decided < TIMEOUT + SLACK_S, (node, decided)


@pytest.mark.timeout(JOB_LIMIT + 60)
def test_a_shape_mismatch_across_nodes_names_every_rank_s_shape(tmp_path):
    out = run_nodes(tmp_path, "shape")
    gather_line = line_of(JOB, "dist.all_gather(out")
    for node, (code, err, summary) in out.items():
        assert code == 3, f"node {node}:\n{err}"
        assert summary["kind"] == "shape-mismatch", (node, summary)
        assert summary["headline"].startswith("shape mismatch in all_gather #6 of group default: ranks 0-2 [2], "
                                              "rank 3 [3]"), (node, summary["headline"], err)
        assert f"job.py:{gather_line}" in summary["headline"]
    assert out[0][2]["headline"] == out[1][2]["headline"]


@pytest.mark.timeout(JOB_LIMIT + 60)
def test_a_watch_alone_says_which_ranks_it_cannot_see(tmp_path):
    """Node 1 runs without a watch: node 0's watch never claims that ranks 2,3 did not start."""
    out = run_nodes(tmp_path, "slow", watched=(0,))
    code, err, summary = out[0]
    assert code == 3, err
    assert summary["kind"] == "unseen-ranks" and summary["ranks"] == [2, 3], summary
    assert summary["headline"].startswith(  # where ranks 0,1 wait now, not where ranks 2,3 were last seen
        "ranks 2,3 cannot be seen by this watch (on another node); ranks 0,1 waited 6 s (--timeout) with no "
        "progress in all_reduce #6 of group default"), summary["headline"]
    assert "never created" not in err


def test_a_clean_job_on_two_nodes_passes_through_untouched(tmp_path):
    out = run_nodes(tmp_path, "clean", nproc=1)
    for node, (code, err, summary) in out.items():
        assert code == 0 and summary["verdict"] is False, f"node {node}:\n{err}"


@pytest.mark.timeout(JOB_LIMIT + 60)
@pytest.mark.parametrize("killed", [1, 0])  # another node's watch; the deciding watch (the channel's store)
def test_a_node_whose_watch_is_killed_leaves_nothing_running_and_is_not_blamed(tmp_path, killed):
    """A node's watch is killed mid-job (SIGKILL): its guardian ends that node's job, so nothing of it
    is left (run_nodes checks); the other node's rank then fails in its next collective, and its
    watch says so, with the killed node's rank unseen, never a hang or a slow rank."""
    out = run_nodes(tmp_path, "clean", nproc=1, kill_watch=killed)
    assert out[killed][0] == -9
    code, err, summary = out[1 - killed]
    assert code == 3 and summary is not None, err
    assert summary["kind"] == "rank-raised" and summary["ranks"] == [1 - killed], summary  # gloo: peer closed
    assert f"rank {killed}: unseen: runs on another node" in err, err
