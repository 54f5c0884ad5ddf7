"""Pure analysis: per-rank records and outcomes -> the first divergence and a one-line headline.

No torch, no processes (like torch's flight_recorder ``builder.py`` / ``utils.py``): everything here
is tested on hand-written data. The controller calls ``diagnose(ranks, reason, bound)``. What it
finds, in order (docs/diagnosis.md shows each with its headline):

1. an argument the ranks disagree on at the same position of a group: op, dtype, shape, root, reduce
   op, split sizes (``first_divergence``);
2. a rank that left, raised or died while others wait for it;
3. a certain deadlock (``records.stuck_ranks``): point-to-point transfers that can never pair, or
   ranks blocked in collectives of different groups, each waiting for the other; blame goes by
   issue order, never by timing or by the order the journals were read;
4. a slow rank, a true hang, a timeout outside any collective.

Headlines group ranks that share a view ("ranks 0-14 all_reduce, rank 15 barrier").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .records import (OUTSIDE, P2P_OPS, SHAPE_MATCHED_OPS, SPLIT_OPS, CollectiveRecord, P2PIndex, RankState, RankView,
                      group_base, headline_site, members_of, rank_ranges, rendezvous_at, short_path, short_site,
                      digests_agree, split_disagreement, stack_top, stuck_ranks)
from .waits import FULL, NO_FUNCTION, busy_at, elsewhere, in_rendezvous, running_state, seconds

__all__ = ["Diagnosis", "Divergence", "diagnose", "first_divergence", "digests_agree", "members_of", "brief",
           "short_path", "short_site", "stack_top", "headline_site", "split_disagreement", "where"]

# kinds, and the exception class each maps to (names from errors.py)
SHAPE_MISMATCH, DTYPE_MISMATCH, OP_MISMATCH = "shape-mismatch", "dtype-mismatch", "op-mismatch"
ROOT_MISMATCH, REDUCE_OP_MISMATCH, SPLIT_MISMATCH = "root-mismatch", "reduce-op-mismatch", "split-mismatch"
P2P_MISMATCH, DEADLOCK = "p2p-mismatch", "deadlock"
RANK_LEFT, GROUP_MISMATCH = "rank-left", "group-mismatch"
MISMATCH_KINDS = frozenset({SHAPE_MISMATCH, DTYPE_MISMATCH, OP_MISMATCH, ROOT_MISMATCH, REDUCE_OP_MISMATCH,
                            SPLIT_MISMATCH})
RAISED, DIED, HANG, SLOW_RANK, TIMEOUT = "rank-raised", "rank-died", "hang", "slow-rank", "timeout"
SKIP_MISMATCH, SETUP = "skip-mismatch", "setup"
RENDEZVOUS = "rendezvous"

EXCEPTION_FOR_KIND = {
    **{kind: "CollectiveMismatch" for kind in MISMATCH_KINDS},
    P2P_MISMATCH: "CollectiveMismatch", DEADLOCK: "CollectiveMismatch", RANK_LEFT: "CollectiveMismatch",
    GROUP_MISMATCH: "CollectiveMismatch", RAISED: "RankRaised", DIED: "RankDied",
    HANG: "CollectiveTimeout", SLOW_RANK: "CollectiveTimeout", TIMEOUT: "CollectiveTimeout",
    SKIP_MISMATCH: "DistributedTestFailure", SETUP: "RankSetupError", RENDEZVOUS: "CollectiveTimeout",
}
SHOWN_VALUES = 3   # distinct values a headline lists before "and N more"
HEADLINE_WIDTH = 200  # a headline adds optional detail (a second p2p side, a site) only while shorter
# What a rank raises when a peer it talks to died: a consequence, not the cause (and whether it came
# before the verdict is timing: a headline never shows it)
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
# What gloo says when ranks disagree on a collective's sizes (gloo::EnforceNotMet: a SIGABRT, or an
# exception in the caller), and the disagreement it names
GLOO_DISAGREEMENTS = (("Received data size doesn't match expected size", SHAPE_MISMATCH),
                      ("invalid tensor size", SHAPE_MISMATCH),
                      ("inLengthPerRank[myRank] == outLengthPerRank[myRank]", SPLIT_MISMATCH))


def gloo_disagreement(text: str) -> tuple[str, str] | None:
    """(kind, gloo's line) when ``text`` (a rank's output or exception line) holds one of gloo's
    checks that the ranks disagree on sizes."""
    for line in text.splitlines():
        for said, kind in GLOO_DISAGREEMENTS:
            if said in line:
                return kind, said
    return None


def brief(message: str, limit: int = 100) -> str:
    """An exception line without gloo's source location prefix, cut to ``limit`` characters."""
    if message.count("[") and "] " in message and (".cc:" in message or ".cpp:" in message):
        head, _, rest = message.partition("[")
        message = head + rest.split("] ", 1)[-1]
    return message if len(message) <= limit else message[: limit - 3] + "..."


