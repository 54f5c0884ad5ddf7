"""A cascade: one group stalls because a member never entered its collective, and groups that share
members with it stall behind it (a stuck tensor-parallel group holds every data-parallel group it
meets). The root is one finding; the groups behind it are a consequence, said in one line.

A divergence is *downstream* when every member it lacks waits in another divergence's collective:
those members are not elsewhere by choice, they are held. Pure: tested on records built by hand.
"""

from __future__ import annotations

import re

from ..groups import GroupId
from ..records import RankView
from ..states import Kind
from .findings import Divergence
from .wording import few

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _held(div: Divergence, views: dict[int, RankView], others: list[Divergence],
          culprits: frozenset = frozenset()) -> bool:
    """Every member ``div`` lacks waits in one of ``others``' collectives, at its position, or is
    one of ``culprits`` (a root's own missing members: a group that waits for them directly is
    behind the same root)."""
    if div.kind != Kind.RANK_LEFT or not div.absent:
        return False
    for r in div.absent:
        if r in culprits:
            continue
        cur = views[r].current if r in views else None
        if cur is None or not any(o is not div and cur.pg == o.pg and cur.seq == o.seq and r in o.records
                                  for o in others):
            return False
    return True


def next_for(div: Divergence, views: dict[int, RankView]) -> int:
    """How early the missing members left ``div``'s group: the place, in their own issue order, of
    their last record there. Of two groups a rank is missing from, the one it left longest ago is
    the collective it would have issued next (a training step visits its groups in turn)."""
    places = []
    for r in div.absent:
        records = views[r].records if r in views else []
        places.append(max((i for i, rec in enumerate(records) if rec.pg == div.pg), default=-1))
    return min(places, default=-1)


def roots(found: list[Divergence], views: dict[int, RankView]) -> list[Divergence]:
    """The divergences that are not downstream of another one (all of them when each is held by
    another: a cycle is a deadlock, for the deadlock rules to name)."""
    free = [d for d in found if not _held(d, views, found)]
    return free or found


def downstream(root: Divergence, found: list[Divergence], views: dict[int, RankView]) -> list[Divergence]:
    """The divergences held, directly or through others, by members waiting in ``root``, or waiting
    for ``root``'s missing members themselves."""
    held = [root]
    rest = [d for d in found if d.pg != root.pg]
    culprits = frozenset(root.absent)
    grew = True
    while grew:
        grew = False
        for d in list(rest):
            if _held(d, views, held, culprits):
                held.append(d)
                rest.remove(d)
                grew = True
    return held[1:]


def groups_text(labels: list[str]) -> str:
    """'dp_*' for dp_0 ... dp_7, 'group x' for one, else 'N groups'."""
    names = sorted({GroupId.parse(label).name for label in labels})
    if len(names) == 1:
        return f"group {labels[0]}"
    stems = {m.group(1) if (m := _NUMBERED.match(n)) else n for n in names}
    if len(stems) == 1:
        return f"{stems.pop()}*"
    return f"{len(names)} groups"


def cascade_line(root: Divergence, found: list[Divergence], views: dict[int, RankView]) -> str:
    """'; behind it, 1016 ranks wait in reduce_scatter #403 of dp_* for members of tp_64[512-519]',
    or '' without a cascade."""
    behind = downstream(root, found, views)
    if not behind:
        return ""
    waiting = sorted({r for d in behind for r, rec in d.records.items() if rec.pending})
    if not waiting:
        return ""
    first = next(iter(behind[0].records.values()))
    places = {(next(iter(d.records.values())).op, next(iter(d.records.values())).number) for d in behind}
    what = f"{first.op} #{first.number}" if len(places) == 1 else f"{len(places)} collectives"
    return (f"; behind it, {few(waiting)} wait in {what} of {groups_text([d.pg for d in behind])} "
            f"for members of {root.pg}")


def transfer_chain(view: RankView, views: dict[int, RankView]) -> list[tuple[int, str]]:
    """Where a rank's point-to-point wait leads: (rank, the transfer it waits on, as written) for each
    rank along the chain, each waiting for the peer of its transfer, and last the rank the chain
    ends at (with ''): one that waits on no transfer. Empty when ``view`` waits on none."""
    chain: list[tuple[int, str]] = []
    seen = {view.rank}
    r, cur = view.rank, view.current
    while cur is not None and cur.p2p:
        transfer = (cur.blocking_p2p() or cur.p2p)[0]
        chain.append((r, transfer.call(cur.op)))
        if transfer.peer is None or transfer.peer in seen or transfer.peer not in views:
            return []  # from any source, or a cycle: the deadlock rules' to name
        r = transfer.peer
        seen.add(r)
        cur = views[r].current
    return chain + [(r, "")] if chain else []
