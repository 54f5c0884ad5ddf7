"""Who waits for whom: point-to-point pairing (``P2PIndex``), certain deadlocks (``stuck_ranks``) and
a rank whose stream cannot reach a collective yet (``behind``, NCCL): what the referee's deadlock
rule and the diagnosis read off the records."""

from __future__ import annotations

from .groups import GroupId, members_of
from .ops import P2P_OPS
from .records import P2P, CollectiveRecord, RankView
from .states import RankState, RecordState, Source


class P2PIndex:
    """Every rank's point-to-point transfers, per channel (group, source, destination, tag), in issue
    order: a send from A to B with tag T pairs with the next receive on B from A (or from any
    source) with tag T, whatever the records' states."""

    def __init__(self, views: dict):
        # channel -> [(rank, record, transfer)] in the order the rank issued them
        self.sends: dict[tuple, list] = {}
        self.recvs: dict[tuple, list] = {}      # receives from a named source
        self.any: dict[tuple, list] = {}        # receives from any source: (group, dst, tag, obj)
        self.place: dict[int, int] = {}         # id(transfer) -> its 1-based place in its channel
        for r, view in views.items():
            for rec in view.records:
                for p in rec.p2p:
                    if p.send:
                        lane = self.sends.setdefault((rec.pg, r, p.peer, p.tag, p.obj), [])
                    elif p.peer is None:
                        lane = self.any.setdefault((rec.pg, r, p.tag, p.obj), [])
                    else:
                        lane = self.recvs.setdefault((rec.pg, p.peer, r, p.tag, p.obj), [])
                    lane.append((r, rec, p))
                    self.place[id(p)] = len(lane)

    def has_counterpart(self, rank: int, rec: CollectiveRecord, p: P2P) -> bool:
        """Has the other side issued the transfer this one pairs with? (Receives from any source
        count for every sender: a yes can be generous, a no is certain.)"""
        k = self.place[id(p)]
        if p.send:
            key = (rec.pg, rank, p.peer, p.tag, p.obj)
            return len(self.recvs.get(key, ())) + len(self.any.get((rec.pg, p.peer, p.tag, p.obj), ())) >= k
        if p.peer is not None:
            return len(self.sends.get((rec.pg, p.peer, rank, p.tag, p.obj), ())) >= k
        return sum(len(v) for key, v in self.sends.items()
                   if key[0] == rec.pg and key[2] == rank and key[3:] == (p.tag, p.obj)) >= k

    def pairs(self) -> list[tuple]:
        """(k, send, receive) for every send that pairs with a receive from its named source: the
        k-th of its channel each, as (rank, record, transfer). Channels that also have receives
        from any source are left out: which send such a receive takes is the backend's choice."""
        out: list[tuple] = []
        for key, sends in sorted(self.sends.items(), key=lambda item: (item[0][0], item[0][1], -1 if item[0][2] is None
                                                                        else item[0][2], item[0][3])):
            recvs = self.recvs.get(key, [])
            if self.any.get((key[0], key[2], key[3], key[4])):
                continue
            out.extend((k, send, recv) for k, (send, recv) in enumerate(zip(sends, recvs, strict=False), 1))
        return out


_ASK = object()  # behind(): the view's current record not known yet


def behind(view: RankView, rec: CollectiveRecord, cur=_ASK) -> bool:
    """NCCL: ``view``'s rank issued collective ``rec`` (of another rank) too, but its stream cannot
    start it: a synchronous collective it issued before is in flight, the current stream waits for
    that one, and every collective issued after it waits for the current stream. ``cur``: the
    view's current record, where the caller has it already."""
    cur = view.current if cur is _ASK else cur
    if view.status != RankState.RUNNING or cur is None or cur.state != RecordState.IN_FLIGHT or cur.async_op:
        return False
    theirs = view.records_in(rec.pg)
    mine = theirs[rec.seq - 1] if len(theirs) >= rec.seq else None
    if mine is None or mine is cur or not mine.pending:
        return False
    order = {id(r): i for i, r in enumerate(view.records)}
    return order[id(cur)] < order[id(mine)]


def stuck_ranks(views: dict) -> dict:
    """Running ranks that can never go on: rank -> (the record it waits in, what it needs: lists of
    ranks, any one of which would do). A rank waits for the members missing from its collective, or
    for the peer of a transfer nobody issued the counterpart of; it is stuck when one of its needs
    can only come from stuck or finished ranks. Empty when some rank could still move everything."""
    index = None
    waits = {}
    world = len(views)
    # asked for every member of every waiting rank's group: once per rank (a job of 1,024 ranks)
    currents = {r: view.current for r, view in views.items()}
    counts: dict[tuple[int, str], int] = {}

    def count(m: int, pg: str) -> int:
        if (m, pg) not in counts:
            counts[(m, pg)] = len(views[m].records_in(pg))
        return counts[(m, pg)]

    for r, view in sorted(views.items()):
        cur = currents[r] if view.status == RankState.RUNNING else None
        if cur is None or cur.source != Source.PYTHON:
            continue
        if cur.p2p:
            index = index or P2PIndex(views)
            ops = [p for p in cur.blocking_p2p() if not index.has_counterpart(r, cur, p)]
            needs = [[p.peer] if p.peer is not None else
                     [m for m in GroupId.parse(cur.pg).members_in(world) if m != r] for p in ops]
        elif cur.op in P2P_OPS:
            continue  # a transfer without its peers (a v1 journal): nothing certain
        else:
            needs = [[m] for m in members_of(cur.pg, world)
                     if m in views and (count(m, cur.pg) < cur.seq or behind(views[m], cur, currents[m]))]
        if needs:
            waits[r] = (cur, needs)
    finished = {r for r, v in views.items() if v.finished}
    stuck = set(waits)
    changed = True
    while changed:
        changed = False
        for r in sorted(stuck):
            hopeless = stuck | finished
            if not any(all(m in hopeless for m in need) for need in waits[r][1]):
                stuck.discard(r)
                changed = True
    return {r: waits[r] for r in sorted(stuck)}
