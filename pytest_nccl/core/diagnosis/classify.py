"""Pure analysis: per-rank records and outcomes -> the first divergence and a one-line headline.

No torch, no processes (like torch's flight_recorder ``builder.py`` / ``utils.py``): everything here
is tested on hand-written data. The controller calls ``diagnose(ranks, reason, bound)``. What it
finds, in order (docs/diagnosis.md shows each with its headline):

1. an argument the ranks disagree on at the same position of a group: op, dtype, shape, root, reduce
   op, split sizes (``first_divergence``); a send and the receive it pairs with that disagree on
   shape or dtype (``pairing.crossed_pairs``), even where both completed;
2. a rank that left, raised or died while others wait for it;
3. a certain deadlock (``waits.stuck_ranks``): point-to-point transfers that can never pair, or
   ranks blocked in collectives of different groups, each waiting for the other; blame goes by
   issue order, never by timing or by the order the journals were read;
4. a slow rank, a true hang, a timeout outside any collective.

Headlines group ranks that share a view ("ranks 0-14 all_reduce, rank 15 barrier").
"""

from __future__ import annotations

from ..agreement import split_disagreement
from ..groups import GroupId, members_of
from ..records import CollectiveRecord, RankView
from ..sites import headline_site, rendezvous_at
from ..states import Kind, RankState, Reason, RecordState
from ..waits import stuck_ranks
from .cascade import cascade_line, transfer_chain
from .deadlock import deadlock_diagnosis
from .divergence import PEER_GONE, divergences, first_divergence, gloo_disagreement
from .findings import Diagnosis, Divergence
from .outside import NO_FUNCTION, busy_at, in_rendezvous
from .pairing import crossed_pairs, pairing_diagnosis
from .wording import (
    HEADLINE_WIDTH,
    SHOWN_VALUES,
    TEST,
    Words,
    brief,
    ended_in,
    grouped,
    rank_list,
    state_of,
    waiting_for,
    waiting_summary,
    where,
)

SPLITS_SHOWN = 8  # split sizes a headline lists whole; a larger group's: the one in question


def diagnose(ranks: list[RankView], reason: Reason, bound: float, words: Words = TEST) -> Diagnosis | None:
    """``reason``: "completed" (every rank finished), "decided" (a rule found the outcome), "timeout"
    (the bound was hit). Returns None for a clean pass. The same views give the same diagnosis
    whatever their order; ``words``: a test's or a job's."""
    ranks = sorted(ranks, key=lambda v: v.rank)
    found = divergences(ranks)  # every group's first divergence: the cascade reads them all
    div = first_divergence(ranks, found)
    failed = [v for v in ranks if v.status == RankState.FAILED]
    dead = [v for v in ranks if v.status == RankState.DEAD]
    running = [v for v in ranks if v.status == RankState.RUNNING]

    if div is not None and div.kind != Kind.RANK_LEFT:
        return _mismatch(div, ranks)
    views = {v.rank: v for v in ranks}
    crossed = crossed_pairs(views)
    if crossed:  # before what the ranks did next: a wrong size gloo rejects, or a hang, follows from it
        return pairing_diagnosis(crossed, ranks)
    if div is not None and _left_first(div, views).finished:
        return _absent(div, views, reason, bound, words, [d for _, d in found])
    said = [(v, found) for v in dead + failed for found in [gloo_disagreement(v.output + "\n" + v.message)] if found]
    if said:
        # no records that show it (trace off, or the rank died before writing), but gloo said it
        victim, (kind, line) = min(said, key=lambda item: item[0].rank)
        what = victim.exit_description if victim.status == RankState.DEAD else "raised it"
        return Diagnosis(kind, f"{kind.replace('-', ' ')} in a collective (gloo on rank {victim.rank}: "
                         f"{brief(line, 120)}); rank {victim.rank} {what}{waiting_summary(ranks)}", [victim.rank])
    if dead:
        first = min(dead, key=lambda v: (len(v.records), v.rank))  # the earliest in issue order, not in time
        rest = {v.rank: v.exit_description for v in dead if v is not first}
        also = f"; also {grouped(rest)}" if rest else ""
        return Diagnosis(Kind.DIED, f"{rank_list([first.rank])} {first.exit_description}{also}"
                         f"{waiting_summary(ranks)}", [first.rank])
    if failed:
        return _raised(failed, ranks)
    stuck = stuck_ranks(views)
    if stuck:
        return deadlock_diagnosis(stuck, views)
    if div is not None:
        return _absent(div, views, reason, bound, words, [d for _, d in found])
    if running:
        inside = [v for v in running if v.current is not None]
        at = [rec for rec in (v.current for v in inside) if rec is not None]  # their records, in that order
        if inside and len(inside) == len(running) and len({(rec.pg, rec.seq) for rec in at}) == 1:
            return _hang(running, views, at, bound, words)
        busy = [v for v in running if v.current is None]
        if busy and inside:
            return _slow(busy, inside, at[0], bound, words)
        tops = grouped({v.rank: busy_at(v, views) for v in running}, 2)
        kind = Kind.RENDEZVOUS if any(in_rendezvous(v) for v in running) else Kind.TIMEOUT
        return Diagnosis(kind, f"{words.over(bound)} outside any collective "
                         f"({tops})", [v.rank for v in running])
    statuses = {v.status for v in ranks}
    if RankState.SKIPPED in statuses and len(statuses) > 1:
        skipped = [v.rank for v in ranks if v.status == RankState.SKIPPED]
        others = [v.rank for v in ranks if v.status != RankState.SKIPPED]
        return Diagnosis(Kind.SKIP_MISMATCH, f"pytest.skip was called on {rank_list(skipped)} only "
                         f"({views[skipped[0]].message}); {rank_list(others)} did not skip: "
                         "skip on every rank or on none", skipped)
    return None


