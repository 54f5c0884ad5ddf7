"""Crossed point-to-point pairs: a send and the receive it pairs with (the k-th send from A to B
pairs with B's k-th receive from A, whatever either side meant) that disagree on shape or dtype.
NCCL's transfers are tagless and gloo's share tag 0, so two sends to one peer enqueued in another
order than the peer's receives cross silently when the byte counts match (Megatron-LM#5100/#5271)."""

from __future__ import annotations

from dataclasses import dataclass

from ..groups import GroupId
from ..records import P2P, CollectiveRecord, RankView
from ..sites import headline_site
from ..states import Kind, RankState, RecordState
from ..waits import P2PIndex
from .divergence import PEER_GONE
from .findings import Diagnosis
from .wording import HEADLINE_WIDTH, brief


@dataclass
class Side:
    """One end of a pair: the rank, its record, the transfer, and its place among the rank's
    transfers of that direction to (from) that peer."""
    rank: int
    rec: CollectiveRecord
    p2p: P2P
    k: int


@dataclass
class Crossing:
    """A send and the receive it paired with, whose tensors differ in shape or dtype."""
    send: Side
    recv: Side

    @property
    def pg(self) -> str:
        return self.send.rec.pg


def differ(send: P2P, recv: P2P) -> bool:
    """The two sides of a pair carry tensors of another shape or dtype (both known)."""
    if not send.shape or not recv.shape:  # an old journal, an object list: not known
        return False
    return send.shape != recv.shape or bool(send.dtype and recv.dtype and send.dtype != recv.dtype)


def crossed_pairs(views: dict) -> list[Crossing]:
    """Every pair whose send and receive disagree on shape or dtype, in group, sender, receiver,
    place order; pairs where either side's tensor is not known (an old journal, object lists) are
    not compared. ``views``: rank -> RankView."""
    out = []
    for k, (sr, srec, sp), (rr, rrec, rp) in P2PIndex(views).pairs():
        if not sp.obj and differ(sp, rp):
            out.append(Crossing(Side(sr, srec, sp, k), Side(rr, rrec, rp, k)))
    return out


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _tensor(p: P2P, other: P2P) -> str:
    """'[4, 8]', with the dtype when the two sides' dtypes differ: '[4, 8] float32'."""
    return f"{p.shape} {p.dtype}" if p.dtype != other.dtype and p.dtype and other.dtype else p.shape


def pairing_headline(found: list[Crossing]) -> str:
    """'p2p pairing: rank 0's 2nd send to rank 1 [4, 8] was received as rank 1's 1st recv from rank 0
    [2, 8]' (the first crossed pair), where each side was issued, and how many more pairs crossed."""
    c = found[0]
    s, r = c.send, c.recv
    group = GroupId.parse(c.pg).collectives.label
    tag = f" with tag {s.p2p.tag}" if s.p2p.tag else ""
    text = (f"p2p pairing: rank {s.rank}'s {ordinal(s.k)} send to rank {r.rank} {_tensor(s.p2p, r.p2p)} was "
            f"received as rank {r.rank}'s {ordinal(r.k)} recv from rank {s.rank} {_tensor(r.p2p, s.p2p)}"
            f"{'' if group == 'default' else ' in group ' + group}{tag}")
    sites = [(rank, headline_site(rec.site)) for rank, rec in ((s.rank, s.rec), (r.rank, r.rec))]
    if sites[0][1] and len(text) < HEADLINE_WIDTH:
        same = sites[1][1] == sites[0][1] or not sites[1][1]
        text += f" (from {sites[0][1]}" + ("" if same else f"; rank {sites[1][0]} from {sites[1][1]}") + ")"
    if len(found) > 1:
        text += f", and {len(found) - 1} more crossed pair{'s' if len(found) > 2 else ''}"
    return text


def pairing_diagnosis(found: list[Crossing], ranks: list[RankView]) -> Diagnosis:
    """The verdict on crossed pairs, with what followed: a rank gloo aborted on a size it did not
    expect, one that raised (not because a peer went), or the tensors arrived with the wrong shape."""
    c = found[0]
    dead = [v for v in ranks if v.status == RankState.DEAD]
    raised = [v for v in ranks if v.status == RankState.FAILED and not any(m in v.message for m in PEER_GONE)]
    if dead:
        then = f"rank {dead[0].rank} {dead[0].exit_description}"
    elif raised:
        then = f"rank {raised[0].rank} raised {brief(raised[0].message or raised[0].exc_type)}"
    elif c.send.p2p.state == c.recv.p2p.state == RecordState.COMPLETED:
        then = "the backend completed it without an error: the received tensor is wrong"
    else:
        then = "neither side completed it"
    return Diagnosis(Kind.P2P_MISMATCH, f"{pairing_headline(found)}; {then}",
                     sorted({c.send.rank, c.recv.rank}), c.pg, c.send.rec.seq)


class PairingFollower:
    """Transfers fed as ranks issue them, each paired once the other side's arrives: a watched job's
    pairs are checked as it runs, keeping only the transfers whose counterpart has not come yet."""

    def __init__(self):
        self.queues: dict[tuple, tuple[list, list]] = {}  # channel -> (sends, receives) not paired yet
        self.counts: dict[tuple, int] = {}                # (channel, send?) -> transfers fed so far
        self.any_source: set[tuple] = set()               # (group, dst, tag, obj): a receive from any source

    def add(self, rank: int, rec: CollectiveRecord) -> list[Crossing]:
        """The crossed pairs that rank ``rank``'s record ``rec`` completes."""
        found = []
        for p in rec.p2p:
            if p.obj or (not p.send and p.peer is None):
                if not p.send:  # which send it takes is the backend's choice: that channel is not compared
                    self.any_source.add((rec.pg, rank, p.tag, p.obj))
                continue
            channel = (rec.pg, rank, p.peer, p.tag) if p.send else (rec.pg, p.peer, rank, p.tag)
            k = self.counts[(channel, p.send)] = self.counts.get((channel, p.send), 0) + 1
            sends, recvs = self.queues.setdefault(channel, ([], []))
            (sends if p.send else recvs).append(Side(rank, rec, p, k))
            if sends and recvs:
                s, r = sends.pop(0), recvs.pop(0)
                if (channel[0], channel[2], channel[3], False) in self.any_source:
                    continue
                if differ(s.p2p, r.p2p):
                    found.append(Crossing(s, r))
        return found
