"""Every rank must collect the same tests in the same order: the one message when they do not."""

from __future__ import annotations

from .timing import TIMING


def collection_difference(lists: dict, world: int, gone: list) -> str | None:
    """One message naming the ranks and the first differing test, or None when they all agree.
    ``lists``: rank -> its ``messages.Collected``."""
    head = "pytest-nccl SPMD mode: every rank must collect the same tests in the same order"
    if gone:
        return f"{head}; {'ranks' if len(gone) > 1 else 'rank'} {','.join(map(str, gone))} ended before collecting"
    missing = [r for r in range(world) if r not in lists]
    if missing:
        return (f"{head}; {'ranks' if len(missing) > 1 else 'rank'} {','.join(map(str, missing))} did not finish "
                f"collecting within {TIMING.collect_wait:g} s")
    ref = lists[0].ids
    parts = []
    for r in range(1, world):
        ids = lists[r].ids
        if ids == ref:
            continue
        # the lists may differ in length (a rank collected more): the first difference is past the shorter
        i = next((i for i, (a, b) in enumerate(zip(ref, ids, strict=False)) if a != b), min(len(ref), len(ids)))
        mine = ref[i] if i < len(ref) else "(nothing)"
        theirs = ids[i] if i < len(ids) else "(nothing)"
        parts.append(f"rank {r} collected {len(ids)} tests, rank 0 {len(ref)}; first difference at test "
                     f"#{i + 1}: rank 0 {mine!r}, rank {r} {theirs!r}")
    errors_by_rank = {r: lists[r].errors for r in range(world) if lists[r].errors}
    if parts:
        extra = ""
        if errors_by_rank:
            extra = "; collection errors on " + ", ".join(f"rank {r} ({n})" for r, n in errors_by_rank.items())
        return f"{head}: " + "; ".join(parts[:3]) + extra
    return None
