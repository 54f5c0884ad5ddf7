"""Arguments that must pair up across ranks without being equal: all_to_all split sizes (what rank i
sends rank j is what rank j expects from rank i), and the per-group digests a rank sends with its
report, so a clean call needs no journal read."""

from __future__ import annotations

import zlib
from typing import NamedTuple

from .groups import GroupId, members_of
from .ops import SHAPE_MATCHED_OPS, SPLIT_OPS
from .records import CollectiveRecord
from .states import Source


class Digest(NamedTuple):
    """What one rank issued in one group: how many collectives, the crc32 of what every member must
    agree on (``signature_text`` of each, in order), and the all_to_all split sizes (``(seq,
    "sent/expected")`` each), which must be consistent rather than equal."""
    # the field hides the tuple's count() method, which mypy reports; the name is what readers use
    count: int  # type: ignore[assignment]
    crc: int
    splits: tuple = ()


def signature(op: str, shapes: str, dtype: str, args: str) -> str:
    """The text a digest folds for one collective: what every member must agree on (``args``: the
    journal's <args>, "red=SUM" or "root=3"). The tracer builds it with this function for every
    collective it journals; ``signature_text`` from a journal's record (a test holds the two equal)."""
    return f"{op} {shapes} {dtype} {args}" if op in SHAPE_MATCHED_OPS else f"{op} {args}"


def signature_text(op: str, shapes: str, dtype: str, reduce_op: str = "", root: int | None = None) -> str:
    """``signature`` of a record's fields."""
    args = " ".join(([f"red={reduce_op}"] if reduce_op else []) + ([f"root={root}"] if root is not None else []))
    return signature(op, shapes, dtype, args)


def fold(crc: int, text: str) -> int:
    """One collective more in a digest: the one hash every side uses."""
    return zlib.crc32(text.encode(), crc)


def digest_of(records: list) -> dict:
    """group -> ``Digest`` of a rank's records, as the tracer computes it while the rank runs: for a
    transport that has the journal but not the rank's own digest (a watched job)."""
    out: dict = {}
    for rec in records:
        if GroupId.parse(rec.pg).p2p or rec.source != Source.PYTHON:
            continue
        count, crc, splits = out.get(rec.pg, (0, 0, ()))
        if rec.op in SPLIT_OPS:
            splits += ((rec.seq, rec.splits),)
        else:
            crc = fold(crc, signature_text(rec.op, rec.shapes, rec.dtype, rec.reduce_op, rec.root))
        out[rec.pg] = Digest(count + 1, crc, splits)
    return out

def split_disagreement(records: dict, pg: str, world: int) -> list[tuple]:
    """(sender, receiver, sent, expected) for every pair where what one rank sends the other is not
    what the other expects, sorted; ranks are global."""
    order = members_of(pg, world)
    lists = {r: rec.split_lists() for r, rec in records.items()}
    out = []
    for sender, sl in sorted(lists.items()):
        if not sl or len(sl[0]) != len(order) or sender not in order:
            continue
        for j, receiver in enumerate(order):
            rl = lists.get(receiver)
            if rl and len(rl[1]) == len(order) and sl[0][j] != rl[1][order.index(sender)]:
                out.append((sender, receiver, sl[0][j], rl[1][order.index(sender)]))
    return out


def digests_agree(digests: dict, world: int) -> bool:
    """Every member of every group issued the same collectives (count, and what all must agree on:
    op, shapes, dtype, reduce op, root), with consistent all_to_all split sizes, from the per-rank
    digests (rank -> {group: Digest, or a (count, crc[, splits]) tuple}) the ranks send with their
    reports: no journal needs reading for a clean pass."""
    per_pg: dict[str, dict] = {}
    for rank, by_pg in digests.items():
        for pg, digest in by_pg.items():
            if not GroupId.parse(pg).p2p:  # transfers pair sends with receives: ``transfers_traced``
                per_pg.setdefault(pg, {})[rank] = tuple(digest)
    for pg, by_rank in per_pg.items():
        members = members_of(pg, world)
        if len({by_rank.get(r, (0, 0))[:2] for r in members}) > 1:
            return False
        splits = {r: dict(by_rank[r][2]) for r in members if r in by_rank and len(by_rank[r]) > 2}
        for seq in set().union(*splits.values()) if splits else ():
            at = {r: CollectiveRecord(r, pg, seq, "all_to_all", splits=s[seq]) for r, s in splits.items() if seq in s}
            if split_disagreement(at, pg, world):
                return False
    return True


def transfers_traced(digests: dict | None) -> bool:
    """Some rank issued point-to-point transfers (a ":p2p" group in its digest): whether they paired
    with tensors of the same shape and dtype only the journals tell."""
    return digests is not None and any(GroupId.parse(pg).p2p for by_pg in digests.values() for pg in by_pg)