@dataclass
class Divergence:
    """The first place where the ranks' collective sequences part."""
    pg: str
    seq: int                                  # 1-based position in the group where they part
    records: dict[int, CollectiveRecord]      # member rank -> its record at seq (if it has one)
    absent: list[int]                         # members with no record at seq
    kind: str                                 # one of MISMATCH_KINDS, or RANK_LEFT (members absent)


@dataclass
class Diagnosis:
    kind: str
    headline: str
    ranks: list[int] = field(default_factory=list)   # the rank(s) at fault
    pg: str | None = None
    seq: int | None = None
    divergence: Divergence | None = None

    @property
    def exception_name(self) -> str:
        return EXCEPTION_FOR_KIND.get(self.kind, "DistributedTestFailure")


# -- comparing the ranks' records --------------------------------------------------------------------

def _pg_order(pg: str) -> tuple:
    return (pg != "default", pg)


def _disagreement(at: dict[int, CollectiveRecord], pg: str, world: int) -> str | None:
    recs = list(at.values())
    if len({r.op for r in recs}) > 1:
        return OP_MISMATCH
    if recs[0].op in SHAPE_MATCHED_OPS:
        if len({r.dtype for r in recs}) > 1:
            return DTYPE_MISMATCH
        if len({r.shapes for r in recs}) > 1:
            return SHAPE_MISMATCH
    # compared only where every record carries the argument (Flight Recorder and v1 journals do not)
    if all(r.root is not None for r in recs) and len({r.root for r in recs}) > 1:
        return ROOT_MISMATCH
    if all(r.reduce_op for r in recs) and len({r.reduce_op for r in recs}) > 1:
        return REDUCE_OP_MISMATCH
    if recs[0].op in SPLIT_OPS and split_disagreement(at, pg, world):
        return SPLIT_MISMATCH
    return None


def first_divergence(ranks: list[RankView]) -> Divergence | None:
    """The first position, over all groups, where members disagree or some member is absent while
    another one is waiting there (or went past it). "First" is by issue order (each record's place
    in its rank's own journal), then by group and position: never by time, nor by the order of
    ``ranks``."""
    views = {v.rank: v for v in ranks}
    world = len(views)
    place = {id(rec): i for v in views.values() for i, rec in enumerate(v.records)}
    groups = {rec.pg for v in views.values() for rec in v.records
              if not (rec.pg.endswith(":p2p") or rec.op in P2P_OPS or rec.source == OUTSIDE)}
    found = []
    for pg in sorted(groups, key=_pg_order):
        members = [r for r in members_of(pg, world) if r in views]
        seqs = {r: views[r].records_in(pg) for r in members}
        for i in range(max(len(s) for s in seqs.values())):
            at = {r: s[i] for r, s in seqs.items() if len(s) > i}
            absent = [r for r in members if r not in at]
            kind = _disagreement(at, pg, world) or (RANK_LEFT if absent else None)
            if kind:
                first = min(place[id(rec)] for rec in at.values())
                found.append(((first, _pg_order(pg), i), Divergence(pg, i + 1, dict(sorted(at.items())), absent,
                                                                     kind)))
                break
    return min(found, key=lambda item: item[0])[1] if found else None


