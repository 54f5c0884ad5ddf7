"""This watch among the watches of the job's other nodes (one ``pytest-nccl watch`` per node, as srun
or a cluster's scheduler starts them), through the channel store that the deciding watch hosts and
announces in the job's own store (``channel.py``).

- a relay thread publishes what this watch follows of its node's ranks (their journals, read from
  the start by a reader of its own, exit reports, progress) and answers the questions other watches
  ask of its ranks' agents (stacks, Flight Recorder);
- every watch judges the whole job from the same data, and all give one verdict: the watch of the
  node of rank 0 decides (``agree`` publishes its finding, and returns once every other watch took
  it, or ``WatchTiming.agree_wait`` passed: the channel ends with that watch); the others take it
  as soon as it is published (``decided_elsewhere``), or give their own when none comes within
  ``WatchTiming.agree_wait`` (rank 0's node is gone).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..core.reports import RankReport
from . import jobdir
from .channel import CONNECT_WAIT, Channel
from .follow import JournalFile
from .timing import TIMING


class Nodes:
    """``channel``: the job's channel; ``local()``: the ``Followed`` ranks of this node, rank -> it;
    ``ended(rank)``: how a local rank ended (its full report), or None while it runs."""

    def __init__(self, channel: Channel, local: Callable[[], dict], ended: Callable[[int], RankReport | None]):
        self.channel, self.local, self.ended = channel, local, ended
        self._readers: dict[int, JournalFile] = {}
        self._published_exits: set = set()
        self._taken = False
        channel.join()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pytest-nccl-watch-relay", daemon=True)
        self._thread.start()

    @property
    def decides(self) -> bool:
        """This watch's node runs rank 0: its finding is the job's."""
        return 0 in self.local()

    def _serve(self) -> None:
        first, flushed = True, 0
        while not self._stop.wait(TIMING.serve_every) and not self.channel.lost:
            wanted = self.channel.flush_requests()  # read before publishing: this tick answers them
            for rank, f in list(self.local().items()):
                self._publish(rank, f)
                for number, request in self.channel.questions(rank):
                    answer = f.ask(request, TIMING.stacks_wait) if request is not None else {"error": "unknown request"}
                    self.channel.answer(rank, number, answer)
            if first:
                first = False
                self.channel.synced()
            for number in range(flushed + 1, wanted + 1):
                self.channel.flushed(number)
            flushed = max(flushed, wanted)

    def await_synced(self, others: int, deadline: float) -> None:
        """Wait (until ``deadline``) for ``others`` other watches to have published what their nodes'
        ranks wrote before they joined: a verdict judges the whole job, not what arrived so far. A
        watch that joined but is not in sync yet (a loaded host) is waited for up to
        ``CONNECT_WAIT``; one that never joined (no watch on that node) only until ``deadline``."""
        latest = time.monotonic() + CONNECT_WAIT
        while not self.channel.lost and self.channel.synced_watches() < others + 1:
            now = time.monotonic()
            if now >= latest or (now >= deadline and self.channel.watches() <= self.channel.synced_watches()):
                break
            time.sleep(TIMING.serve_every)
        self._await_flushed(deadline)

    def _await_flushed(self, deadline: float) -> None:
        """Every other watch in sync has published what its ranks wrote up to now (a loaded host: its
        relay may lag seconds behind a rank that entered the diverging collective). A watch in sync
        answers, however loaded its host: waited for up to ``CONNECT_WAIT`` while the channel holds
        (a verdict late, not a verdict blind: judged without the other node's records, a shape
        mismatch across nodes read as gloo's bare 'invalid tensor size' on a host at load 10)."""
        watches = self.channel.synced_watches()  # this one's relay answers too
        if watches <= 1 or self.channel.lost:
            return
        number = self.channel.request_flush()
        until = max(deadline, time.monotonic() + CONNECT_WAIT)
        while (time.monotonic() < until and not self.channel.lost
               and self.channel.flushed_watches(number) < watches):
            time.sleep(TIMING.serve_every)

    def _publish(self, rank: int, f) -> None:
        reader = self._readers.get(rank)
        if reader is None:
            reader = self._readers[rank] = JournalFile(jobdir.journal(f.source.directory, rank))
        self.channel.push(rank, reader.read())
        if rank not in self._published_exits:
            report = self.ended(rank)
            if report is not None:
                # what the rank wrote before its exit record may have come after the read above: the
                # other watches get the whole journal before they hear it finished
                self.channel.push(rank, reader.read())
                self.channel.publish_exit(report)
                self._published_exits.add(rank)

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
        if not self._thread.is_alive():  # what the ranks wrote last and how they ended, before the
            for rank, f in list(self.local().items()):  # channel ends with this watch
                self._publish(rank, f)
        for reader in self._readers.values():
            reader.close()
