"""The notes of the members of groups outside c10d (vLLM's ``StatelessProcessGroup`` and PyNccl,
``rank/trace_vllm.py``) in one attempt's directory, read on every tick and judged by the one rule
(``core.sidecalls.judge``); a group that waits ``outcome.SIDE_GROUP_NOTICE`` seconds is said once
before its verdict (``core.sidecalls.notice``), as a c10d side group's creation is.

The notes are shared with the other watches of each group through its own store (``SideJoin``,
``core.sidejoin``): the rule reads them all, and the first watch to decide decides for every one."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from ...core import jobdir
from ...core.sidecalls import SideCall, SideVerdict, group_key, judge, notice
from ...core.sidejoin import ACK_WAIT, Heard, Shared, live_others, may_end, merge
from .outcome import notice_after
from .sidejoin import SideJoin

PREFIX = "sidecall-"


def notes(directory: str) -> tuple[list, dict]:
    """The notes of this host's members, and which of their processes still run (pid -> bool)."""
    found, alive = [], {}
    host = socket.gethostname()
    for name in jobdir.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(".json"):
            note = SideCall.decode(jobdir.read_json(os.path.join(directory, name)))
            if note is not None and note.host == host:
                found.append(note)
                alive[note.pid] = jobdir.process_start(note.pid) == note.start
    return found, alive


@dataclass(frozen=True)
class _Held:
    """The group's verdict as this watch has it since ``at`` (monotonic): its own (``decided_here``:
    the store holds it, or the store could not be asked) or another watch's, taken."""
    verdict: SideVerdict
    at: float
    decided_here: bool


class SideCalls:
    """The side groups of one attempt's directory: their notes read once a tick, with the other
    watches' (``verdict``), and the groups whose wait was said (``notice``)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.found: list = []
        self.alive: dict = {}
        self.said: set = set()
        self.join = SideJoin()
        self.heard = Heard()
        self.proposed: _Held | None = None  # this watch's verdict, put to the group's store
        self.held: _Held | None = None      # the group's verdict

    def verdict(self, timeout: float) -> SideVerdict | None:
        """The notes read now, merged with those the other watches of their groups published; the
        group's one verdict once this watch may end its command on it, or None (keep waiting)."""
        own, own_alive = notes(self.directory)
        self.join.offer(own, own_alive)
        now = time.monotonic()
        others = [(record, self.heard.peer(record, now)) for record in self.join.others()]
        self.found, self.alive = merge(own, own_alive, others)
        if self.held is None and (theirs := self.join.stored()) is not None:  # another watch decided first
            self.held = _Held(theirs.verdict, now, decided_here=False)
        if self.held is None and self.proposed is None:
            found = judge(self.found, time.time(), timeout, self.alive) if self.found else None
            if found is None or not self.join.joined(found.group):
                return found  # no other watch to agree with: as without the join
            self.proposed = _Held(found, now, decided_here=True)
            self.join.propose(Shared(self.join.watch, found))
        if self.held is None and self.proposed is not None:
            self.held = self._answered(self.proposed, now)
        return self._ends(self.held, own, others, now) if self.held is not None else None

    def _answered(self, mine: _Held, now: float) -> _Held | None:
        """The store's verdict once it answered this watch's (its own, or one put there first);
        this watch's own when the store cannot answer (gone, or silent for ``ACK_WAIT``: a failure
        of the join is no reason to hold a verdict back); None meanwhile."""
        answer = self.join.answer(mine.verdict.group)
        if answer is not None:
            return _Held(answer.verdict, mine.at, decided_here=answer.watch == self.join.watch)
        if now - mine.at >= ACK_WAIT or not self.join.joined(mine.verdict.group):
            return mine
        return None

    def _ends(self, held: _Held, own: list, others: list, now: float) -> SideVerdict | None:
        """``held``, once this watch may end its command on it (``core.sidejoin.may_end``)."""
        group = held.verdict.group
        if not held.decided_here:
            self.join.acknowledge()
        if not self.join.joined(group):  # the store is gone: nobody to wait for
            return held.verdict
        hosts = any(n.member == 0 and group_key(n) == group for n in own)
        ends = may_end(decided_here=held.decided_here, hosts_store=hosts, taken=self.join.taken(group),
                       live=live_others(others), waited=now - held.at)
        return held.verdict if ends else None

    def notice(self, timeout: float) -> str | None:
        """The line, once per group, for one that waited ``SIDE_GROUP_NOTICE`` seconds (none where
        --timeout comes as soon), from the last ``verdict``'s notes."""
        after = notice_after(timeout)
        if after is None or not self.found:
            return None
        return notice(self.found, time.time(), after, timeout, self.said, self.alive)

    def close(self) -> None:
        """The watch ends: its last notes published (closed), the join's thread and clients gone."""
        self.join.close(*notes(self.directory))


def side_callers(directory: str) -> int:
    """How many of this host's processes reported through a group outside c10d (a note each)."""
    return len(notes(directory)[1])
