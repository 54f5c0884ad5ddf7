"""The channel between the watches of a job's nodes (``watch/engine/channel.py``), on a store fake:
summaries published when they changed, questions answered with the deciding watch's bases, a store
that went away or hiccuped, a verdict too large for a store value; and a watch that lost the channel
makes the other node's ranks unseen, never a hang. The real jobs on two torchrun nodes are in
test_watch_nodes.py."""

from __future__ import annotations

import threading
import time

from watch_support import free_port

from pytest_nccl.core.agreement import Digest
from pytest_nccl.core.jobdir import RankInfo
from pytest_nccl.core.messages import AgentRequest
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import RankState
from pytest_nccl.watch.engine.channel import Ask, Channel, Details, NodeSummary, RankSummary

TIMEOUT = 6           # the watch's --timeout

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


class MultiGetStore(FakeStore):
    """torch 2.6 on: ``multi_get``, which waits for a missing key as ``get`` does."""

    def multi_get(self, keys):
        return [self.data[k] for k in keys]


def test_a_node_summary_reaches_the_deciding_watch_and_is_set_only_when_it_changed():
    for store in (FakeStore(), MultiGetStore()):
        deciding, other = Channel(store, "job/0"), Channel(store, "job/0")
        node = other.join()
        summary = {3: RankSummary(120, {"default": 2}, (("0", 5, 4),), None)}
        other.publish_summary(node, summary)
        key = other._k("node", node, "summary")
        store.data[key] = b"{}"  # a set again would put it back
        other.publish_summary(node, {3: RankSummary(120, {"default": 2}, (("0", 5, 4),), None)})
        assert store.data[key] == b"{}"
        other.publish_summary(node, summary | {4: RankSummary(7)}, beat=2)
        expected = NodeSummary(2, summary | {4: RankSummary(7)})
        assert deciding.summaries([node, node + 1]) == {node: expected}  # node+1: none yet


def test_info_and_the_verdict_travel_whole():
    store = FakeStore()
    mine, theirs = Channel(store, "job/0"), Channel(store, "job/0")
    mine.publish_info(2, {"rank": 2, "host": "node1"})
    assert theirs.info(2) == {"rank": 2, "host": "node1"}
    report = RankReport(2, RankState.DEAD, signal_name="SIGABRT", digest={"default": Digest(1, 2)})
    mine.publish_verdict({"report": report})
    assert theirs.verdict() == {"report": report}
    assert Channel(store, "job/1").verdict() is None  # another attempt of the launcher: other keys


def test_a_question_to_a_node_is_answered_by_its_watch_with_the_deciding_watch_s_bases():
    store = MultiGetStore()
    asking, owning = Channel(store, "j/0"), Channel(store, "j/0")
    asking.publish_bases({"default": 100})
    node = owning.join()
    assert owning.questions(node) == ([], {"default": 100})  # one call a tick when nobody asks

    def serve():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            questions, _ = owning.questions(node)
            for number, question in questions:
                owning.answer(node, number, {"stack": f"rank {question.agents_of[0]}: {question.request.value}"})
                return
            time.sleep(0.01)
    server = threading.Thread(target=serve)
    server.start()
    assert asking.ask(node, Ask(AgentRequest.DUMP, agents_of=(5,)), timeout=5) == {"stack": "rank 5: dump"}
    server.join()
    assert owning.questions(node) == ([], {"default": 100})  # answered once
    assert asking.ask(node + 1, Ask(AgentRequest.DUMP, agents_of=(9,)), timeout=0.1) is None  # no watch there
    store.set(owning._k("node", node, "asks"), b"2")  # a value of another version: read, not an error
    store.set(owning._k("node", node, "ask", 1), b"stacks-please")
    assert owning.questions(node) == ([], {"default": 100})


def test_the_store_calls_are_counted():
    from pytest_nccl.watch.engine.channel_store import STATS
    before = STATS.calls, STATS.bytes_out
    channel = Channel(FakeStore(), "j/0")
    channel.publish_info(1, {"rank": 1})
    assert STATS.calls == before[0] + 1 and STATS.bytes_out > before[1]


def test_a_store_that_went_away_makes_the_channel_lost_not_an_error():
    class Gone(FakeStore):
        def add(self, key, n):
            raise RuntimeError("Connection reset by peer")
    channel = Channel(Gone(), "j/0")
    assert channel.watches() == 0 and channel.lost
    assert channel.ask(1, Ask(AgentRequest.DUMP, agents_of=(0,)), 1.0) is None and channel.summaries([1]) == {}
    channel.publish_summary(1, {0: RankSummary()})  # no error either