# -- wording ----------------------------------------------------------------------------------------

def _rank_list(ranks) -> str:
    """'rank 3', 'ranks 0-14,16'; a list that would not be short: '32 ranks (0,2,...,62)'."""
    ranks = sorted(set(ranks))
    text = rank_ranges(ranks)
    if len(text) > 30:
        return f"{len(ranks)} ranks ({ranks[0]},{ranks[1]},...,{ranks[-1]})"
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def _few(ranks) -> str:
    """A rank list for a side note: '62 ranks' when it would not be short."""
    text = _rank_list(ranks)
    return text if len(text) <= 24 else f"{len(set(ranks))} ranks"


def _grouped(values: dict[int, str], limit: int = SHOWN_VALUES) -> str:
    """'ranks 0-14 SUM, rank 15 MAX': ranks with the same value together, in rank order."""
    by_value: dict[str, list[int]] = {}
    for r, value in sorted(values.items()):
        by_value.setdefault(value, []).append(r)
    parts = [f"{_rank_list(rs)} {value}" for value, rs in by_value.items()]
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" and {more} more value{'s' if more > 1 else ''}" if more > 0 else "")


def where(rec: CollectiveRecord, transfer=None) -> str:
    """'all_reduce #3 of group tp[2,3] from x.py:5', 'recv(src=0, tag=2) from x.py:9': a position in a
    headline (a point-to-point record by the ``transfer`` it waits on)."""
    site = headline_site(rec.site)
    if rec.source == "flight-recorder":
        origin = " (issued from C++, seen by the Flight Recorder)"
    else:
        origin = f" from {site}" if site else ""
    if rec.p2p:
        group = rec.pg.removesuffix(":p2p")
        transfer = transfer or (rec.blocking_p2p() or rec.p2p)[0]
        return f"{transfer.call(rec.op)}{'' if group == 'default' else ' in group ' + group}{origin}"
    return f"{rec.op} #{rec.seq} of group {rec.pg}{origin}"


def _state_of(view: RankView, pg: str, views: dict | None = None, quote: int = FULL) -> str:
    """Why this rank is not in the collective the others wait in."""
    count = len(view.records_in(pg))
    after = f"after {count} collective{'s' if count != 1 else ''} in group {pg}"
    if view.status == RankState.DEAD:
        return f"{view.exit_description} {after}"
    if view.status == RankState.FAILED:
        return f"raised {brief(view.message or view.exc_type)} {after}"
    if view.status in (RankState.PASSED, RankState.SKIPPED, RankState.XFAILED):
        return f"left the test ({view.status}) {after}"
    cur = view.current
    if cur is not None and cur.pg != pg:
        return f"waits in {where(cur)} instead, {after}"
    if view.status == RankState.NOT_STARTED:
        return f"never started this test, {after}"
    rendezvous = rendezvous_at(view.stack) if view.outside_wait is None else ""  # else: the tracer saw it
    if rendezvous:
        return f"waits in a rendezvous at {rendezvous} that a member of the new group never joined, {after}"
    return f"{running_state(view, views, quote) or 'is busy outside any collective'}, {after}"


def _waiting_summary(views: list[RankView]) -> str:
    """'; ranks 0,1 wait in X; rank 3 waits in Y': running ranks grouped by where they wait."""
    at: dict[str, list[int]] = {}
    for v in views:
        if v.status == RankState.RUNNING and v.current is not None:
            at.setdefault(where(v.current), []).append(v.rank)
    parts = [f"{_rank_list(rs)} wait{'s' if len(rs) == 1 else ''} in {pos}" for pos, rs in list(at.items())[:2]]
    return "".join("; " + p for p in parts + elsewhere(views))  # and the ranks outside any collective


# -- the diagnosis --------------------------------------------------------------------------------

