"""core/stragglers.py on hand-written journals: the rank that arrives last at a group's collectives
and how long the others waited for it; quiet when the ranks are even."""

from __future__ import annotations

import random

from pytest_nccl.core.journal import parse_journal
from pytest_nccl.core.stragglers import stragglers


def journal(inside: list[float], pg: str = "default", async_op: bool = False) -> str:
    """One rank's journal: collective i entered at t, completed ``inside[i]`` seconds later."""
    lines, t = [], 0.0
    for seq, d in enumerate(inside, 1):
        flag = 1 if async_op else 0
        lines.append(f"E\t{pg}\t{seq}\tall_reduce\t{flag}\t{t:.6f}\t[4]\tfloat32\t{seq}\tx.py:3\tred=SUM")
        lines.append(f"C\t{pg}\t{seq}\t{t + d:.6f}")
        t += d + 0.1
    return "\n".join(lines) + "\n"


def records(per_rank: dict[int, list[float]], **kw) -> dict:
    return {r: parse_journal(journal(inside, **kw), r) for r, inside in per_rank.items()}


def test_a_slow_rank_is_named_with_the_others_wait():
    # rank 3 computes 0.05 s longer before every collective: the others wait for it inside each one
    n = 1200
    per_rank = {r: [0.001 if r == 3 else 0.051] * n for r in range(4)}
    (found,) = stragglers(records(per_rank))
    assert (found.group, found.rank, found.last, found.compared) == ("default", 3, n, n)
    assert abs(found.waited_s - 3 * 0.05 * n) < 1e-6
    assert found.line() == ("group default: rank 3 arrived last at 100% of 1,200 collectives; "
                            "the others waited 180 s in all")
    assert found.to_json()["waited_s"] == 180.0


def test_mostly_last_reads_as_a_share():
    rng = random.Random(0)
    n = 200
    slow = [rng.random() < 0.92 for _ in range(n)]  # rank 1 is last at 92% of them
    per_rank = {0: [0.2 if s else 0.001 for s in slow], 1: [0.001 if s else 0.2 for s in slow]}
    (found,) = stragglers(records(per_rank))
    assert found.rank == 1 and found.last == sum(slow)
    assert f"arrived last at {sum(slow) / n:.0%} of 200 collectives" in found.line()


def test_even_ranks_are_quiet():
    rng = random.Random(1)
    per_rank = {r: [rng.uniform(0.001, 0.004) for _ in range(1000)] for r in range(4)}
    assert stragglers(records(per_rank)) == []


def test_a_short_or_cheap_wait_is_quiet():
    # always last, but the others waited 0.1 ms each time: no news
    assert stragglers(records({0: [0.0011] * 500, 1: [0.001] * 500})) == []
    # always last with long waits, but only 5 collectives
    assert stragglers(records({0: [1.0] * 5, 1: [0.001] * 5})) == []


def test_async_and_unfinished_collectives_do_not_count():
    assert stragglers(records({0: [1.0] * 50, 1: [0.001] * 50}, async_op=True)) == []
    recs = records({0: [1.0] * 50, 1: [0.001] * 50})
    recs[1] = recs[1][:5]  # rank 1 journaled only 5 of them: the rest lack a member
    assert stragglers(recs) == []


def test_each_group_has_its_own_straggler():
    recs = records({0: [0.5] * 20, 1: [0.001] * 20})
    side = records({0: [0.001] * 20, 1: [0.5] * 20}, pg="tp[0,1]")
    for r in recs:
        recs[r] += side[r]
    found = stragglers(recs)
    assert [(s.group, s.rank) for s in found] == [("default", 1), ("tp[0,1]", 0)]
