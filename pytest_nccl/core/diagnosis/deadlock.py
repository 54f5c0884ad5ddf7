"""Certain deadlocks (``waits.stuck_ranks``): point-to-point transfers that can never pair, named by
both sides with peers and tags, and ranks blocked in collectives of different groups, blamed by the
order the ranks issued things (never by timing, nor by the order the journals were read)."""

from __future__ import annotations

from ..groups import GroupId, members_of
from ..ops import P2P_OPS
from ..records import CollectiveRecord, RankView
from ..states import Kind, RankState
from ..waits import P2PIndex, behind
from .divergence import pg_order
from .findings import Diagnosis
from .wording import HEADLINE_WIDTH, few, rank_list, waiting_for, where


def deadlock_diagnosis(stuck: dict, views: dict) -> Diagnosis:
    if any(cur.p2p for cur, _ in stuck.values()):
        return _p2p_deadlock(stuck, views)
    return _cross_group(stuck, views)


def _peer_state(view: RankView) -> str:
    if view.status == RankState.DEAD:
        return f"it {'was ' if view.signal_name else ''}{view.exit_description}"
    if view.finished:
        return f"it {view.status}"
    cur = view.current
    return f"it waits {waiting_for(cur, view)}" if cur is not None and not cur.p2p else ""


def _senders_state(views: dict, r: int, cur: CollectiveRecord) -> str:
    """For a receive from any source: where the ranks that could send are, those in one place
    together, the first place only ('ranks 1,2 wait in barrier #1 of group default from x.py:8')."""
    at: dict[str, list[int]] = {}
    for m in GroupId.parse(cur.pg).members_in(len(views)):
        if m != r and m in views:
            text = _peer_state(views[m]).removeprefix("it ")
            if text:
                at.setdefault(text, []).append(m)
    if not at:
        return ""
    text, ranks = next(iter(at.items()))
    if len(ranks) > 1:
        text = text.replace("waits ", "wait ", 1).replace("was ", "were ", 1)
    return f"{rank_list(ranks)} {text}"


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
        every = "both ranks" if len(ranks) == 2 else f"{rank_list(ranks)} all"
        title += f": {every} {'send' if unmatched[0][2].send else 'receive'} first"
    shown = pair + [u for u in unmatched if u not in pair]

    def clause(r, cur, p):
        peer = None if p.peer is None else views[p.peer]
        context = _peer_state(peer) if peer is not None and (peer.rank not in stuck or not peer.current.p2p) else \
            _senders_state(views, r, cur) if p.peer is None and not p.send else ""
        return (f"rank {r} waits in {where(cur, p)}, which {'no rank' if peer is None else f'rank {p.peer} never'} "
                f"{'receives' if p.send else 'sends'}{f' ({context})' if context else ''}")
    parts = [clause(*u) for u in shown[:2]]
    more = f"; and {len(shown) - 2} more ranks" if len(shown) > 2 else ""
    if len(shown) > 2 and len(title) + len("; ".join(parts) + more) + 2 >= HEADLINE_WIDTH:
        parts, more = parts[:1], f"; and {len(shown) - 1} more ranks in transfers that cannot pair"
    return Diagnosis(Kind.P2P_MISMATCH, f"{title}: " + "; ".join(parts) + more,
                     sorted({u[0] for u in shown[:len(parts)]}), shown[0][1].pg, shown[0][1].seq)


def _issue_key(rec: CollectiveRecord) -> tuple:
    """What identifies 'the same collective' across ranks and groups: the op and the line that issued
    it (a DeviceMesh's tp[0,1] and tp[2,3] all_reduce from one line are one collective of the code)."""
    frame = rec.site.split(" <- ")[0]
    return (rec.op, frame) if frame else (rec.op, GroupId.parse(rec.pg).name)


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
    for (qpg, qseq), present in sorted(positions.items(), key=lambda kv: (pg_order(kv[0][0]), kv[0][1])):
        q = views[present[0]].current
        for r, (cur, _) in stuck.items():
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
        rest = (f"; {few(witnesses) + ' issued it first' if witnesses else 'others issue it first'}, "
                f"{rank_list(positions[skipped])} wait{'s' if len(positions[skipped]) == 1 else ''} in it")
        headline = f"{rank_list(who)} skipped {where(q)} and {verb} in {where(p)}{rest}"
        if len(headline) >= HEADLINE_WIDTH:  # the skipped call's site matters most
            headline = f"{rank_list(who)} skipped {where(q)} and {verb} in {p.op} #{p.number} of group {p.pg}{rest}"
        return Diagnosis(Kind.DEADLOCK, headline, who, q.pg, q.seq)
    parts: list[str] = []
    reordered = False
    for _, present in sorted(positions.items(), key=lambda kv: min(kv[1])):
        cur, needs = stuck[present[0]]
        verb = "waits" if not parts and len(present) == 1 else "wait" if not parts else ""
        missing = sorted({m for n in needs for m in n})
        late = [m for m in missing if behind(views[m], cur)]
        if late:  # NCCL: they issued it, behind a collective of another group that waits for this one
            reordered = True
            first = views[late[0]].current
            parts.append(f"{rank_list(present)}{' ' + verb if verb else ''} for {where(cur)}, "
                         f"which {rank_list(late)} issued after {first.op} #{first.number} of group {first.pg}")
        else:
            parts.append(f"{rank_list(present)}{' ' + verb if verb else ''} in {where(cur)} without "
                         f"{rank_list(missing)}")
    more = f"; and {len(parts) - 2} more groups" if len(parts) > 2 else ""
    title = "deadlock across groups, issued in an order that differs per rank: " if reordered else \
        "deadlock across groups: "
    return Diagnosis(Kind.DEADLOCK, title + ", ".join(parts[:2]) + more, sorted(stuck))
