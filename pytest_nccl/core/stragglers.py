"""Stragglers in a healthy job: which rank arrives last at a group's collectives, and how long the
others waited for it. Pure: works on the journals' records (``core.journal``), tested on data.

The ranks' journal clocks start at different moments, so enter times cannot be compared across
ranks. A synchronous collective, though, completes on every rank at about the same moment (it
completes once its last member has arrived): the time a rank spent inside it is the time it waited
for the last member plus the transfer. So the rank with the shortest time inside arrived last, and
every other rank waited ``its time inside - the shortest`` for it. No clock is shared, nothing is
added to the collective path: the E and C lines every rank writes anyway.

Only synchronous collectives that completed on every member count (an async op's C line comes at
``wait()``, after the rank's own work: its time inside says nothing about arrival).
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import CollectiveRecord
from .states import RecordState, Source

# quiet unless one rank is last this often: with even ranks who arrives last is chance (1/n each)
MIN_SHARE = 0.75
MIN_COLLECTIVES = 10       # fewer compared collectives say nothing
MIN_WAIT_S = 1.0           # the others' wait for it, in all, below which it is no news
MIN_WAIT_EACH_S = 0.005    # per collective it came last: below this it is noise between clocks


@dataclass(frozen=True)
class Straggler:
    """``rank`` arrived last at ``last`` of the ``compared`` collectives of ``group`` that every member
    completed; the others waited ``waited_s`` seconds in all (summed over them) at those."""
    group: str
    rank: int
    last: int
    compared: int
    waited_s: float

    @property
    def share(self) -> float:
        return self.last / self.compared if self.compared else 0.0

    def line(self) -> str:
        """'group default: rank 3 arrived last at 92% of 1,200 collectives; the others waited 41 s in all'"""
        return (f"group {self.group}: rank {self.rank} arrived last at {self.share:.0%} of {self.compared:,} "
                f"collective{'s' if self.compared != 1 else ''}; the others waited {_seconds(self.waited_s)} in all")

    def to_json(self) -> dict:
        return {"group": self.group, "rank": self.rank, "last": self.last, "compared": self.compared,
                "waited_s": round(self.waited_s, 3)}


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:,.0f} s"


def _counted(rec: CollectiveRecord) -> bool:
    return (rec.state == RecordState.COMPLETED and rec.duration is not None and not rec.async_op
            and not rec.p2p and rec.source != Source.OUTSIDE)


def stragglers(records: dict[int, list[CollectiveRecord]], members: dict[str, int] | None = None) -> list[Straggler]:
    """The straggler of each group, if it has one, by group name. ``records``: each rank's journal
    records; ``members``: how many ranks each group has (default: the ranks that journaled it). A
    collective counts when every member completed it synchronously."""
    inside: dict[tuple[str, int], dict[int, float]] = {}
    seen: dict[str, set] = {}
    for rank, recs in records.items():
        for rec in recs:
            seen.setdefault(rec.pg, set()).add(rank)
            if _counted(rec):
                inside.setdefault((rec.pg, rec.seq), {})[rank] = rec.duration or 0.0
    last: dict[str, dict[int, int]] = {}
    waited: dict[str, dict[int, float]] = {}
    compared: dict[str, int] = {}
    for (pg, _), times in inside.items():
        size = (members or {}).get(pg, len(seen[pg]))
        if len(times) < max(2, size):
            continue
        rank = min(times, key=lambda r: (times[r], r))
        shortest = times[rank]
        compared[pg] = compared.get(pg, 0) + 1
        last.setdefault(pg, {})[rank] = last.get(pg, {}).get(rank, 0) + 1
        waited.setdefault(pg, {})[rank] = waited.get(pg, {}).get(rank, 0.0) + sum(t - shortest for t in times.values())
    found = []
    for pg in sorted(compared):
        rank = max(last[pg], key=lambda r: (last[pg][r], -r))
        straggler = Straggler(pg, rank, last[pg][rank], compared[pg], waited[pg][rank])
        if (straggler.compared >= MIN_COLLECTIVES and straggler.share >= MIN_SHARE
                and straggler.waited_s >= MIN_WAIT_S and straggler.waited_s >= MIN_WAIT_EACH_S * straggler.last):
            found.append(straggler)
    return found