def diagnose(ranks: list[RankView], reason: str, bound: float) -> Diagnosis | None:
    """``reason``: "completed" (every rank finished), "decided" (a rule found the outcome), "timeout"
    (the bound was hit). Returns None for a clean pass. The same views give the same diagnosis
    whatever their order."""
    ranks = sorted(ranks, key=lambda v: v.rank)
    div = first_divergence(ranks)
    failed = [v for v in ranks if v.status == RankState.FAILED]
    dead = [v for v in ranks if v.status == RankState.DEAD]
    running = [v for v in ranks if v.status == RankState.RUNNING]

    if div is not None and div.kind != RANK_LEFT:
        return _mismatch(div, ranks)
    views = {v.rank: v for v in ranks}
    if div is not None and _left_first(div, views).finished:
        return _absent(div, views, reason, bound)
    said = [(v, found) for v in dead + failed for found in [gloo_disagreement(v.output + "\n" + v.message)] if found]
    if said:
        # no records that show it (trace off, or the rank died before writing), but gloo said it
        victim, (kind, line) = min(said, key=lambda item: item[0].rank)
        what = victim.exit_description if victim.status == RankState.DEAD else "raised it"
        return Diagnosis(kind, f"{kind.replace('-', ' ')} in a collective (gloo on rank {victim.rank}: "
                         f"{brief(line, 120)}); rank {victim.rank} {what}{_waiting_summary(ranks)}", [victim.rank])
    if dead:
        first = min(dead, key=lambda v: (len(v.records), v.rank))  # the earliest in issue order, not in time
        rest = {v.rank: v.exit_description for v in dead if v is not first}
        also = f"; also {_grouped(rest)}" if rest else ""
        return Diagnosis(DIED, f"{_rank_list([first.rank])} {first.exit_description}{also}"
                         f"{_waiting_summary(ranks)}", [first.rank])
    if failed:
        return _raised(failed, ranks)
    stuck = stuck_ranks(views)
    if stuck:
        return _deadlock(stuck, views)
    if div is not None:
        return _absent(div, views, reason, bound)
    if running:
        inside = [v for v in running if v.current is not None]
        if inside and len(inside) == len(running) and len({(v.current.pg, v.current.seq) for v in inside}) == 1:
            rec = inside[0].current
            every = "every rank is" if len(running) == len(ranks) else f"{_rank_list([v.rank for v in running])} are"
            return Diagnosis(HANG, f"{every} inside {where(rec)} and none completed within the "
                             f"{seconds(bound)} s bound (a transport or peer problem: all ranks entered it)",
                             [v.rank for v in running], rec.pg, rec.seq)
        busy = [v for v in running if v.current is None]
        if busy and inside:
            return _slow(busy, inside, bound)
        tops = _grouped({v.rank: busy_at(v, views) for v in running}, 2)
        kind = RENDEZVOUS if any(in_rendezvous(v) for v in running) else TIMEOUT
        return Diagnosis(kind, f"the test exceeded its {seconds(bound)} s bound outside any collective "
                         f"({tops})", [v.rank for v in running])
    statuses = {v.status for v in ranks}
    if RankState.SKIPPED in statuses and len(statuses) > 1:
        skipped = [v.rank for v in ranks if v.status == RankState.SKIPPED]
        others = [v.rank for v in ranks if v.status != RankState.SKIPPED]
        return Diagnosis(SKIP_MISMATCH, f"pytest.skip was called on {_rank_list(skipped)} only "
                         f"({views[skipped[0]].message}); {_rank_list(others)} did not skip: "
                         "skip on every rank or on none", skipped)
    return None


def _raised(failed: list[RankView], ranks: list[RankView]) -> Diagnosis:
    by_message: dict[str, list[int]] = {}
    for v in failed:
        by_message.setdefault(v.message or v.exc_type, []).append(v.rank)
    parts = [f"{_rank_list(rs)} raised {brief(msg, 160)}" for msg, rs in by_message.items()]
    more = f"; {len(parts) - 2} more different errors" if len(parts) > 3 else ""
    return Diagnosis(RAISED, "; ".join(parts[:3] if not more else parts[:2]) + more + _waiting_summary(ranks),
                     [v.rank for v in failed])


