"""Comparing the ranks' records: the first position, over all groups, where members disagree on an
argument or some member is absent (``first_divergence``), and what gloo says when it caught a
disagreement itself."""

from __future__ import annotations

from ..agreement import split_disagreement
from ..groups import GroupId, members_of
from ..ops import P2P_OPS, SHAPE_MATCHED_OPS, SPLIT_OPS
from ..records import CollectiveRecord, RankView
from ..states import Kind, RankState, Source
from .cascade import next_for, roots
from .findings import Divergence

# What a rank raises when a peer it talks to died: a consequence, not the cause (and whether it came
# before the verdict is timing: a headline never shows it)
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
# What gloo says when ranks disagree on a collective's sizes (gloo::EnforceNotMet: a SIGABRT, or an
# exception in the caller), and the disagreement it names
GLOO_DISAGREEMENTS = (("Received data size doesn't match expected size", Kind.SHAPE_MISMATCH),
                      ("invalid tensor size", Kind.SHAPE_MISMATCH),
                      ("inLengthPerRank[myRank] == outLengthPerRank[myRank]", Kind.SPLIT_MISMATCH))


def gloo_disagreement(text: str) -> tuple[Kind, str] | None:
    """(kind, gloo's line) when ``text`` (a rank's output or exception line) holds one of gloo's
    checks that the ranks disagree on sizes."""
    for line in text.splitlines():
        for said, kind in GLOO_DISAGREEMENTS:
            if said in line:
                return kind, said
    return None


def pg_order(pg: str) -> tuple:
    return (pg != "default", pg)


def _disagreement(at: dict[int, CollectiveRecord], pg: str, world: int) -> Kind | None:
    recs = list(at.values())
    if len({r.op for r in recs}) > 1:
        return Kind.OP_MISMATCH
    if recs[0].op in SHAPE_MATCHED_OPS:
        if len({r.dtype for r in recs}) > 1:
            return Kind.DTYPE_MISMATCH
        if len({r.shapes for r in recs}) > 1:
            return Kind.SHAPE_MISMATCH
    # compared only where every record carries the argument (Flight Recorder and v1 journals do not)
    if all(r.root is not None for r in recs) and len({r.root for r in recs}) > 1:
        return Kind.ROOT_MISMATCH
    if all(r.reduce_op for r in recs) and len({r.reduce_op for r in recs}) > 1:
        return Kind.REDUCE_OP_MISMATCH
    if recs[0].op in SPLIT_OPS and split_disagreement(at, pg, world):
        return Kind.SPLIT_MISMATCH
    return None


def divergences(ranks: list[RankView]) -> list[tuple[tuple, Divergence]]:
    """Each group's first position where members disagree or some member is absent while another
    one is waiting there (or went past it), keyed by issue order (each record's place in its rank's
    own journal), then group and position: never by time, nor by the order of ``ranks``. A rank
    whose records cannot be seen (``UNSEEN``: another node, a rank that left no dump) is absent only
    where a member has not completed the collective: one that completed had every member."""
    views = {v.rank: v for v in ranks}
    world = len(views)
    place = {id(rec): i for v in views.values() for i, rec in enumerate(v.records)}
    groups = {rec.pg for v in views.values() for rec in v.records
              if not (GroupId.parse(rec.pg).p2p or rec.op in P2P_OPS or rec.source == Source.OUTSIDE)}
    found = []
    for pg in sorted(groups, key=pg_order):
        members = [r for r in members_of(pg, world) if r in views]
        seqs = {r: views[r].records_in(pg) for r in members}
        for i in range(max(len(s) for s in seqs.values())):
            at = {r: s[i] for r, s in seqs.items() if len(s) > i}
            done = all(not rec.pending for rec in at.values())
            absent = [r for r in members if r not in at and not (done and views[r].status == RankState.UNSEEN)]
            kind = _disagreement(at, pg, world) or (Kind.RANK_LEFT if absent else None)
            if kind:
                first = min(place[id(rec)] for rec in at.values())
                found.append(((first, pg_order(pg), i), Divergence(pg, i + 1, dict(sorted(at.items())), absent,
                                                                     kind)))
                break
    return found


def first_divergence(ranks: list[RankView], found: list | None = None) -> Divergence | None:
    """The first divergence by issue order (``divergences``) among those no other one holds: a
    group whose missing members wait in another group's stalled collective comes after that one
    (``cascade``). ``found``: ``divergences(ranks)``, where the caller has them."""
    found = divergences(ranks) if found is None else found
    if not found:
        return None
    views = {v.rank: v for v in ranks}
    free = {id(d) for d in roots([d for _, d in found], views)}
    first = min((item for item in found if id(item[1]) in free), key=lambda item: item[0])[1]
    # groups that miss the same rank: the root is the one it would have entered next
    same = [d for _, d in found if id(d) in free and set(d.absent) & set(first.absent)]
    return min(same, key=lambda d: next_for(d, views)) if len(same) > 1 else first
