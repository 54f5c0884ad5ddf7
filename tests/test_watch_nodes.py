"""pytest-nccl watch on several nodes: one watch per node, as srun or a cluster's scheduler runs it,
each seeing the whole job through the job's own store. Proven on one host with two real torchrun
"nodes" (static rendezvous, node 0's agent hosting the store), each under its own watch: every
watch gives the same verdict, naming the slow or diverging rank on either node and its line. Also:
the channel itself on a store fake, and a watch that cannot see the other node says so."""

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
from conftest import assert_no_leftovers, line_of
from watch_support import free_port, job_env

from pytest_nccl.core.agreement import Digest
from pytest_nccl.core.messages import AgentRequest
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import RankState
from pytest_nccl.watch.channel import KEEP_CHUNKS, Channel
from pytest_nccl.watch.jobdir import RankInfo

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 6           # the watches' --timeout
JOB_LIMIT = 120       # a run of two watches, whatever happens

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
from pytest_nccl.watch.channel import announcement_key
from pytest_nccl.watch.jobdir import attempt_of
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
key = announcement_key(f"{os.environ.get('TORCHELASTIC_RUN_ID') or 'job'}/{attempt_of(os.environ)}")
for _ in range(600):
    if store.check([key]):
        break
    time.sleep(0.1)
t = torch.ones(2)
for step in range(1, 9):
    time.sleep(1.0 if step < 6 else 0)                  # then it trains a while (5 s), then fails
    if case == "slow" and step == 6 and rank == last:
        time.sleep(120)                                 # the slow rank
    if case == "shape" and step == 6:
        out = [torch.empty(3 if r == last else 2) for r in range(world)]
        dist.all_gather(out, torch.ones(3 if rank == last else 2))   # the odd shape
    dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


LOCK = threading.Lock()