def _consequence(view: RankView) -> str:
    if view.status == RankState.DEAD:
        return f"rank {view.rank} {view.exit_description} inside it"
    found = gloo_disagreement(view.message)
    if found:  # gloo's own check of the same disagreement, in its words
        return f"gloo rejected it on rank {view.rank} ({found[1].strip().rstrip('.')})"
    return f"rank {view.rank} raised {brief(view.message)}"


def _mismatch(div: Divergence, ranks: list[RankView]) -> Diagnosis:
    recs, pos = div.records, f"#{div.seq} of group {div.pg}"
    first = next(iter(recs.values()))
    odd: list[int] = []
    if div.kind == OP_MISMATCH:
        what = f"op mismatch at collective {pos}: {_grouped({r: rec.op for r, rec in recs.items()})}"
    elif div.kind == SPLIT_MISMATCH:
        pairs = split_disagreement(recs, div.pg, len(ranks))
        sender, receiver, sent, expected = pairs[0]
        to = "itself" if sender == receiver else f"rank {receiver}"
        more = f", and {len(pairs) - 1} more pair{'s' if len(pairs) > 2 else ''}" if len(pairs) > 1 else ""
        what = f"split mismatch in {first.op} {pos}: rank {sender} sends {sent} to {to}, which expects {expected}{more}"
        odd = sorted({p[0] for p in pairs})
    else:
        name, value = {DTYPE_MISMATCH: ("dtype", lambda rec: rec.dtype or "?"),
                       SHAPE_MISMATCH: ("shape", lambda rec: rec.shapes or "?"),
                       ROOT_MISMATCH: ("root", lambda rec: rec.root_text),
                       REDUCE_OP_MISMATCH: ("reduce-op", lambda rec: rec.reduce_op)}[div.kind]
        what = f"{name} mismatch in {first.op} {pos}: {_grouped({r: value(rec) for r, rec in recs.items()})}"
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
        consequences.append(f"{_rank_list(div.absent)} never entered it")
    if not consequences and all(not rec.pending for rec in recs.values()):
        consequences.append("the backend completed it without an error: its result is wrong")
    if consequences:
        what += "; " + "; ".join(consequences)
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
    return "".join(f"; {_rank_list(rs)} from {s}" for s, rs in list(by_site.items())[:SHOWN_VALUES]
                   if s and s != first_site)


_LEAVING = {RankState.DEAD: 0, RankState.FAILED: 1}


def _left_first(div: Divergence, views: dict) -> RankView:
    """The absent member that explains the divergence: the one that stopped earliest in the group
    (fewest collectives there), a dead or failed one before one that left cleanly, then the lowest."""
    return min((views[r] for r in div.absent),
               key=lambda v: (not v.finished, len(v.records_in(div.pg)), _LEAVING.get(v.status, 2), v.rank))


def _absent(div: Divergence, views: dict, reason: str, bound: float) -> Diagnosis:
    rec = div.records[min(div.records)]
    absent = [views[r] for r in div.absent]
    first = _left_first(div, views)
    state = _state_of(first, div.pg, views)
    same = [v.rank for v in absent if _state_of(v, div.pg, views) == state]  # ranks 1,2 both left alike
    waiting = sorted(div.records)
    verb = "wait" if len(waiting) > 1 else "waits"
    if reason == "timeout" and first.status == RankState.RUNNING:
        verb = "waited" + f" for the whole {seconds(bound)} s bound"
    headline = f"{_rank_list(same)} {state}; {_rank_list(waiting)} {verb} in {where(rec)}"
    if len(headline) >= HEADLINE_WIDTH - len("slow rank: "):  # too long: the function's name goes, not
        headline = f"{_rank_list(same)} {_state_of(first, div.pg, views, NO_FUNCTION)}; " \
                   f"{_rank_list(waiting)} {verb} in {where(rec)}"  # the line it waits in
    others = [v for v in absent if v.rank not in same]
    if len(others) == 1:
        headline += f"; also rank {others[0].rank} {_state_of(others[0], div.pg, views)}"
    elif others:
        states = {"died" if v.status == RankState.DEAD else "raised" if v.status == RankState.FAILED else
                  "left the test" if v.finished else "are elsewhere" for v in others}
        headline += f"; also {_rank_list([v.rank for v in others])} {' or '.join(sorted(states))}"
    if first.status == RankState.DEAD:
        kind = DIED
    elif first.status == RankState.FAILED:
        kind = RAISED
    elif first.status == RankState.RUNNING:
        kind = GROUP_MISMATCH if first.current is not None else SLOW_RANK
        if kind == SLOW_RANK and (rendezvous_at(first.stack) or in_rendezvous(first)):
            kind = RENDEZVOUS
        elif kind == SLOW_RANK:
            headline = "slow rank: " + headline
    else:
        kind = RANK_LEFT
    return Diagnosis(kind, headline, [first.rank], div.pg, div.seq, div)


