"""Controller side: the collective table of a report, a column per rank and a row per collective of
each group, the matching prefix folded and the diverging row marked (``format_table``). A world too
wide for a column per rank (more than ten at 120 columns) shows one column per distinct history:
ranks whose shown rows are alike share it ("ranks 0-126"), so a 1,024-rank job with one slow rank
reads as two columns."""

from __future__ import annotations

from ..core.diagnosis import Diagnosis
from ..core.groups import rank_ranges
from ..core.records import CollectiveRecord, RankView
from ..core.states import RecordState, Source

TABLE_WIDTH = 120
CONTEXT_ROWS = 2  # matching rows shown above the divergence
LABEL_W = 5       # '#1234'
MIN_COL = 10      # a cell narrower than this says nothing
FOLDED_COL = 20   # a shared column's width at least: its label names several ranks

# Short op names for narrow columns (world 8 at 120 columns leaves 13 characters a cell).
SHORT_OPS = {
    "all_gather_into_tensor": "ag_tensor", "_all_gather_base": "ag_base", "all_gather": "allgather",
    "all_gather_object": "ag_object", "all_gather_coalesced": "ag_coal", "all_reduce": "allreduce",
    "all_reduce_coalesced": "ar_coal", "reduce_scatter_tensor": "rs_tensor", "_reduce_scatter_base": "rs_base",
    "reduce_scatter": "redscat", "broadcast": "bcast", "broadcast_object_list": "bc_object",
    "all_to_all_single": "a2a_single", "all_to_all": "all2all",
}


def _cell(rec: CollectiveRecord | None, width: int) -> str:
    if rec is None:
        return "-".ljust(width)
    mark = {RecordState.COMPLETED: "", RecordState.ENTERED: " ..", RecordState.WAITING: " ..w"}.get(rec.state, "")
    op, shapes = rec.op, rec.shapes
    if rec.p2p:  # peers: '>1' sends to rank 1, '<*' receives from any
        op = ("batch" if len(rec.p2p) > 1 else op) + " " + " ".join(
            f"{'>' if p.send else '<'}{'*' if p.peer is None else p.peer}" for p in rec.p2p[:3])
    if len(f"{op} {shapes}{mark}") > width:
        op, shapes = SHORT_OPS.get(op, op), shapes.replace(", ", ",")
    text = f"{op}{'*' if rec.source == Source.FLIGHT_RECORDER else ''} {shapes}".strip() + mark
    if len(text) > width:
        text = text[: width - 1] + "~"
    return text.ljust(width)


def _fit(text: str, width: int) -> str:
    return (text if len(text) <= width else text[: width - 1] + "~").ljust(width)


def one_column_each(ranks: int, width: int = TABLE_WIDTH) -> bool:
    """Whether ``ranks`` ranks get a column each (else alike ranks share one, and the report lists
    alike ranks on one line elsewhere too)."""
    return ranks <= (width - LABEL_W - 2) // (MIN_COL + 1)


def _columns(per_rank: list[list], rows: range, width: int, keep: set) -> tuple[list[tuple[str, int]], str]:
    """The table's columns as (label, the rank whose cells it shows), and a line naming the ranks left
    out (empty when none). One per rank where they fit; else one per distinct history over ``rows``,
    those holding a rank of ``keep`` (the diagnosis's) first when not all fit."""
    world = len(per_rank)
    if one_column_each(world, width):
        return [(f"rank {r}", r) for r in range(world)], ""
    fits = (width - LABEL_W - 2) // (FOLDED_COL + 1)
    alike: dict[tuple, list[int]] = {}
    for r, recs in enumerate(per_rank):
        alike.setdefault(tuple(_cell(recs[i] if i < len(recs) else None, 34) for i in rows), []).append(r)
    columns = sorted(alike.values(), key=lambda rs: (not keep & set(rs), rs[0]))
    shown, rest = sorted(columns[:fits], key=lambda rs: rs[0]), columns[fits:]
    left = sorted(r for rs in rest for r in rs)
    note = f"  ... {len(rest)} more distinct columns (ranks {rank_ranges(left)})" if rest else ""
    return [((f"ranks {rank_ranges(rs)}" if len(rs) > 1 else f"rank {rs[0]}"), rs[0]) for rs in shown], note


def format_table(ranks: list[RankView], diagnosis: Diagnosis | None, width: int = TABLE_WIDTH) -> str:
    """A column per rank (per distinct history, in a wide world), a row per collective of each group;
    '>>' marks the diverging row. '..' = entered and not completed (pending), '..w' = waiting on an
    async op, '-' = never entered. Narrow columns use short op names (SHORT_OPS)."""
    groups: list[str] = []
    for v in ranks:
        for rec in v.records:
            if rec.pg not in groups:
                groups.append(rec.pg)
    if not groups:
        return "(no collectives were recorded on any rank)"
    from_cpp = any(rec.source == Source.FLIGHT_RECORDER for v in ranks for rec in v.records)
    keep = set(diagnosis.ranks) if diagnosis is not None else set()
    lines = []
    for pg in groups:
        per_rank = [v.records_in(pg) for v in ranks]
        n = max(len(p) for p in per_rank)
        mark_seq = diagnosis.seq if diagnosis is not None and diagnosis.pg == pg else None
        before = next((p[0].before for p in per_rank if p), 0)  # a long job's window: the ranks' own numbers
        first_shown, fold = 0, ""
        if mark_seq is not None and mark_seq - 1 - CONTEXT_ROWS > 0:
            first_shown = mark_seq - 1 - CONTEXT_ROWS
            folded = first_shown + before
            fold = f"  ... {folded} matching collective{'s' if folded != 1 else ''} folded"
        elif mark_seq is None and n > 12:
            first_shown = n - 8
            fold = f"  ... {first_shown + before} collectives folded"
        last = n if mark_seq is None else min(n, mark_seq + 3)
        columns, left_out = _columns(per_rank, range(first_shown, last), width, keep)
        col = max(MIN_COL, min(34, (width - LABEL_W - 2) // len(columns) - 1))
        lines.append(f"group {pg}:")
        lines.append(" " * (LABEL_W + 2) + " ".join(_fit(label, col) for label, _ in columns))
        if fold:
            lines.append(fold)
        for i in range(first_shown, last):
            marker = ">>" if mark_seq == i + 1 else "  "
            shown = (per_rank[r] for _, r in columns)
            cells = " ".join(_cell(p[i] if i < len(p) else None, col) for p in shown)
            lines.append(f"{marker}{('#' + str(i + 1 + before)).rjust(LABEL_W)} {cells}".rstrip())
        if last < n:
            lines.append(f"  ... {n - last} more")
        if left_out:
            lines.append(left_out)
    if from_cpp:
        lines.append("  * issued from C++ (DDP's reducer, functional collectives): seen by the Flight Recorder")
    return "\n".join(lines)