def test_a_store_hiccup_is_retried_on_a_fresh_client_and_the_channel_stays():
    """A loaded host: one call fails ("Broken pipe") on the client; the retry on a fresh client of
    the same store succeeds, and the channel is not lost (issue 30: a clean job was failed after it)."""
    store = FakeStore()

    class Broken(FakeStore):
        def check(self, keys):
            raise RuntimeError("Broken pipe")
    Channel(store, "j/0").publish_summary(1, {0: RankSummary(5)})
    channel = Channel(Broken(), "j/0", reopen=lambda: store)
    assert channel.summaries([1]) == {1: NodeSummary(0, {0: RankSummary(5)})} and not channel.lost
    assert channel.errors == 1


def test_a_store_gone_for_good_is_found_so_once_and_at_once():
    """The deciding watch ended after a clean job, and its store with it. The relay thread's call
    failed, and each retry waited out a fresh client's timeout (TCPStore's: twice the 5 s asked)
    while it held the channel's lock; the watch's loop then waited behind it and tried as often
    itself: node 1's watch ended a clean job 50-130 s late (the soak failed it past 120 s). Now a
    fresh client that cannot be had (nothing listens there) ends the channel at once, and a call
    that waited for the lock does not try again."""
    from pytest_nccl.watch.engine.channel_store import make_store

    calls, reopened = [], []

    class Gone(FakeStore):
        def add(self, key, n):
            calls.append(key)
            time.sleep(0.3)  # the other thread asks meanwhile, and waits for the lock
            raise RuntimeError("Connection reset by peer")
    channel = Channel(Gone(), "j/0", reopen=lambda: reopened.append(1))
    second = threading.Thread(target=channel.watches)
    first = threading.Thread(target=channel.synced_watches)
    first.start()
    time.sleep(0.1)
    second.start()
    first.join(10)
    second.join(10)
    assert channel.lost and len(calls) == 1 and len(reopened) == 1, (calls, reopened)
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    assert make_store("127.0.0.1", port, 5.0) is None
    assert time.monotonic() - t0 < 5.0  # it took 10-12 s


class NodeRanks:
    """What a relay reads of its node's ranks, on data: rank -> summary."""

    def __init__(self, summaries: dict):
        self.summaries, self.kept_from = summaries, None

    def local_ranks(self):
        return dict.fromkeys(self.summaries)

    def summary(self, rank):
        return self.summaries[rank]

    def details(self, rank, bases):
        return Details([f"records of rank {rank} after {bases}"], self.summaries[rank])

    def keep_from(self, bases):
        self.kept_from = bases


def test_the_deciding_watch_reads_each_node_s_summary_and_asks_it_for_records():
    """Node 1's relay publishes its ranks' summary, keeps its window from the deciding watch's bases,
    and answers for its ranks' records; the deciding watch reads summaries only (two calls a tick)."""
    from pytest_nccl.watch.engine.nodes import Nodes
    store = MultiGetStore()
    deciding_channel = Channel(store, "j/0")
    deciding_channel.publish_bases({"default": 100})
    deciding = Nodes(deciding_channel, NodeRanks({0: RankSummary(1)}), decides=lambda: True)
    ranks = NodeRanks({2: RankSummary(10, {"default": 150}), 3: RankSummary(11, {"default": 150})})
    other = Nodes(Channel(store, "j/0"), ranks, decides=lambda: False)
    try:
        deciding.await_synced(1, time.monotonic() + 5)
        now = time.monotonic()
        assert deciding.summaries(now) == {2: RankSummary(10, {"default": 150}), 3: RankSummary(11, {"default": 150})}
        assert not deciding.silent(2, now, 10.0) and deciding.silent(2, now + 60, 10.0)  # its watch killed: no beat
        assert ranks.kept_from == {"default": 100}
        node = deciding.rank_nodes[3]
        answer = deciding.records(node, [2, 3], {"default": 120}, timeout=5)  # one question for both
        assert answer == {r: Details([f"records of rank {r} after {{'default': 120}}"], RankSummary(10 + r - 2,
                                                                                                  {"default": 150}))
                          for r in (2, 3)}
        assert deciding.ask_agents([7], AgentRequest.DUMP) == {}  # no node runs rank 7
        t1 = time.monotonic()
        time.sleep(1.3)  # a live relay beats every second, asked anything or not
        assert deciding.beat_since(node, t1)
        other.close()  # its last records left in the channel: asked now, it would never answer
        deciding.summaries(time.monotonic())
        t2 = time.monotonic()
        time.sleep(1.3)
        assert not deciding.beat_since(node, t2)  # a watch gone beats no more
        t0 = time.monotonic()
        assert deciding.records(node, [3], {"default": 120}, timeout=5)[3].summary == RankSummary(11, {"default": 150})
        assert time.monotonic() - t0 < 1.0
    finally:
        other.close()
        deciding.close()