def _slow(busy: list[RankView], inside: list[RankView], bound: float) -> Diagnosis:
    rec = inside[0].current
    tops = _grouped({v.rank: busy_at(v) for v in busy}, 2)
    return Diagnosis(SLOW_RANK, f"slow rank: {_rank_list([v.rank for v in busy])} busy outside any "
                     f"collective ({tops}); {_rank_list([v.rank for v in inside])} waited for the whole "
                     f"{seconds(bound)} s bound in {where(rec)}", [v.rank for v in busy], rec.pg, rec.seq)


# -- certain deadlocks ------------------------------------------------------------------------------

def _deadlock(stuck: dict, views: dict) -> Diagnosis:
    if any(cur.p2p for cur, _ in stuck.values()):
        return _p2p_deadlock(stuck, views)
    return _cross_group(stuck, views)


def _peer_state(view: RankView) -> str:
    if view.status == RankState.DEAD:
        return f"it {'was ' if view.signal_name else ''}{view.exit_description}"
    if view.finished:
        return f"it {view.status}"
    cur = view.current
    return f"it waits in {where(cur)}" if cur is not None and not cur.p2p else ""


def _p2p_deadlock(stuck: dict, views: dict) -> Diagnosis:
    """Transfers that can never pair: name both sides, with peers and tags."""
    index = P2PIndex(views)
    unmatched = [(r, cur, next(p for p in cur.blocking_p2p() if not index.has_counterpart(r, cur, p)))
                 for r, (cur, _) in stuck.items() if cur.p2p]   # one per stuck rank, in rank order
    # an unmatched send and an unmatched receive that name each other's rank on one side at least
    pairs = [(a, b) for a in unmatched for b in unmatched
             if a[2].send and not b[2].send and (b[2].peer == a[0] or a[2].peer == b[0])]
    tag = next(((a, b) for a, b in pairs if a[2].peer == b[0] and b[2].peer == a[0] and a[2].tag != b[2].tag), None)
    peer = next(((a, b) for a, b in pairs if a[2].peer != b[0] or b[2].peer != a[0]), None)
    title, pair = ("p2p tag mismatch", list(tag)) if tag else ("p2p peer mismatch", list(peer)) if peer else \
        ("p2p deadlock", [])
    ranks = {u[0] for u in unmatched}
    if not pair and len({u[2].send for u in unmatched}) == 1 and all(u[2].peer in ranks for u in unmatched):
        every = "both ranks" if len(ranks) == 2 else f"{_rank_list(ranks)} all"
        title += f": {every} {'send' if unmatched[0][2].send else 'receive'} first"
    shown = pair + [u for u in unmatched if u not in pair]

    def clause(r, cur, p):
        peer = None if p.peer is None else views[p.peer]
        context = _peer_state(peer) if peer is not None and (peer.rank not in stuck or not peer.current.p2p) else ""
        return (f"rank {r} waits in {where(cur, p)}, which {'no rank' if peer is None else f'rank {p.peer} never'} "
                f"{'receives' if p.send else 'sends'}{f' ({context})' if context else ''}")
    parts = [clause(*u) for u in shown[:2]]
    more = f"; and {len(shown) - 2} more ranks" if len(shown) > 2 else ""
    if len(shown) > 2 and len(title) + len("; ".join(parts) + more) + 2 >= HEADLINE_WIDTH:
        parts, more = parts[:1], f"; and {len(shown) - 1} more ranks in transfers that cannot pair"
    return Diagnosis(P2P_MISMATCH, f"{title}: " + "; ".join(parts) + more, sorted({u[0] for u in shown[:len(parts)]}),
                     shown[0][1].pg, shown[0][1].seq)