def _hang(running: list[RankView], views: dict, at: list[CollectiveRecord], bound: float,
          words: Words) -> Diagnosis:
    """Every running rank waits in the same collective (``at``: their records) and none completed it. The ranks that
    finished are named by how they ended, not counted as having entered it: only the members of the
    group (the peers of a transfer) are, and one that finished has left it (completed, or never in)."""
    names, rec = [v.rank for v in running], at[0]
    within = f"within {words.bound(bound)}"
    inside = "waiting for" if rec.state == RecordState.IN_FLIGHT else "inside"  # NCCL: at a sync point
    if len(running) == len(views):
        # in flight: every rank's CPU got past it, so what holds it is on the device, not a peer
        why = ("every rank enqueued it: a kernel before it on a stream that does not finish, or a transport "
               "problem" if rec.state == RecordState.IN_FLIGHT else "a transport or peer problem: all ranks entered it")
        return Diagnosis(Kind.HANG, f"every rank is {inside} {where(rec)} and none completed {within} ({why})",
                         names, rec.pg, rec.seq)
    if rec.p2p:
        members = set(names) | {p.peer for r in at for p in (r.blocking_p2p() or r.p2p)}
    else:
        members = set(members_of(rec.pg, len(views)))
    finished = {r: state_of(v, rec.pg, views, words=words) for r, v in views.items()
                if r in members and r not in names}
    why = f": {grouped(finished, 2)}" if finished else ""
    who = f"{rank_list(names)} is {inside} {where(rec)} and did not complete it" if len(names) == 1 else \
        f"{rank_list(names)} are {inside} {where(rec)} and none completed it"
    return Diagnosis(Kind.HANG, f"{who} {within} (a transport or peer problem{why})", names, rec.pg, rec.seq)


def _raised(failed: list[RankView], ranks: list[RankView]) -> Diagnosis:
    by_message: dict[str, list[int]] = {}
    for v in failed:
        by_message.setdefault(v.message or v.exc_type, []).append(v.rank)
    parts = [f"{rank_list(rs)} raised {brief(msg, 160)}" for msg, rs in by_message.items()]
    more = f"; {len(parts) - 2} more different errors" if len(parts) > 3 else ""
    return Diagnosis(Kind.RAISED, "; ".join(parts[:3] if not more else parts[:2]) + more + waiting_summary(ranks),
                     [v.rank for v in failed])


def _consequence(view: RankView) -> str:
    if view.status == RankState.DEAD:
        return f"rank {view.rank} {view.exit_description} inside it"
    found = gloo_disagreement(view.message)
    if found:  # gloo's own check of the same disagreement, in its words
        return f"gloo rejected it on rank {view.rank} ({found[1].strip().rstrip('.')})"
    return f"rank {view.rank} raised {brief(view.message)}"


