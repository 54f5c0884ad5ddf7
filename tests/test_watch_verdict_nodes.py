"""The deciding watch at a verdict, for the ranks of other nodes (``engine/acrossnodes.py``): a node
whose watch neither answers the verdict's question nor beats meanwhile is unseen there (a
watch killed a second before the verdict still had a fresh beat; CI saw its rank reported "running,
outside any collective", where it had been ended with its node)."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_nccl.core.messages import AgentRequest
from pytest_nccl.watch.engine.acrossnodes import AcrossNodes


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