def _issue_key(rec: CollectiveRecord) -> tuple:
    """What identifies 'the same collective' across ranks and groups: the op and the line that issued
    it (a DeviceMesh's tp[0,1] and tp[2,3] all_reduce from one line are one collective of the code)."""
    frame = rec.site.split(" <- ")[0]
    return (rec.op, frame) if frame else (rec.op, group_base(rec.pg))


def _first_index(view: RankView, key: tuple) -> int | None:
    return next((i for i, rec in enumerate(view.records) if not rec.p2p and rec.op not in P2P_OPS
                 and _issue_key(rec) == key), None)


def _cross_group(stuck: dict, views: dict) -> Diagnosis:
    """Every stuck rank waits in a collective of one group for a member stuck in another. The rank
    that skipped a collective is the one blocked at a later one, by the issue order the other ranks
    show (ranks that issued both)."""
    positions: dict[tuple, list[int]] = {}
    for r, (cur, _) in stuck.items():
        positions.setdefault((cur.pg, cur.seq), []).append(r)
    culprits = []   # (skipped position, position it waits at, the rank, witnesses)
    for (qpg, qseq), present in sorted(positions.items(), key=lambda kv: (_pg_order(kv[0][0]), kv[0][1])):
        q = views[present[0]].current
        for r, (cur, needs) in stuck.items():
            if r in present or r not in members_of(qpg, len(views)) or len(views[r].records_in(qpg)) >= qseq:
                continue
            before = after = 0
            witnesses = []
            for w in views.values():
                iq, ip = _first_index(w, _issue_key(q)), _first_index(w, _issue_key(cur))
                if iq is not None and ip is not None:
                    before, after = before + (iq < ip), after + (iq > ip)
                    if iq < ip:
                        witnesses.append(w.rank)
            if before > after:
                culprits.append(((qpg, qseq), (cur.pg, cur.seq), r, witnesses))
    if culprits:
        skipped, at = culprits[0][0], culprits[0][1]
        same = [c for c in culprits if c[0] == skipped and c[1] == at]
        who = sorted({c[2] for c in same})
        q, p = views[positions[skipped][0]].current, views[who[0]].current
        witnesses = sorted(set(same[0][3]) - set(who))
        verb = "waits" if len(who) == 1 else "wait"
        rest = (f"; {_few(witnesses) + ' issued it first' if witnesses else 'others issue it first'}, "
                f"{_rank_list(positions[skipped])} wait{'s' if len(positions[skipped]) == 1 else ''} in it")
        headline = f"{_rank_list(who)} skipped {where(q)} and {verb} in {where(p)}{rest}"
        if len(headline) >= HEADLINE_WIDTH:  # the skipped call's site matters most
            headline = f"{_rank_list(who)} skipped {where(q)} and {verb} in {p.op} #{p.seq} of group {p.pg}{rest}"
        return Diagnosis(DEADLOCK, headline, who, q.pg, q.seq)
    parts = []
    for (pg, seq), present in sorted(positions.items(), key=lambda kv: min(kv[1])):
        cur, needs = stuck[present[0]]
        verb = "waits" if not parts and len(present) == 1 else "wait" if not parts else ""
        parts.append(f"{_rank_list(present)}{' ' + verb if verb else ''} in {where(cur)} without "
                     f"{_rank_list({m for n in needs for m in n})}")
    more = f"; and {len(parts) - 2} more groups" if len(parts) > 2 else ""
    return Diagnosis(DEADLOCK, "deadlock across groups: " + ", ".join(parts[:2]) + more, sorted(stuck))
