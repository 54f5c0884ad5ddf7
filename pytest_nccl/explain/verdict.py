"""From every rank's dump to one verdict, by the judge the tests and the watch use: the dumps become
the judge's records (``core.frdump``), each rank a running view (a rank with no dump: unseen), and
``core.judge.verdict`` says what it says of a live job. Around it, what only dumps need:

- ``consistency``: dumps of different jobs, or of different times of one job, refused in a line,
  and collectives that ended with an error once a member was gone read as not completed;
- ``numbering``: every group's records cut at one sequence id on every member, so positions line up;
- ``gaps``: what the dumps cannot tell (no dump from a rank, a ring buffer that wrapped);
- ``progress``: of healthy dumps, every group's last completed collective and what is in flight.

Pure: no torch, no files; tested on dumps built by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.diagnosis import Diagnosis
from ..core.diagnosis.wording import TEST, Words, rank_list
from ..core.frdump import FrGroup, Numbering, RankDump, records_of, seq_of
from ..core.groups import DEFAULT
from ..core.judge import verdict
from ..core.records import RankView
from ..core.reports import CallOutcome
from ..core.states import Kind, RankState, Reason
from .consistency import check_one_job, reread
from .testtrace import TestTrace, apply

DUMPS = Words(call="job", left="exited", not_started="never created the default process group",
              passed="exited", raised="raised ", timeout="{} s (the collectives' timeout)",
              stalled="until its dump", exceeded="the {call} was", unseen="left no dump",
              outside="is in no collective", since_last=True,
              spanned="as each rank's Flight Recorder kept them; the collectives' timeout {bound} s")
# what the dumps say when no rank diverges: each of these is where every rank is, not a disagreement
AGREED = frozenset({Kind.HANG, Kind.TIMEOUT})


@dataclass
class Explained:
    """The verdict on a set of dumps, with what a person needs around it."""
    outcome: CallOutcome                      # views, the diagnosis (None: no rank diverges), backend
    world: int
    missing: list[int] = field(default_factory=list)   # ranks with no dump
    gaps: list[str] = field(default_factory=list)      # what the dumps cannot tell, one line each
    progress: list[str] = field(default_factory=list)  # healthy: each group's last completed, in flight
    groups: dict[str, FrGroup] = field(default_factory=dict)

    @property
    def diagnosis(self) -> Diagnosis | None:
        return self.outcome.diagnosis


def world_of(dumps: list[RankDump], world: int | None = None) -> int:
    """The job's size: ``world`` where the user gave it, else the largest rank any dump or group
    names, plus one (gloo's dumps name no group's ranks: a missing last rank is not seen)."""
    top = max(d.rank for d in dumps) if world is None else world - 1
    for d in dumps:
        for g in d.groups.values():
            if g.ranks:
                top = max(top, max(g.ranks))
    return top + 1


def group_table(dumps: list[RankDump], world: int) -> dict[str, FrGroup]:
    """Every group by c10d name, with its global ranks: from a dump's pg_config where one gives them
    (NCCL's), else the ranks whose dumps name the group (gloo's pg_config names none)."""
    table: dict[str, FrGroup] = {}
    named: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    for d in dumps:
        for g in d.groups.values():
            if g.ranks and (g.name not in table or table[g.name].ranks is None):
                table[g.name] = g
            descs.setdefault(g.name, g.desc)
        for name, (enqueued, _, _) in d.status.items():
            if enqueued >= 0:  # a rank that is no member lists the group too, with nothing enqueued
                named.setdefault(name, set()).add(d.rank)
        for e in d.entries:
            pg = e.get("process_group") or ("", "")
            name = str(pg[0])
            named.setdefault(name, set()).add(d.rank)
            if len(pg) > 1 and pg[1]:
                descs[name] = str(pg[1])
    for name, ranks in named.items():
        if not name:
            continue
        if name in table:
            table[name] = FrGroup(name, descs.get(name) or table[name].desc, table[name].ranks)
        elif name == "0" or descs.get(name) == "default_pg":
            table[name] = FrGroup(name, "default_pg", tuple(range(world)))
        else:
            table[name] = FrGroup(name, descs.get(name, ""), tuple(sorted(ranks)))
    return table


def numbering(dumps: list[RankDump], table: dict[str, FrGroup]) -> dict[str, Numbering]:
    """Each group's window start: the latest first sequence id any member kept, so that every
    member's records of the group start at the same collective."""
    start: dict[str, int] = {}
    for d in dumps:
        first: dict[str, int] = {}
        for e in d.entries:
            name, p2p, seq = seq_of(e)
            if not p2p and name not in first:
                first[name] = seq
        for name, seq in first.items():
            start[name] = max(start.get(name, 0), seq)
    return {name: Numbering(g.label, start.get(name, 1), g.ranks) for name, g in table.items()}