def test_a_verdict_too_large_for_a_store_value_keeps_each_rank_s_last_records():
    """Hundreds of ranks' windows passed the 8 MiB a TCPStore value may hold: the deciding watch's
    publish failed, and every other watch gave a verdict of its own (the scale benchmark, 52 nodes)."""
    from collective_records import record

    from pytest_nccl.core.records import RankView
    from pytest_nccl.core.reports import CallOutcome
    from pytest_nccl.core.states import Reason
    from pytest_nccl.watch.engine import channel as channel_mod
    store = FakeStore()
    views = [RankView(r, records=[record(r, i, t=i) for i in range(1, 301)]) for r in range(4)]
    finding = CallOutcome(views, Reason.TIMEOUT, fr_json={0: "x" * 100})
    deciding, other = Channel(store, "j/0"), Channel(store, "j/0")
    deciding.publish_verdict(finding)
    assert other.verdict() == finding  # it fits: whole
    limit = len(store.data[deciding._k("verdict")]) - 1
    channel_mod.VALUE_MAX, saved = limit, channel_mod.VALUE_MAX
    try:
        deciding.publish_verdict(finding)
    finally:
        channel_mod.VALUE_MAX = saved
    slim = other.verdict()
    assert [len(v.records) for v in slim.views] == [channel_mod.VERDICT_RECORDS] * 4 and slim.fr_json == {}
    assert slim.views[0].records[-1] == views[0].records[-1]


def test_a_watch_in_sync_is_waited_for_past_agree_wait(monkeypatch):
    """A loaded host: the other watch joined but publishes its first summary only after
    ``agree_wait``. The deciding watch waits for it (a verdict late, not blind: judged without the
    other node's records, a cross-node shape mismatch read as gloo's bare message; soak, load 10)."""
    import dataclasses

    from pytest_nccl.watch.engine import nodes
    monkeypatch.setattr(nodes, "TIMING", dataclasses.replace(nodes.TIMING, agree_wait=0.2))
    store = FakeStore()
    deciding = nodes.Nodes(Channel(store, "j/0"), NodeRanks({}), decides=lambda: True)
    slow = Channel(store, "j/0")  # the other watch: joined, no relay thread of its own yet
    slow.join()

    def sync_late():
        time.sleep(0.8)
        slow.synced()
    late = threading.Thread(target=sync_late)
    late.start()
    try:
        t0 = time.monotonic()
        deciding.await_synced(1, time.monotonic())
        assert slow.synced_watches() == 1 and time.monotonic() - t0 >= 0.7
    finally:
        late.join()
        deciding.close()


def test_a_lost_channel_makes_the_other_node_s_ranks_unseen_never_a_hang(tmp_path):
    """Node 1's watch: rank 0 (node 0) was last seen inside all_reduce #8, rank 1 (this node) exited
    normally. While the channel is up, that wait counts; once the channel is lost (the deciding
    watch's store is gone), rank 0 is unseen: no journal, no wait, so the rolling bound never runs
    out on it and its report says so (issue 30: a clean job failed with a hang verdict)."""
    from types import SimpleNamespace

    from collective_records import record

    from pytest_nccl.core.referee import Referee
    from pytest_nccl.core.states import Reason
    from pytest_nccl.watch.engine.follow import Followed, RemoteRank
    from pytest_nccl.watch.engine.monitor import Monitor

    monitor = Monitor(str(tmp_path), TIMEOUT, connect=lambda info, decides: None)
    try:
        channel = Channel(FakeStore(), "j/0")
        silent = SimpleNamespace(ask_agents=lambda ranks, request: {})  # its node does not answer
        rank0 = Followed(0, RemoteRank(0, RankInfo(rank=0), silent))
        rank0.records = [record(0, i, t=i) for i in range(1, 8)] + [record(0, 8, state="entered", t=8)]
        rank1 = Followed(1, RemoteRank(1, RankInfo(rank=1), silent))  # as good as this node's: it completed #8
        rank1.records, rank1.state = [record(1, i, t=i) for i in range(1, 9)], RankState.PASSED
        for f in (rank0, rank1):
            f.source.fetched = f.source.summary  # its records are as fresh as its summary
        monitor.ranks, monitor.world, monitor.node_count = {0: rank0, 1: rank1}, 2, 2
        monitor.nodes = SimpleNamespace(channel=channel, decides=True, close=lambda: None)  # type: ignore[assignment]

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
        assert monitor.report(0, None).state == RankState.UNSEEN
    finally:
        monitor.close()