def _mismatch(div: Divergence, ranks: list[RankView]) -> Diagnosis:
    recs = div.records
    first = next(iter(recs.values()))
    pos = f"#{first.number} of group {div.pg}"
    odd: list[int] = []
    if div.kind == Kind.OP_MISMATCH:
        what = f"op mismatch at collective {pos}: {grouped({r: rec.op for r, rec in recs.items()})}"
    elif div.kind == Kind.SPLIT_MISMATCH:
        pairs = split_disagreement(recs, div.pg, len(ranks))
        sender, receiver, sent, expected = pairs[0]
        sends = (recs[sender].split_lists() or ([], []))[0]
        more = f", and {len(pairs) - 1} more pair{'s' if len(pairs) > 2 else ''}" if len(pairs) > 1 else ""
        if len(sends) <= SPLITS_SHOWN:  # all it sends, one size per rank of the group
            whom = "expects" if sender == receiver else f"rank {receiver} expects"
            what = (f"split mismatch in {first.op} {pos}: rank {sender} sends {sends} but {whom} {expected} from "
                    f"{'itself' if sender == receiver else 'it'}{more}")
        else:  # a large group: the one size in question
            to = "itself" if sender == receiver else f"rank {receiver}"
            what = (f"split mismatch in {first.op} {pos}: rank {sender} sends {sent} to {to} but it expects "
                    f"{expected}{more}")
        odd = sorted({p[0] for p in pairs})
    else:
        name, value = {Kind.DTYPE_MISMATCH: ("dtype", lambda rec: rec.dtype or "?"),
                       Kind.SHAPE_MISMATCH: ("shape", lambda rec: rec.shapes or "?"),
                       Kind.ROOT_MISMATCH: ("root", lambda rec: rec.root_text),
                       Kind.REDUCE_OP_MISMATCH: ("reduce-op", lambda rec: rec.reduce_op)}[div.kind]
        what = f"{name} mismatch in {first.op} {pos}: {grouped({r: value(rec) for r, rec in recs.items()})}"
    site = headline_site(first.site)
    if site:
        what += f" (from {site}{_other_sites(recs, site)})"
    views = {v.rank: v for v in ranks}
    died = any(views[r].status == RankState.DEAD for r in recs)
    consequences = [_consequence(views[r]) for r in recs if views[r].status == RankState.DEAD or (
        views[r].status == RankState.FAILED and not (died and any(m in views[r].message for m in PEER_GONE)))]
    if len(consequences) > 2:
        consequences = consequences[:2] + [f"{len(consequences) - 2} more ranks failed"]
    if div.absent:
        consequences.append(f"{rank_list(div.absent)} never entered it")
    if not consequences and all(not rec.pending for rec in recs.values()):
        consequences.append("the backend completed it without an error: its result is wrong")
    if consequences:
        what += "; " + "; ".join(consequences)
    what += _threads_race(recs, views, div.pg)
    if not odd:  # the rank(s) whose value differs from the majority
        values: dict = {}
        for r, rec in recs.items():
            values.setdefault(rec.signature, []).append(r)
        odd = min(values.values(), key=len) if len(values) > 1 else []
    return Diagnosis(div.kind, what, sorted(odd), div.pg, div.seq, div)


def _other_sites(recs: dict, first_site: str) -> str:
    """'; rank 3 from b.py:22': the other lines ranks issued the diverging collective from (a rank
    running one more micro-batch than the others), each once."""
    by_site: dict[str, list[int]] = {}
    for r, rec in recs.items():
        by_site.setdefault(headline_site(rec.site), []).append(r)
    return "".join(f"; {rank_list(rs)} from {s}" for s, rs in list(by_site.items())[:SHOWN_VALUES]
                   if s and s != first_site)


def _threads_race(recs: dict, views: dict, pg: str) -> str:
    """'; two threads of a rank issue collectives on group default, ...': the diverging collectives
    came from different threads, and a rank issued on this group from more than one: the threads
    race, and their collectives reach the group in an order that differs per rank (verl's async
    trainer, PR#7423). Ranks that each issue from one thread of their own name: not a race."""
    if len({rec.thread for rec in recs.values()}) < 2:
        return ""
    if not any(len({rec.thread for rec in views[r].records_in(pg)}) > 1 for r in recs if r in views):
        return ""
    threads = grouped({r: f"from thread {rec.thread}" if rec.thread else "from its main thread"
                       for r, rec in recs.items()})
    return (f"; two threads of a rank issue collectives on group {pg}, in an order that differs per rank: "
            f"{threads}")


_LEAVING = {RankState.DEAD: 0, RankState.FAILED: 1}


def _left_first(div: Divergence, views: dict) -> RankView:
    """The absent member that explains the divergence: one that was seen before one that was not,
    the one that stopped earliest in the group (fewest collectives there), a dead or failed one
    before one that left cleanly, then the lowest."""
    return min((views[r] for r in div.absent),
               key=lambda v: (not v.finished, v.status == RankState.UNSEEN, len(v.records_in(div.pg)),
                              _LEAVING.get(v.status, 2), v.rank))


