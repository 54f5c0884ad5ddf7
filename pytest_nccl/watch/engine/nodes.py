"""This watch among the watches of the job's other nodes (one ``pytest-nccl watch`` per node, as srun
or a cluster's scheduler starts them), through the channel store that the deciding watch hosts and
announces in the job's own store (``channel.py``).

- the watch of the node of rank 0 decides: it reads every other node's summary each tick
  (``summaries``), asks a node for its ranks' records when a rule needs them, and for their stacks
  when a verdict is being made; its finding is the job's (``agree`` publishes it, and returns once
  every other watch took it, or ``WatchTiming.agree_wait`` passed: the channel ends with that watch);
- every other watch follows its own node's ranks only: a relay thread publishes their summary when
  it changed and answers the questions asked of them; it takes the deciding watch's verdict as soon
  as it is published (``decided_elsewhere``), and judges by itself only once the channel is lost
  (rank 0's node is gone).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from ...core.messages import AgentRequest
from ..timing import TIMING
from .channel import CONNECT_WAIT, Ask, Channel, Details, RankSummary
from .follow import Followed, ask_all


class NodeRanks(Protocol):
    """What the relay reads of this node's ranks (the ``Monitor``)."""

    def local_ranks(self) -> dict[int, Followed]: ...

    def summary(self, rank: int) -> RankSummary: ...

    def details(self, rank: int, bases: dict) -> Details: ...

    def keep_from(self, bases: dict) -> None: ...