def gaps(dumps: list[RankDump], missing: list[int], diag: Diagnosis | None, table: dict[str, FrGroup]) -> list[str]:
    """What the dumps cannot tell, where it matters: ranks with no dump, and ring buffers that wrapped
    (collectives older than a rank's oldest kept entry are unknown)."""
    out = []
    if missing:
        out.append(f"no dump from {rank_list(missing)}: where {'it was' if len(missing) == 1 else 'they were'} "
                   "is not known, nor whether it entered the collectives the others wait in")
    by_label = {g.label: g for g in table.values()}
    wrapped = [d for d in dumps if d.wrapped]
    if wrapped:
        group = by_label.get(diag.pg.removesuffix(":p2p")) if diag is not None and diag.pg else None
        oldest = [(d.rank, d.oldest.get((group.name, False))) for d in wrapped] if group else []
        shown = [f"rank {r} from #{seq}" for r, seq in oldest if seq is not None][:3]
        where = f" (group {group.label}: {', '.join(shown)})" if group and shown else ""
        out.append(f"the ring buffer of {rank_list([d.rank for d in wrapped])} wrapped: collectives before each one's "
                   f"oldest kept entry are not known{where}")
    return out


def progress(views: list[RankView]) -> list[str]:
    """Each group's last collective completed on every member and what is in flight after it."""
    out = []
    groups: dict[str, list] = {}
    for v in views:
        for rec in v.records:
            groups.setdefault(rec.pg, []).append(rec)
    for pg in sorted(groups, key=lambda p: (p != DEFAULT, p)):
        recs = groups[pg]
        done = [r for r in recs if not r.pending]
        pending = [r for r in recs if r.pending]
        line = f"group {pg}: "
        last = max(done, key=lambda r: r.number) if done else None
        line += f"last completed {last.op} #{last.number}" if last else "none completed in the window"
        if pending:
            first = min(pending, key=lambda r: r.number)
            ranks = sorted({r.rank for r in pending if r.number == first.number})
            line += f"; {first.op} #{first.number} in flight on {rank_list(ranks)}"
        out.append(line)
    return out


def explain(dumps: list[RankDump], world: int | None = None, test: TestTrace | None = None) -> Explained:
    """The verdict on one job's dumps (of a ``world``-rank job, where the user knows; of a failed
    test whose trace JSON is ``test``: in the test's words); raises ``Refused`` for dumps that are
    not one job at one time."""
    world = world_of(dumps, world)
    table = group_table(dumps, world)
    ended = check_one_job(dumps, table)
    dumps = reread(dumps, ended)
    numbers = numbering(dumps, table)
    t0 = min((int(e.get("time_created_ns") or 0) for d in dumps for e in d.entries[:1]), default=0)
    by_rank = {d.rank: d for d in dumps}
    views = [RankView(r, status=RankState.RUNNING, records=records_of(by_rank[r], numbers, t0)) if r in by_rank
             else RankView(r, status=RankState.UNSEEN) for r in range(world)]
    missing = [r for r in range(world) if r not in by_rank]
    bound = max((d.timeout_s for d in dumps), default=0.0)
    reason, words = Reason.DUMPED, DUMPS
    if test is not None:
        apply(views, test)
        reason, words, bound = test.reason, TEST, test.bound
        missing = [r for r in missing if views[r].status == RankState.UNSEEN]
    diag = verdict(views, reason, bound, words)
    backend = ",".join(sorted({b for d in dumps for b in d.backend.split(",") if b}))
    # what each rank had entered in each group, by the ids its Flight Recorder counted (the window
    # holds only the last of them)
    counts = {v.rank: {pg: n for rec in v.records for pg, n in [(rec.pg, rec.number)]} for v in views}
    result = Explained(CallOutcome(views=views, reason=Reason.DUMPED, bound=bound, backend=backend,
                                   counts=counts), world, missing, groups=table)
    if diag.kind in AGREED:
        result.progress = progress(views)
    else:
        result.outcome.diagnosis = diag
    result.gaps = gaps(dumps, missing, result.outcome.diagnosis, table)
    result.gaps += [e.line(table[e.group].label if e.group in table else e.group) for e in ended]
    return result
