"""Whether a set of dumps is one job at one time, read before the verdict:

- ``check_one_job`` refuses, in one line, dumps of different torch versions, or a rank whose dump
  ends before a collective another member completed (that dump is older, or of another job), and
  returns the one exception to the second rule: ``Ended``;
- ``reread`` gives the dumps with those collectives read as not completed.

A Flight Recorder marks a collective that ended with an error as completed (retired, and counted
in ``pg_status``): gloo's when a peer closes its connection, NCCL's once the communicator is
aborted. So the last collective of a rank, marked completed, that a member of its group never
entered ended without that member: it is where the rank was when that member was gone.

Pure: no torch, no files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.diagnosis.wording import rank_list
from ..core.frdump import FrGroup, RankDump, completed, op_of, seq_of


class Refused(Exception):
    """Dumps that are not one job at one time: the message is the one line that says so."""


@dataclass(frozen=True)
class Ended:
    """A rank's last collective of a group, marked completed, that a member never entered."""
    rank: int
    group: str      # c10d name
    seq: int
    op: str
    absent: int     # the member whose dump ends before it

    def line(self, label: str) -> str:
        return (f"rank {self.rank}'s {self.op} #{self.seq} of group {label} is marked completed, but rank "
                f"{self.absent} never entered it: it ended with an error once rank {self.absent} was gone "
                "(a Flight Recorder marks a failed collective completed), and is read as not completed")


def progress_by_group(dumps: list[RankDump]) -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]:
    """(group -> rank -> last collective entered, group -> rank -> last marked completed), from the
    entries and ``pg_status``; point-to-point ops apart."""
    last: dict[str, dict[int, int]] = {}
    done: dict[str, dict[int, int]] = {}

    def note(into: dict[str, dict[int, int]], name: str, rank: int, seq: int) -> None:
        by_rank = into.setdefault(name, {})
        by_rank[rank] = max(seq, by_rank.get(rank, 0))

    for d in dumps:
        for e in d.entries:
            name, p2p, seq = seq_of(e)
            if p2p or not name:
                continue
            note(last, name, d.rank, seq)
            if completed(e):
                note(done, name, d.rank, seq)
        for name, (enqueued, _, finished) in d.status.items():
            if enqueued >= 0:
                note(last, name, d.rank, enqueued)
            if finished >= 0:
                note(done, name, d.rank, finished)
    return last, done


def check_one_job(dumps: list[RankDump], table: dict[str, FrGroup]) -> list[Ended]:
    """Raise ``Refused`` for dumps that cannot be one job at one time; return the collectives that
    ended without a member (each the last its rank entered in the group, one past that member's)."""
    versions = {d.version for d in dumps if d.version}
    if len(versions) > 1:
        by = {v: [d.rank for d in dumps if d.version == v] for v in sorted(versions)}
        raise Refused("the dumps are not of one job: they were written by different torch versions ("
                      + "; ".join(f"{rank_list(rs)}: schema {v}" for v, rs in by.items()) + ")")
    last, done = progress_by_group(dumps)
    by_rank = {d.rank: d for d in dumps}
    ended = []
    for name, finished in sorted(done.items()):
        group = table.get(name)
        members = set(group.ranks) if group and group.ranks else set(finished)
        entered = {r: seq for r, seq in last.get(name, {}).items() if r in members}
        if not entered:
            continue
        behind, floor = min(entered.items(), key=lambda item: (item[1], item[0]))
        for r, seq in sorted(finished.items()):
            if seq <= floor:
                continue
            if seq == floor + 1 and last[name][r] == seq:
                ended.append(Ended(r, name, seq, op_at(by_rank[r], name, seq), behind))
                continue
            label = group.label if group else name
            raise Refused(f"the dumps are not of one time of one job: rank {behind}'s dump ends at collective "
                          f"#{floor} of group {label}, but rank {r} completed #{seq}, which needs every "
                          f"member: rank {behind}'s dump is older, or of another job")
    return ended


def op_at(dump: RankDump, name: str, seq: int) -> str:
    """The op of a rank's collective ``seq`` of group ``name``, as its dump names it."""
    for e in reversed(dump.entries):
        if seq_of(e) == (name, False, seq):
            return op_of(e)[1]
    return "collective"


def reread(dumps: list[RankDump], ended: list[Ended]) -> list[RankDump]:
    """The dumps with each ``Ended`` collective read as entered, not completed."""
    if not ended:
        return dumps
    by_rank: dict[int, dict[str, int]] = {}
    for e in ended:
        by_rank.setdefault(e.rank, {})[e.group] = e.seq
    out = []
    for d in dumps:
        cut = by_rank.get(d.rank)
        if not cut:
            out.append(d)
            continue
        entries = [reopened(e) if reads_at(e, cut) else e for e in d.entries]
        status = {name: (enqueued, started, finished - 1 if cut.get(name) == finished else finished)
                  for name, (enqueued, started, finished) in d.status.items()}
        out.append(dataclasses.replace(d, entries=entries, status=status))
    return out


def reads_at(entry: dict, cut: dict[str, int]) -> bool:
    """Whether ``entry`` is the collective ``cut`` names for its group."""
    name, p2p, seq = seq_of(entry)
    return not p2p and cut.get(name) == seq


def reopened(entry: dict) -> dict:
    """An entry as entered and not completed: started where it had run, else as scheduled."""
    state = "started" if entry.get("state") == "completed" else entry.get("state")
    return {**entry, "state": state, "retired": False}
