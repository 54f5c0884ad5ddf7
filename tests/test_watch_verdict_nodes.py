"""The deciding watch at a verdict, for the ranks of other nodes (``engine/acrossnodes.py``): a node
whose watch neither answers the verdict's question nor beats meanwhile is unseen there (a
watch killed a second before the verdict still had a fresh beat; CI saw its rank reported "running,
outside any collective", where it had been ended with its node)."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_nccl.core.messages import AgentRequest
from pytest_nccl.watch.engine.acrossnodes import AcrossNodes
from pytest_nccl.watch.engine.channel import Details, RankSummary


class Nodes:
    """Other nodes: node 1's watch is gone, node 2's answers, node 3's is too slow to answer but
    still beats."""

    def by_node(self, ranks):
        return {node: [r for r in ranks if r // 2 == node] for node in sorted({r // 2 for r in ranks})}

    def ask_agents(self, ranks, request, node):
        return {r: {"stack": f"rank {r}'s stack"} for r in ranks} if node == 2 else {}

    def beat_since(self, node, since):
        return node != 1


def followed(rank: int):
    return SimpleNamespace(rank=rank, local=False, unseen=False, state=None)


def test_a_node_that_neither_answers_the_verdicts_question_nor_beats_is_unseen():
    ranks = {r: followed(r) for r in (2, 3, 4, 5, 6, 7)}
    across = AcrossNodes(SimpleNamespace(ranks=ranks))
    answers = across.ask_all(Nodes(), list(ranks.values()), AgentRequest.DUMP)
    assert answers == {4: {"stack": "rank 4's stack"}, 5: {"stack": "rank 5's stack"}}
    # node 3's watch beat while the question waited: slow, not gone (its ranks keep their places)
    assert [r for r, f in ranks.items() if f.unseen] == [2, 3]


def test_a_progress_question_unanswered_decides_nothing():
    """The Flight Recorder's progress is asked while the job runs: a loaded node may miss one, and
    its beats (``summaries``) say whether its watch lives."""
    ranks = {r: followed(r) for r in (2, 3)}
    AcrossNodes(SimpleNamespace(ranks=ranks)).ask_all(Nodes(), list(ranks.values()), AgentRequest.FR)
    assert not any(f.unseen for f in ranks.values())


class RecordNodes:
    """Node 1 runs rank 3 and answers for its records (none here: what was asked is the point)."""

    def __init__(self):
        self.asked: list = []

    def by_node(self, ranks):
        return {1: sorted(ranks)}

    def records(self, node, ranks, bases, timeout):
        self.asked.append(sorted(ranks))
        return {r: Details([], RankSummary(7)) for r in ranks}


def test_at_a_verdict_another_node_s_rank_is_asked_for_its_records_moved_or_not():
    """Rank 3's node had not yet published that it read rank 3's last record (it publishes once a
    second) when rank 0's error decided the call: the verdict asks for it anyway (CI saw a shape
    mismatch across nodes judged without rank 3's all_gather, so without the shapes)."""
    import threading

    from pytest_nccl.watch.engine.follow import Followed, RemoteRank
    from pytest_nccl.watch.engine.window import Window
    nodes = RecordNodes()
    source = RemoteRank(3, SimpleNamespace(), nodes)
    source.summary = source.fetched = RankSummary(7)  # nothing moved since it was last asked
    m = SimpleNamespace(ranks={3: Followed(3, source)}, window=Window(), lock=threading.RLock())
    across = AcrossNodes(m)
    across.fresh_records(nodes)
    assert nodes.asked == []  # while the job runs: only what moved
    across.fresh_records(nodes, every=True)
    assert nodes.asked == [[3]]


def test_the_verdict_s_journals_ask_the_other_nodes_afresh():
    from pytest_nccl.core.call import Dumps
    from pytest_nccl.watch.engine.jobview import JobView
    calls = []
    m = SimpleNamespace(ranks={}, world=0, fresh_records=lambda ranks=None, every=False: calls.append(every))
    JobView(m).final_journals({}, Dumps())
    assert calls[0] is True, calls