class FakeStore:
    """torch's Store methods the channel uses, in a dict."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)

    def add(self, key, n):
        with LOCK:  # the relay threads of several watches share it
            value = int(self.data.get(key, b"0")) + n
            self.data[key] = str(value).encode()
            return value

    def delete_key(self, key):
        return self.data.pop(key, None) is not None


def test_journal_chunks_reach_the_other_watch_and_the_store_keeps_a_bounded_tail():
    store = FakeStore()
    mine, theirs = Channel(store, "job/0"), Channel(store, "job/0")
    mine.push(3, b"E\t...\n")
    count, data = theirs.pull(3, 0)
    assert (count, data) == (1, b"E\t...\n")
    for i in range(KEEP_CHUNKS + 10):
        mine.push(3, b"%d\n" % i)
    count, data = theirs.pull(3, 1)
    assert count == KEEP_CHUNKS + 11
    assert data.startswith(b"10\n") and data.endswith(b"%d\n" % (KEEP_CHUNKS + 9))  # the first 10 are gone
    assert sum(key.startswith("pytest-nccl-watch/job/0/journal/3/") for key in store.data) == KEEP_CHUNKS + 1


def test_exit_reports_progress_info_and_the_verdict_travel_whole():
    store = FakeStore()
    mine, theirs = Channel(store, "job/0"), Channel(store, "job/0")
    report = RankReport(2, RankState.DEAD, signal_name="SIGABRT", stack="Fatal Python error: Aborted",
                        digest={"default": Digest(1, 2)})
    mine.publish_exit(report)
    assert theirs.exit_report(2) == report and theirs.exit_report(1) is None
    mine.publish_progress(2, (("0", 5, 4),))
    assert theirs.progress(2) == (("0", 5, 4),)
    mine.publish_info(2, {"rank": 2, "host": "node1"})
    assert theirs.info(2) == {"rank": 2, "host": "node1"}
    mine.publish_verdict({"headline": "x"})
    assert theirs.verdict() == {"headline": "x"}
    assert Channel(store, "job/1").verdict() is None  # another attempt of the launcher: other keys


def test_a_question_for_a_rank_is_answered_by_its_node_s_watch():
    store = FakeStore()
    asking, owning = Channel(store, "j/0"), Channel(store, "j/0")

    def serve():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for number, request in owning.questions(1):
                owning.answer(1, number, {"stack": f"answer to {request}"})
                return
            time.sleep(0.01)
    server = threading.Thread(target=serve)
    server.start()
    assert asking.ask(1, AgentRequest.DUMP, timeout=5) == {"stack": "answer to dump"}
    server.join()
    assert asking.ask(2, AgentRequest.DUMP, timeout=0.1) is None  # nobody answers for rank 2
    store.set(owning._k("ask", 3, "count"), b"1")  # a word of another version: read, not an error
    store.set(owning._k("ask", 3, 0), b"stacks-please")
    assert owning.questions(3) == [(0, None)]


def test_a_store_that_went_away_makes_the_channel_lost_not_an_error():
    class Gone(FakeStore):
        def add(self, key, n):
            raise RuntimeError("Connection reset by peer")
    channel = Channel(Gone(), "j/0")
    assert channel.pull(0, 0) == (0, b"") and channel.lost
    assert channel.ask(0, AgentRequest.DUMP, 1.0) is None and channel.exit_report(0) is None
    channel.push(0, b"x")  # no error either


def test_a_store_hiccup_is_retried_on_a_fresh_client_and_the_channel_stays():
    """A loaded host: one call fails ("Broken pipe") on the client; the retry on a fresh client of
    the same store succeeds, and the channel is not lost (issue 30: a clean job was failed after it)."""
    store = FakeStore()

    class Broken(FakeStore):
        def add(self, key, n):
            raise RuntimeError("Broken pipe")
    Channel(store, "j/0").push(1, b"E\t...\n")
    channel = Channel(Broken(), "j/0", reopen=lambda: store)
    assert channel.pull(1, 0) == (1, b"E\t...\n") and not channel.lost and channel.errors == 1


def test_a_store_gone_for_good_is_found_so_once_and_at_once():
    """The deciding watch ended after a clean job, and its store with it. The relay thread's call
    failed, and each retry waited out a fresh client's timeout (TCPStore's: twice the 5 s asked)
    while it held the channel's lock; the watch's loop then waited behind it and tried as often
    itself: node 1's watch ended a clean job 50-130 s late (the soak failed it past 120 s). Now a
    fresh client that cannot be had (nothing listens there) ends the channel at once, and a call
    that waited for the lock does not try again."""
    from pytest_nccl.watch.channel import _store

    calls, reopened = [], []

    class Gone(FakeStore):
        def add(self, key, n):
            calls.append(key)
            time.sleep(0.3)  # the other thread asks meanwhile, and waits for the lock
            raise RuntimeError("Connection reset by peer")
    channel = Channel(Gone(), "j/0", reopen=lambda: reopened.append(1))
    second = threading.Thread(target=channel.pull, args=(0, 0))
    first = threading.Thread(target=channel.pull, args=(1, 0))
    first.start()
    time.sleep(0.1)
    second.start()
    first.join(10)
    second.join(10)
    assert channel.lost and len(calls) == 1 and len(reopened) == 1, (calls, reopened)
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    assert _store("127.0.0.1", port, 5.0) is None
    assert time.monotonic() - t0 < 5.0  # it took 10-12 s


def test_the_deciding_watch_judges_after_every_watch_published_up_to_now():
    """Before judging, the deciding watch asks the others to publish what their ranks wrote up to now
    and waits for each (a loaded host: a relay seconds behind the rank that entered the diverging
    collective gave a one-node verdict); its own relay answers too."""
    from pytest_nccl.watch.nodes import Nodes
    store = FakeStore()
    deciding = Nodes(Channel(store, "j/0"), local=lambda: {}, ended=lambda rank: None)
    other = Nodes(Channel(store, "j/0"), local=lambda: {}, ended=lambda rank: None)
    try:
        t0 = time.monotonic()
        deciding.await_synced(1, time.monotonic() + 5)
        assert deciding.channel.flush_requests() == 1 and deciding.channel.flushed_watches(1) == 2
        assert time.monotonic() - t0 < 5
    finally:
        other.close()
        deciding.close()


def test_a_watch_in_sync_is_waited_for_past_agree_wait(monkeypatch):
    """A loaded host: the other watch is in sync but its relay answers the flush request only after
    ``agree_wait``. The deciding watch waits for it (a verdict late, not blind: judged without the
    other node's records, a cross-node shape mismatch read as gloo's bare message; soak, load 10)."""
    import dataclasses

    from pytest_nccl.watch import nodes
    monkeypatch.setattr(nodes, "TIMING", dataclasses.replace(nodes.TIMING, agree_wait=0.2))
    store = FakeStore()
    deciding = nodes.Nodes(Channel(store, "j/0"), local=lambda: {}, ended=lambda rank: None)
    slow = Channel(store, "j/0")  # the other watch: joined and in sync, no relay thread of its own yet
    slow.join()
    slow.synced()

    def answer_late():
        time.sleep(0.8)
        slow.flushed(slow.flush_requests())
    late = threading.Thread(target=answer_late)
    late.start()
    try:
        deciding.await_synced(1, time.monotonic())
        assert deciding.channel.flushed_watches(1) == 2
    finally:
        late.join()
        deciding.close()


# -- real jobs: two torchrun nodes on one host, each under its own watch --------------------------------

def _env(tag: str) -> dict:
    return {k: v for k, v in job_env(tag).items() if not k.startswith("PYTEST_NCCL_WATCH")}


def run_nodes(tmp_path: Path, case: str, watched=(0, 1), nproc: int = 2) -> dict:
    """Start node 0 and node 1 of one job (each a torchrun), each under its own watch when listed in
    ``watched``; node -> (exit status, stderr, --json summary or None)."""
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
    node, give the same headline, naming rank 3 and its line, within --timeout + 10 s."""
    t0 = time.monotonic()
    out = run_nodes(tmp_path, "slow")
    elapsed = time.monotonic() - t0
    sleep_line = line_of(JOB, "time.sleep(120)")
    for node, (code, err, summary) in out.items():
        assert code == 3, f"node {node}:\n{err}"
        assert summary["kind"] == "slow-rank" and summary["ranks"] == [3], (node, summary)
        assert f"job.py:{sleep_line}: time.sleep(120)" in summary["headline"], (node, summary["headline"])
        assert "rank 3 is busy outside any collective" in summary["headline"], summary["headline"]
        assert "ranks 0-2 waited 6 s (--timeout) with no progress in all_reduce #6" in summary["headline"]
    assert out[0][2]["headline"] == out[1][2]["headline"], (out[0][2]["headline"], out[1][2]["headline"])
    # + 60: two launchers and four ranks start torch on a loaded 2-core host (40 s seen with 7 users)
    assert elapsed < TIMEOUT + 10 + 60, elapsed


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
    assert summary["kind"] == "unseen-ranks", summary
    assert summary["headline"].startswith(  # where ranks 0,1 wait now, not where ranks 2,3 were last seen
        "ranks 2,3 cannot be seen by this watch (on another node); ranks 0,1 waited 6 s (--timeout) with no "
        "progress in all_reduce #6 of group default"), summary["headline"]
    assert "never created" not in err


