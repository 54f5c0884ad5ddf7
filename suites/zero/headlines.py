"""Which rank sets a pytest-nccl headline names (used by ``expect_diagnosis`` in conftest.py).

A headline names ranks one at a time ("rank 3 left the test") or grouped ("ranks 0,1,2 wait in
all_gather #5", "ranks 1-3 ..."). ``named_rank_sets`` returns each mention as a set, in order;
``names_ranks`` is true when one mention names exactly the given ranks. Numbers inside a group
label ("pg1[0,1]") or a shape ("[2, 4]") are not mentions: only "rank N" / "ranks LIST" count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# "rank 3", "ranks 1,3", "ranks 1-3", "ranks 0,2-4" (no spaces inside the list)
MENTION = re.compile(r"\branks? (\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\b")


def parse_rank_list(text: str) -> frozenset[int]:
    """'1,3' -> {1, 3}; '1-3' -> {1, 2, 3}; '0,2-4' -> {0, 2, 3, 4}."""
    ranks: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ranks.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(ranks)


def named_rank_sets(headline: str) -> list[frozenset[int]]:
    return [parse_rank_list(m.group(1)) for m in MENTION.finditer(headline)]


def as_rank_set(ranks: int | Iterable[int]) -> frozenset[int]:
    return frozenset([ranks]) if isinstance(ranks, int) else frozenset(ranks)


def names_ranks(headline: str, ranks: int | Iterable[int]) -> bool:
    """True when some mention in ``headline`` names exactly ``ranks`` (an int or a set of ints)."""
    return as_rank_set(ranks) in named_rank_sets(headline)


def describe(ranks: int | Iterable[int]) -> str:
    rs = sorted(as_rank_set(ranks))
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))