class Nodes:
    """``channel``: the job's channel; ``ranks``: this node's ranks, as the monitor follows them."""

    def __init__(self, channel: Channel, ranks: NodeRanks, decides: Callable[[], bool]):
        self.channel, self.ranks, self._decides = channel, ranks, decides
        self.node = channel.join()
        self.rank_nodes: dict[int, int] = {}     # deciding watch: rank -> the node that runs it
        self.beats: dict[int, tuple[int, float]] = {}  # deciding watch: node -> (its beat, when it moved)
        self._beat, self._beat_at = 0, 0.0
        self._bases: dict = {}                   # the deciding watch's window bases, as last read
        self.closed: dict[int, bool] = {}        # deciding watch: node -> its watch closed
        self._finals: dict[int, dict] = {}       # ... and its last records, read once
        self._taken = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pytest-nccl-watch-relay", daemon=True)
        self._thread.start()

    @property
    def decides(self) -> bool:
        """This watch's node runs rank 0: its finding is the job's."""
        return self._decides()

    # -- every other node: publish, answer ---------------------------------------------------------------
    def _serve(self) -> None:
        first = True
        while not self._stop.wait(TIMING.serve_every) and not self.channel.lost:
            if self.decides:
                continue  # nobody asks it anything: it asks
            questions, self._bases = self.channel.questions(self.node)
            self.ranks.keep_from(self._bases)
            for number, question in questions:
                self.channel.answer(self.node, number, self._answer(question))
            self._publish()
            if first:
                first = False
                self.channel.synced()

    def _publish(self, closed: bool = False) -> None:
        now = time.monotonic()
        if now >= self._beat_at + TIMING.beat_every:
            self._beat, self._beat_at = self._beat + 1, now
        local = self.ranks.local_ranks()
        if closed:  # what it would have answered, before the summary says it answers no more
            self.channel.publish_final(self.node, {r: self.ranks.details(r, self._bases) for r in local})
        self.channel.publish_summary(self.node, {r: self.ranks.summary(r) for r in local}, self._beat, closed)

    def _answer(self, question: Ask) -> dict:
        local = self.ranks.local_ranks()
        if question.details_of:
            return {r: self.ranks.details(r, question.bases) for r in question.details_of if r in local}
        if question.request is None:
            return {}
        return ask_all([local[r] for r in question.agents_of if r in local], question.request,  # at once
                       TIMING.stacks_wait)

    # -- the deciding watch: read, ask ---------------------------------------------------------------------
    def summaries(self, now: float) -> dict[int, RankSummary]:
        """rank -> its summary, of every other node that published one (two calls)."""
        others = [n for n in range(1, self.channel.watches() + 1) if n != self.node]
        out: dict[int, RankSummary] = {}
        for node, summary in self.channel.summaries(others).items():
            self._note_beat(node, summary.beat, now)
            self.closed[node] = summary.closed
            for rank, ranks in summary.ranks.items():
                self.rank_nodes[rank] = node
                out[rank] = ranks
        return out

    def beat_since(self, node: int, since: float) -> bool:
        """Whether ``node``'s watch published a summary (its beat moved) since ``since``, read now."""
        summary = self.channel.summaries([node]).get(node)
        if summary is not None:
            self._note_beat(node, summary.beat, time.monotonic())
        return node in self.beats and self.beats[node][1] >= since

    def _note_beat(self, node: int, beat: int, now: float) -> None:
        """``node``'s beat as read ``now``: when it last moved is when it was first read different."""
        if self.beats.get(node, (None,))[0] != beat:
            self.beats[node] = (beat, now)

    def silent(self, rank: int, now: float, after: float) -> bool:
        """The watch of the node that runs ``rank`` published nothing for ``after`` seconds (killed,
        or its host is gone)."""
        node = self.rank_nodes.get(rank)
        return node is not None and now - self.beats[node][1] >= after

    def by_node(self, ranks) -> dict[int, list[int]]:
        """node -> those of ``ranks`` it runs (a rank of no known node is left out)."""
        out: dict[int, list[int]] = {}
        for r in ranks:
            if r in self.rank_nodes:
                out.setdefault(self.rank_nodes[r], []).append(r)
        return out

    def ask_agents(self, ranks: list[int], request: AgentRequest, node: int | None = None) -> dict:
        """rank -> its agent's answer to ``request``, for ``ranks`` (all run on ``node``; by default
        the node of the first): one question."""
        node = self.rank_nodes.get(ranks[0]) if node is None else node
        if node is None:
            return {}
        answer = self.channel.ask(node, Ask(request=request, agents_of=tuple(ranks)),
                                  2 * TIMING.stacks_wait + 2 * TIMING.serve_every)
        return answer if isinstance(answer, dict) else {}

    def records(self, node: int, ranks: list[int], bases: dict, timeout: float) -> dict:
        """rank -> ``Details`` of ``ranks`` (all run on ``node``): asked, or as its watch left them when
        it closed (asked then, it would never answer)."""
        if self.closed.get(node):
            if node not in self._finals:
                self._finals[node] = self.channel.final(node)
            return self._finals[node]
        answer = self.channel.ask(node, Ask(details_of=tuple(ranks), bases=bases), timeout)
        return answer if isinstance(answer, dict) else {}

    def await_synced(self, others: int, deadline: float) -> None:
        """Wait (until ``deadline``) for ``others`` other watches to have published their first
        summary: a verdict judges the whole job, not what arrived so far. A watch that joined but is
        not in sync yet (a loaded host) is waited for up to ``CONNECT_WAIT``; one that never joined
        (no watch on that node) only until ``deadline``. (The records a rule reads are asked of each
        node when it reads them: no publishing to wait for.)"""
        latest = time.monotonic() + CONNECT_WAIT
        while not self.channel.lost and self.channel.synced_watches() < others:
            now = time.monotonic()
            if now >= latest or (now >= deadline and self.channel.watches() - 1 <= self.channel.synced_watches()):
                break
            time.sleep(TIMING.serve_every)

    # -- the verdict ----------------------------------------------------------------------------------------
    def decided_elsewhere(self):
        """The deciding watch's finding once it is published (on another node than rank 0's)."""
        if self.decides:
            return None
        finding = self.channel.verdict()
        if finding is not None and not self._taken:
            self._taken = True
            self.channel.acknowledge()
        return finding

    def agree(self, finding):
        """The job's finding: this one, published, on rank 0's node; else the deciding watch's."""
        deadline = time.monotonic() + TIMING.agree_wait
        if self.decides or self.channel.lost:
            self.channel.publish_verdict(finding)
            while (time.monotonic() < deadline and not self.channel.lost
                   and self.channel.acknowledged() < self.channel.watches() - 1):
                time.sleep(TIMING.ask_poll)
            return finding
        while time.monotonic() < deadline and not self.channel.lost:
            decided = self.decided_elsewhere()
            if decided is not None:
                return decided
            time.sleep(TIMING.ask_poll)
        return finding

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive() and not self.decides:  # how its ranks ended, before the
            self._publish(closed=True)                          # channel ends with this watch
