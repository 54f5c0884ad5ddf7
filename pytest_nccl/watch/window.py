"""A long job's records, kept as a window: what the referee and the diagnosis read of a job that
runs for hours, at a cost per tick that does not grow with the job.

Each rank's journal is read by offset (``Followed.file``) into its records; past ``2 * KEEP``
records of a group, the oldest go. A collective group's records are dropped from the front on every
rank at once and renumbered from ``base`` (the rules compare positions; each record keeps the
collectives ``before`` it, and the reports print the numbers the ranks counted); a point-to-point
group's, which are not aligned across ranks, rank by rank, keeping their numbers.
"""

from __future__ import annotations

from ..core.groups import members_of
from ..core.journal import JournalTail
from .follow import Followed

KEEP = 1000               # records of a group kept per rank (the window holds KEEP to 2 * KEEP)


class Window:
    def __init__(self):
        self.base: dict[str, int] = {}   # group -> collectives dropped before the window

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
            if not rec.pg.endswith(":p2p"):
                rec.before = self.base.get(rec.pg, 0)
                rec.seq -= rec.before
            f.records.append(rec)

    def trim(self, ranks: dict, world: int) -> None:
        """Keep a window. A collective group's records are dropped from the front on every rank at
        once and renumbered (the rules compare positions); a point-to-point group's, which are not
        aligned across ranks, are dropped rank by rank and keep their numbers."""
        for f in ranks.values():
            for pg, kept in list(f.kept.items()):
                if pg.endswith(":p2p") and kept >= 2 * KEEP:
                    self._drop(f, pg, kept - KEEP, renumber=0)
        groups = {pg for f in ranks.values() for pg in f.count if not pg.endswith(":p2p")}
        for pg in groups:
            members = set(members_of(pg, world))
            entered = [f.count[pg] for r, f in ranks.items() if r in members and pg in f.count]
            base = self.base.get(pg, 0)
            if not entered or min(entered) - base < 2 * KEEP:
                continue
            shift = min(entered) - KEEP - base
            for f in ranks.values():
                if pg in f.kept:
                    self._drop(f, pg, shift, renumber=shift)
            self.base[pg] = base + shift

    def _drop(self, f: Followed, pg: str, n: int, renumber: int) -> None:
        """Drop ``n`` records of ``pg`` from the front of the rank's window, renumbering the rest."""
        base = 0 if pg.endswith(":p2p") else self.base.get(pg, 0)
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

