"""A long job's records, kept as a window: what the referee and the diagnosis read of a job that
runs for hours, at a cost per tick that does not grow with the job.

Each rank's journal is read by offset (``Followed.file``) into its records; past ``2 * KEEP``
records of a group, the oldest go. A collective group's records are dropped from the front on every
rank at once and renumbered from ``base`` (the rules compare positions; each record keeps the
collectives ``before`` it, and the reports print the numbers the ranks counted); a point-to-point
group's, which are not aligned across ranks, rank by rank, keeping their numbers.
"""

from __future__ import annotations

from dataclasses import replace

from ...core.groups import GroupId, members_of
from ...core.journal import JournalTail
from .follow import Followed

KEEP = 1000               # records of a group kept per rank (the window holds KEEP to 2 * KEEP)
# ... by the deciding watch of a job on several nodes: the records of other nodes' ranks are asked
# of them when a rule reads them, and what one answer carries is what the window holds
REMOTE_KEEP = 100


class Window:
    def __init__(self, keep: int = KEEP):
        self.base: dict[str, int] = {}   # group -> collectives dropped before the window
        self.keep = keep
        # another node's deciding watch's bases: its asks for records start there, so this node's
        # window never drops past them (None: no deciding watch elsewhere)
        self.ceiling: dict | None = None

    def read(self, f: Followed) -> None:
        """What the rank's journal gained since the last read, into its window."""
        data = f.file.read()
        if f.file.truncated:  # a new incarnation of the rank: follow it from scratch
            f.file.truncated = False
            f.tail, f.records, f.count, f.kept = JournalTail(f.rank), [], {}, {}
        if not data:
            return
        for rec in f.tail.feed(data):
            f.count[rec.pg] = rec.seq
            f.kept[rec.pg] = f.kept.get(rec.pg, 0) + 1
            if not GroupId.parse(rec.pg).p2p:
                rec.before = self.base.get(rec.pg, 0)
                rec.seq -= rec.before
            f.records.append(rec)

    def trim(self, ranks: dict, world: int) -> None:
        """Keep a window. A collective group's records are dropped from the front on every rank at
        once and renumbered (the rules compare positions); a point-to-point group's, which are not
        aligned across ranks, are dropped rank by rank and keep their numbers."""
        keep = self.keep
        for f in ranks.values():
            for pg, kept in list(f.kept.items()):
                if GroupId.parse(pg).p2p and kept >= 2 * keep:
                    self._drop(f, pg, kept - keep, renumber=0)
        groups = {pg for f in ranks.values() for pg in f.count if not GroupId.parse(pg).p2p}
        for pg in groups:
            members = set(members_of(pg, world))
            entered = [f.count[pg] for r, f in ranks.items() if r in members and pg in f.count]
            base = self.base.get(pg, 0)
            if not entered or min(entered) - base < 2 * keep:
                continue
            shift = min(entered) - keep - base
            if self.ceiling is not None:
                shift = min(shift, self.ceiling.get(pg, 0) - base)
            if shift <= 0:
                continue
            for f in ranks.values():
                if pg in f.kept:
                    self._drop(f, pg, shift, renumber=shift)
            self.base[pg] = base + shift

    def _drop(self, f: Followed, pg: str, n: int, renumber: int) -> None:
        """Drop ``n`` records of ``pg`` from the front of the rank's window, renumbering the rest."""
        base = 0 if GroupId.parse(pg).p2p else self.base.get(pg, 0)
        out, dropped, last = [], 0, 0
        for rec in f.records:
            if rec.pg == pg and dropped < n:
                dropped += 1
                last = rec.seq + base
                continue
            if rec.pg == pg and renumber:
                rec.seq -= renumber
                rec.before += renumber
            out.append(rec)
        f.records = out
        f.kept[pg] -= dropped
        f.tail.forget(pg, last)

    def take(self, f: Followed, records: list) -> None:
        """Another node's rank: its records as its node answered (numbered from its journal's start),
        numbered as this window's."""
        out, kept = [], {}  # type: list, dict[str, int]
        for rec in records:
            if not GroupId.parse(rec.pg).p2p:
                base = self.base.get(rec.pg, 0)
                if rec.seq <= base:
                    continue
                rec.seq, rec.before = rec.seq - base, base
            kept[rec.pg] = kept.get(rec.pg, 0) + 1
            out.append(rec)
        f.records, f.kept = out, kept


def numbered_from_start(f: Followed, bases: dict, keep: int) -> list:
    """The rank's records a deciding watch whose window starts at ``bases`` asks for, numbered from
    its journal's start: a collective group's after the base, a point-to-point group's last ``keep``."""
    p2p_left: dict = {}
    for rec in f.records:
        if GroupId.parse(rec.pg).p2p:
            p2p_left[rec.pg] = p2p_left.get(rec.pg, 0) + 1
    out = []
    for rec in f.records:
        if GroupId.parse(rec.pg).p2p:
            p2p_left[rec.pg] -= 1
            if p2p_left[rec.pg] < keep:
                out.append(replace(rec))
        elif rec.number > bases.get(rec.pg, 0):
            out.append(replace(rec, seq=rec.number, before=0))
    return out