def _absent(div: Divergence, views: dict, reason: Reason, bound: float, words: Words,
            found: list[Divergence]) -> Diagnosis:
    rec = div.records[min(div.records)]
    absent = [views[r] for r in div.absent]
    first = _left_first(div, views)
    state = state_of(first, div.pg, views, words=words)
    same = [v.rank for v in absent if state_of(v, div.pg, views, words=words) == state]  # ranks 1,2 both left alike
    waiting = sorted(div.records)
    if first.status == RankState.UNSEEN:  # how far they got is not known: where the others wait now
        rec = next((views[r].current for r in waiting if views[r].current is not None), rec)
    verb = "wait" if len(waiting) > 1 else "waits"
    if reason == Reason.TIMEOUT and first.status in (RankState.RUNNING, RankState.UNSEEN):
        verb = f"waited {words.whole(bound)}"
    waits = waiting_for(rec, views.get(rec.rank))
    if all(views[r].status == RankState.DEAD for r in waiting):  # they waited in it until they went
        verb, waits = "waited", f"in {where(rec)} until {ended_in(views[rec.rank], rec)}"
    if len(same) > 1 and state.startswith("is "):
        state = "are " + state[3:]
    headline = f"{rank_list(same)} {state}; {rank_list(waiting)} {verb} {waits}"
    if len(headline) >= HEADLINE_WIDTH - len("slow rank: "):  # too long: the function's name goes, not
        headline = (f"{rank_list(same)} {state_of(first, div.pg, views, NO_FUNCTION, words)}; "  # the line it waits in
                    f"{rank_list(waiting)} {verb} {waits}")
    others = [v for v in absent if v.rank not in same]
    if len(others) == 1:
        headline += f"; also rank {others[0].rank} {state_of(others[0], div.pg, views, words=words)}"
    elif others:
        states = {"died" if v.status == RankState.DEAD else "raised" if v.status == RankState.FAILED else
                  "left the test" if v.finished else "are elsewhere" for v in others}
        headline += f"; also {rank_list([v.rank for v in others])} {' or '.join(sorted(states))}"
    if first.status == RankState.DEAD:
        kind = Kind.DIED
    elif first.status == RankState.FAILED:
        kind = Kind.RAISED
    elif first.status == RankState.UNSEEN:
        kind = Kind.UNSEEN
    elif first.status == RankState.RUNNING:
        kind = Kind.GROUP_MISMATCH if first.current is not None else Kind.SLOW_RANK
        if kind == Kind.SLOW_RANK and (rendezvous_at(first.stack) or in_rendezvous(first)):
            kind = Kind.RENDEZVOUS
        elif kind == Kind.SLOW_RANK and reason not in (Reason.INTERRUPTED, Reason.DUMPED):  # slow: only once
            # it waited the bound
            headline = "slow rank: " + headline
    else:
        kind = Kind.RANK_LEFT
    headline += cascade_line(div, found, views)
    chain = transfer_chain(first, views) if first.status == RankState.RUNNING else []
    if chain:  # it waits on a pipeline's transfers: the rank at their end holds it
        end = views[chain[-1][0]]
        pg = GroupId.parse(first.current.pg).collectives.label if first.current is not None else div.pg
        steps = ", ".join(f"rank {r} on {call}" for r, call in chain[:-1])
        headline += (f"; the transfers it waits on lead to rank {end.rank} ({steps}): rank {end.rank} "
                     f"{state_of(end, pg + ':p2p', views, words=words)}")
    # ranks this watch cannot see are named all (a node's worth); else the first, whom the line is about
    return Diagnosis(kind, headline, same if kind == Kind.UNSEEN else [first.rank], div.pg, div.seq, div)


def _slow(busy: list[RankView], inside: list[RankView], rec: CollectiveRecord, bound: float,
          words: Words) -> Diagnosis:
    """``rec``: the record the first of ``inside`` waits in."""
    tops = grouped({v.rank: busy_at(v) for v in busy}, 2)
    return Diagnosis(Kind.SLOW_RANK, f"slow rank: {rank_list([v.rank for v in busy])} busy outside any "
                     f"collective ({tops}); {rank_list([v.rank for v in inside])} waited "
                     f"{words.whole(bound)} in {where(rec)}", [v.rank for v in busy], rec.pg, rec.seq)
