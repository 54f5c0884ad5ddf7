"""A failed call's collectives as one self-contained HTML page (``<name>.html`` in
``--nccl-trace-dir``): a swimlane per rank, collectives as boxes in sequence order per group, the
diverging position highlighted, the headline on top, a rank's message and stack on click.

Pure: built from the ``RankView``s and the ``Diagnosis`` the report already holds, after the call.
The page has no network access, scripts or fonts from elsewhere: inline CSS and JavaScript
(``swimlane.html``, the template beside this module), the data as JSON in the page. The script draws
on a canvas the size of the view, only the columns and lanes in view, again on scroll. Once it has
drawn, it sets on ``<body>``: ``data-drawn``, ``data-diverging-drawn="group#seq"`` (when the
diagnosed position was painted), ``data-render-ms`` (``performance.now()`` at the end of the first
draw), and ``data-error`` on any script error. It draws on a canvas, only what is in view, and
folds runs of positions where every member agrees into one "N collectives agree" band (a click
unfolds it), so 64 ranks and 10,000 collectives render in well under 2 s (docs/views.md).

The data, compact: each distinct (op, shapes, dtype, state, async, source, site) once in ``kinds``;
per group and position the kind every member has (``same``), or per member where they differ
(``cols``), whether the members' signatures agree there (``match``, what the fold uses).
"""

from __future__ import annotations

import functools
import importlib.resources
import json

from ..core.diagnosis import Diagnosis
from ..core.groups import GroupId, members_of
from ..core.ops import P2P_OPS
from ..core.records import CollectiveRecord, RankView
from ..core.sites import short_path
from ..core.states import RankState
from .timeline import position_of

PLACEHOLDER = "__NCCL_DATA__"


def _site(site: str) -> str:
    return " <- ".join(short_path(s) for s in site.split(" <- ") if s)


def _ordered_groups(ranks: list[RankView]) -> list[str]:
    groups: list[str] = []
    seen = set()
    for view in ranks:
        for rec in view.records:
            if rec.pg not in seen:
                seen.add(rec.pg)
                groups.append(rec.pg)
    return groups


def odd_ranks(ranks: list[RankView], diagnosis: Diagnosis | None) -> list[int]:
    """Members whose record at the divergence differs from the majority's, and those absent."""
    if diagnosis is None or diagnosis.divergence is None:
        return sorted(diagnosis.ranks) if diagnosis is not None else []
    div = diagnosis.divergence
    by_sig: dict = {}
    for r, rec in div.records.items():
        by_sig.setdefault(rec.signature, []).append(r)
    odd = set(div.absent)
    if len(by_sig) > 1:
        majority = max(by_sig.values(), key=len)
        odd |= {r for rs in by_sig.values() if rs is not majority for r in rs}
    return sorted(odd | set(diagnosis.ranks))


def page_data(nodeid: str, ranks: list[RankView], diagnosis: Diagnosis | None, elapsed: float,
              bound: float, backend: str = "") -> dict:
    """What the page draws, as plain JSON-able data."""
    world = len(ranks)
    kinds: list[list] = []
    kind_index: dict[tuple, int] = {}
    site_cache: dict[str, str] = {}

    def kind_of(rec: CollectiveRecord | None) -> int:
        if rec is None:
            return -1
        site = site_cache.get(rec.site)
        if site is None:
            site = site_cache[rec.site] = _site(rec.site)
        extra = tuple(getattr(rec, name, None) for name in ("peer", "root"))
        key = (rec.op, rec.shapes, rec.dtype, rec.state, rec.async_op, rec.source, site) + extra
        k = kind_index.get(key)
        if k is None:
            k = kind_index[key] = len(kinds)
            kinds.append(list(key))
        return k

    groups = []
    for pg in _ordered_groups(ranks):
        members = [r for r in members_of(pg, world) if r < world]
        per = [ranks[r].records_in(pg) for r in members]
        n = max((len(p) for p in per), default=0)
        same: list[int] = []
        match: list[str] = []
        cols: dict[str, list] = {}
        durs: dict[str, list] = {}
        for i in range(n):
            recs = [p[i] if i < len(p) else None for p in per]
            ks = [kind_of(rec) for rec in recs]
            present = [rec for rec in recs if rec is not None]
            # point-to-point ops pair different ops (send with recv): like the diagnosis, never compared
            p2p = GroupId.parse(pg).p2p or all(rec.op in P2P_OPS for rec in present)
            agree = len(present) == len(recs) and (p2p or len({rec.signature for rec in present}) == 1)
            match.append("1" if agree else "0")
            if len(set(ks)) == 1:
                same.append(ks[0])
            else:
                same.append(-1)
                cols[str(i)] = ks
                durs[str(i)] = [None if rec is None or rec.duration is None else round(rec.duration * 1000, 3)
                                for rec in recs]
        groups.append({"pg": pg, "members": members, "n": n, "same": same, "match": "".join(match),
                       "cols": cols, "durs": durs})
    position = position_of(diagnosis)
    div = diagnosis.divergence if diagnosis is not None else None
    return {
        "test": nodeid, "backend": backend, "world": world, "elapsed": round(elapsed, 3), "bound": bound,
        "headline": diagnosis.headline if diagnosis is not None else "",
        "kind": diagnosis.kind if diagnosis is not None else "",
        "position": None if position is None else {"pg": position[0], "seq": position[1]},
        "fault": sorted(diagnosis.ranks) if diagnosis is not None else [],
        "odd": odd_ranks(ranks, diagnosis),
        "absent": sorted(div.absent) if div is not None else [],
        "ranks": [{
            "rank": v.rank, "status": str(v.status), "message": v.message, "exc": v.exc_type,
            "exit": v.exit_description if v.status == RankState.DEAD else "",
            "stack": v.stack, "traceback": v.exc_text, "finished": v.finished_at,
            "count": len(v.records),
        } for v in ranks],
        "kinds": kinds,
        "groups": groups,
    }


def swimlane_html(nodeid: str, ranks: list[RankView], diagnosis: Diagnosis | None, elapsed: float,
                  bound: float, backend: str = "") -> str:
    """The page, as text."""
    data = page_data(nodeid, ranks, diagnosis, elapsed, bound, backend)
    # inside <script>: no "</script>" or "<!--" can appear once every "<" is escaped
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    title = (diagnosis.kind + ": " if diagnosis is not None else "") + nodeid
    return _page().replace("__NCCL_TITLE__", _html_escape(title)).replace(PLACEHOLDER, text, 1)


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


@functools.cache
def _page() -> str:
    """The page's HTML, CSS and JavaScript (``swimlane.html``, beside this module: one file, nothing
    fetched)."""
    return (importlib.resources.files(__package__) / "swimlane.html").read_text(encoding="utf-8")