def test_a_clean_job_on_two_nodes_passes_through_untouched(tmp_path):
    out = run_nodes(tmp_path, "clean", nproc=1)
    for node, (code, err, summary) in out.items():
        assert code == 0 and summary["verdict"] is False, f"node {node}:\n{err}"


def test_a_lost_channel_makes_the_other_node_s_ranks_unseen_never_a_hang(tmp_path):
    """Node 1's watch: rank 0 (node 0) was last seen inside all_reduce #8, rank 1 (this node) exited
    normally. While the channel is up, that wait counts; once the channel is lost (the deciding
    watch's store is gone), rank 0 is unseen: no journal, no wait, so the rolling bound never runs
    out on it and its report says so (issue 30: a clean job failed with a hang verdict)."""
    from types import SimpleNamespace

    from collective_records import record

    from pytest_nccl.core.referee import Referee
    from pytest_nccl.core.states import Reason
    from pytest_nccl.watch.follow import Followed, RemoteRank
    from pytest_nccl.watch.monitor import Monitor

    monitor = Monitor(str(tmp_path), TIMEOUT, connect=lambda info, decides: None)
    try:
        channel = Channel(FakeStore(), "j/0")
        rank0 = Followed(0, RemoteRank(0, RankInfo(rank=0), channel))
        rank0.records = [record(0, i, t=i) for i in range(1, 8)] + [record(0, 8, state="entered", t=8)]
        rank1 = Followed(1, RemoteRank(1, RankInfo(rank=1), channel))  # as good as this node's: it completed #8
        rank1.records, rank1.state = [record(1, i, t=i) for i in range(1, 9)], RankState.PASSED
        monitor.ranks, monitor.world, monitor.node_count = {0: rank0, 1: rank1}, 2, 2
        monitor.nodes = SimpleNamespace(channel=channel, close=lambda: None)  # type: ignore[assignment]

        def judged_at(now: float) -> Reason | None:
            referee = Referee(2, TIMEOUT, 0.0, rolling=True)
            referee.finished(1, RankState.PASSED, 0.0)
            for t in range(0, int(now) + 1):
                reason = referee.step(float(t), monitor.view)
                if reason is not None:
                    return reason
            return None
        assert judged_at(30) == Reason.TIMEOUT  # seen waiting: a stall, as before
        channel.lost = True
        monitor._lose_sight()
        assert monitor.unseen() == [0] and monitor.view.journals()[0] == []
        assert judged_at(300) is None
        assert monitor._report(0, None).state == RankState.UNSEEN
    finally:
        monitor.close()
