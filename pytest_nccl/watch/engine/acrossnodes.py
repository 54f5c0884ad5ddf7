"""What crosses the channel between nodes, from a ``Monitor``'s side (``nodes.py`` carries it): on
every other node, its ranks' summaries and records as the relay publishes and answers them
(``nodes.NodeRanks``); on the deciding watch's, the other nodes' ranks followed from their summaries,
and their records asked of their nodes when a rule reads them."""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

from ...core.jobdir import RankInfo
from ...core.messages import AgentRequest
from ...core.reports import RankReport
from ..debug import debug as _debug
from ..timing import TIMING
from .channel import Details, RankSummary
from .follow import Followed, RemoteRank, all_at_once, ask_all
from .window import REMOTE_KEEP, Window, numbered_from_start

if TYPE_CHECKING:
    from .nodes import Nodes


class FollowedRanks(Protocol):
    """What it reads of the monitor."""
    ranks: dict[int, Followed]
    world: int
    window: Window
    lock: threading.RLock

    def read(self, f: Followed) -> None: ...

    def report(self, r: int, answer: dict | None) -> RankReport: ...


class AcrossNodes:
    def __init__(self, monitor: FollowedRanks):
        self.m = monitor
        self.exits: dict[int, str] = {}     # a local rank's exit report (JSON), once it ended

    # -- every other node: what the relay tells the deciding watch of this node's ranks --------------------
    def local_ranks(self) -> dict[int, Followed]:
        return {r: f for r, f in list(self.m.ranks.items()) if f.local}

    def summary(self, rank: int) -> RankSummary:
        f = self.m.ranks[rank]
        if f.state is not None and rank not in self.exits:
            self.exits[rank] = self.m.report(rank, None).to_json()
        return RankSummary(f.file.consumed, dict(f.count), f.fr_progress, self.exits.get(rank))

    def details(self, rank: int, bases: dict) -> Details:
        with self.m.lock:
            f = self.m.ranks[rank]
            self.m.read(f)
            return Details(numbered_from_start(f, bases, REMOTE_KEEP), self.summary(rank))

    def keep_from(self, bases: dict) -> None:
        with self.m.lock:
            self.m.window.ceiling = bases

    # -- the deciding watch: the other nodes' ranks ----------------------------------------------------------
    def summaries(self, nodes: Nodes, silent_after: float = TIMING.node_silent) -> None:
        """Every other node's summary, read (one call), into the ranks followed; the window's bases
        published when they moved (the nodes keep their ranks' records from there). A rank whose
        node published nothing for ``silent_after`` seconds is unseen (its watch is gone)."""
        if nodes.channel.lost:
            return
        m, now = self.m, time.monotonic()
        for rank, summary in nodes.summaries(now).items():
            f = m.ranks.get(rank)
            if f is None and 0 <= rank < m.world:
                info = RankInfo.decode(nodes.channel.info(rank))
                if info is None:
                    continue
                f = m.ranks[rank] = Followed(rank, RemoteRank(rank, info, nodes))
                _debug(f"rank {rank} joined on another node: pid {info.pid} on {info.host}")
            if f is None or not isinstance(f.source, RemoteRank):
                continue
            f.source.summary, f.file.consumed, f.fr_progress = summary, summary.consumed, summary.fr
            f.count = dict(summary.counts)
            silent = nodes.silent(rank, now, silent_after) and summary.exit is None
            if silent != f.unseen:  # where it was last seen is no evidence: never taken for a hang
                f.unseen = silent
                _debug(f"rank {rank}: its node's watch {'stopped answering' if silent else 'answers again'}")
        nodes.channel.publish_bases(dict(m.window.base))

    def ask_all(self, nodes: Nodes | None, followed: list[Followed], request: AgentRequest) -> dict:
        """rank -> its agent's answer to ``request``: this node's ranks asked directly, another node's
        in one question to that node; all at once."""
        local = [f for f in followed if f.local or nodes is None]
        remote = [f.rank for f in followed if not f.local and not f.unseen]
        by_node = nodes.by_node(remote) if nodes is not None and remote else {}
        answers: dict = {}

        def ask_node(node: int) -> None:
            assert nodes is not None  # by_node is empty without it
            asked = time.monotonic()
            reply = nodes.ask_agents(by_node[node], request, node)
            answers.update(reply)
            # the verdict's question unanswered, and not one beat while it waited: that watch is gone
            # (a live one beats every second, however slow its answers)
            if not reply and request is AgentRequest.DUMP and not nodes.beat_since(node, asked):
                self._lost_sight(by_node[node])
        def ask_here() -> None:
            answers.update(ask_all(local, request, TIMING.stacks_wait))
        jobs: list[Callable[[], None]] = [ask_here]
        jobs += [functools.partial(ask_node, n) for n in by_node]
        all_at_once(jobs, 2 * TIMING.stacks_wait + 1.0)
        return answers

    def _lost_sight(self, ranks: list[int]) -> None:
        """A verdict's question to the node of ``ranks`` went unanswered and its watch did not beat
        meanwhile: it is gone (killed a moment ago: its last beat is younger than the three a verdict
        waits for), so where its ranks were last seen is no evidence, as for a node that missed its
        beats."""
        for r in ranks:
            f = self.m.ranks.get(r)
            if f is not None and f.state is None and not f.unseen:
                f.unseen = True
                _debug(f"rank {r}: its node's watch did not answer the verdict's question")

    def fresh_records(self, nodes: Nodes, ranks: list | None = None, every: bool = False) -> None:
        """The records of the other nodes' ranks (``ranks``: of those) whose summary moved since
        they were last asked for (``every``: moved or not; their watches read them when asked),
        asked of their nodes at once (a rule reads them now)."""
        m = self.m
        stale = {f.rank: (f, f.source) for f in list(m.ranks.values())
                 if isinstance(f.source, RemoteRank) and not f.unseen and (every or f.source.stale)
                 and (ranks is None or f.rank in ranks)}
        if not stale:
            return
        asked = {r: source.summary for r, (f, source) in stale.items()}
        bases, by_node = dict(m.window.base), nodes.by_node(stale)
        answers: dict = {}

        def ask_node(node: int) -> None:
            answers.update(nodes.records(node, by_node[node], bases, TIMING.details_wait))
        all_at_once([functools.partial(ask_node, n) for n in by_node], TIMING.details_wait + 0.5)
        with m.lock:
            for r, (f, source) in stale.items():
                answer = answers.get(r)
                if isinstance(answer, Details):
                    m.window.take(f, answer.records)
                    source.fetched = asked[r]
                else:
                    _debug(f"rank {r}: its node did not answer for its records")
