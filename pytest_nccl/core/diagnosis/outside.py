"""How a headline says where a rank outside any collective waits.

A rank the tracer saw enter a wait outside any collective (journal v3: a store or a group being
created, a store read; ``Source.OUTSIDE``) is named by that wait, with what the store told about
who joined; any other rank by its stack's innermost user frame and that line's source
(``time.sleep(60)``, ``q.get()``). No torch, no processes: tested on hand-written records.
"""

from __future__ import annotations

from ..groups import rank_ranges
from ..records import RankView
from ..sites import headline_site, stack_source, stack_top
from ..states import RankState, Source

# Waits in which other members must arrive: a rank blocked there waits in a rendezvous.
RENDEZVOUS_WAITS = frozenset({"TCPStore", "ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupXCCL",
                              "_new_process_group_helper"})
SOURCE_WIDTH = 60  # characters of a source line a headline quotes


def _ranks_text(ranks) -> str:
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def _joined_in_store(address: str, views: dict) -> list[int]:
    """Ranks of this test that reached a rendezvous over the store at ``address`` (in it now, or
    past it): the members of it that are ranks of the test."""
    return sorted(r for r, v in views.items()
                  if any(rec.source == Source.OUTSIDE and rec.op in RENDEZVOUS_WAITS
                         and rec.detail.get("store") == address
                         for rec in v.records))


def outside_text(view: RankView, views: dict | None = None) -> str:
    """'waits in TCPStore(127.0.0.1:5000) as the server of 3 members at x.py:12: ranks 0,1 arrived,
    1 member never did' for the rank's wait outside any collective; '' when it is in none."""
    rec = view.outside_wait
    if rec is None:
        return ""
    d = rec.detail
    site = headline_site(rec.site)
    at = f" at {site}" if site else ""
    store = d.get("store", "?")
    if rec.op in ("store.get", "store.wait"):
        return f"waits on key '{d.get('key', '?')}' of store {store} ({rec.op}){at}"
    size = d.get("n", "?")
    if rec.op == "TCPStore":
        role = "server" if d.get("role") == "server" else "client"
        text = f"waits in TCPStore({store}) as a {role} of {size} members{at}"
        arrived = _joined_in_store(store, views or {view.rank: view})
        if size.isdigit() and role == "server":
            missing = int(size) - len(arrived)
            if missing > 0:
                text += (f": {_ranks_text(arrived)} of this test arrived, {missing} member"
                         f"{'s' if missing > 1 else ''} never did")
        return text
    name = d.get("name") or rec.op.removeprefix("ProcessGroup").lower()
    text = f"waits creating group {name} over {store} ({size} members, this rank {d.get('r', '?')}){at}"
    joined = d.get("joined")
    if joined is not None and size.isdigit():
        present = [int(r) for r in joined.split(",") if r.isdigit()]
        never = [r for r in range(int(size)) if r not in present]
        if never:
            text += f": group rank{'s' if len(never) > 1 else ''} {rank_ranges(never)} never joined"
    return text


def elsewhere(views: list) -> list[str]:
    """For a headline about a rank that raised or died: where the running ranks outside any
    collective are ('rank 1 is busy outside any collective at x.py:8: time.sleep(60)': the peer a
    monitored_barrier waited for), ranks in one place together, the first place only."""
    by_rank = {v.rank: v for v in views}
    at: dict[str, list[int]] = {}
    for v in views:
        if v.status == RankState.RUNNING and v.current is None:
            text = running_state(v, by_rank, NO_FUNCTION)
            if text:
                at.setdefault(text, []).append(v.rank)
    return [f"{_ranks_text(ranks)} {text}" for text, ranks in list(at.items())[:1]]


def in_rendezvous(view: RankView) -> bool:
    rec = view.outside_wait
    return rec is not None and rec.op in RENDEZVOUS_WAITS


FULL, NO_FUNCTION = 2, 1  # how much of a rank's place a headline quotes, longest first


def place(view: RankView, quote: int = FULL) -> str:
    """The innermost user frame of the rank's stack and that line's source, cut to SOURCE_WIDTH
    ('x.py:12 (in f): time.sleep(60)'; NO_FUNCTION: without the function's name); '' unknown."""
    top = stack_top(view.stack)
    if not top:
        return ""
    if quote == NO_FUNCTION:
        top = top.split(" (in ", 1)[0]
    source = stack_source(view.stack)
    if len(source) > SOURCE_WIDTH:
        source = source[:SOURCE_WIDTH - 3] + "..."
    return top + (f": {source}" if source else "")


def running_state(view: RankView, views: dict | None = None, quote: int = FULL) -> str:
    """Where a running rank outside any collective is: its wait, else its stack's innermost user
    frame and that line's source (``place``); '' when neither is known."""
    text = outside_text(view, views)
    if text:
        return text
    where = place(view, quote)
    return f"is busy outside any collective at {where}" if where else ""


def busy_at(view: RankView, views: dict | None = None) -> str:
    """The short form of the slow-rank and timeout headlines: 'at x.py:12 (in f): time.sleep(60)',
    or the rank's wait outside any collective."""
    return outside_text(view, views) or "at " + (place(view) or "unknown")
