"""The hang headline for every subset of ranks still running (pure: hand-written data). A rank that
finished is named by how it ended, never counted among the ranks "inside"; the grammar follows the
count (issue 30: "rank 0 are inside ... all ranks entered it" while rank 1 had exited)."""

from itertools import combinations

import pytest
from collective_records import record, view

from pytest_nccl.core.diagnosis import diagnose

WORLD = 4


def _job(live: set, pg: str = "default", seq: int = 8):
    """Ranks in ``live`` wait in all_reduce #seq of ``pg``; the others completed it and passed."""
    out = []
    for r in range(WORLD):
        done = [record(r, i, pg=pg, t=i) for i in range(1, seq)]
        last = record(r, seq, pg=pg, state="entered" if r in live else "completed", t=seq)
        out.append(view(r, "running" if r in live else "passed", done + [last],
                        finished_at=None if r in live else 1.0))
    return out


SUBSETS = [set(c) for n in range(1, WORLD + 1) for c in combinations(range(WORLD), n)]


@pytest.mark.parametrize("live", SUBSETS, ids=lambda s: "live-" + "".join(map(str, sorted(s))))
def test_hang_headline_for_each_subset_of_running_ranks(live):
    d = diagnose(_job(live), "timeout", 6)
    assert d.kind == "hang" and d.ranks == sorted(live)
    h = d.headline
    finished = sorted(set(range(WORLD)) - live)
    if not finished:
        assert h.startswith("every rank is inside all_reduce #8 of group default")
        assert h.endswith("none completed within the 6 s bound (a transport or peer problem: all ranks entered it)")
        return
    assert "every rank" not in h and "all ranks entered it" not in h, h
    if len(live) == 1:
        assert h.startswith(f"rank {min(live)} is inside all_reduce #8 of group default"), h
        assert "did not complete it within the 6 s bound" in h and " are " not in h, h
    else:
        assert " are inside all_reduce #8 of group default" in h and "none completed it within" in h, h
    # each rank that finished is named with how it ended, and no rank is both inside and finished
    tail = h.split("(a transport or peer problem: ", 1)[1]
    assert "left the test (passed) after 8 collectives in group default" in tail, h
    named = tail.split(" left the test")[0].split(" ", 1)[1]  # "ranks 0-2,3" -> "0-2,3"
    assert _expand(named) == finished, h


def _expand(text: str) -> list:
    out: list = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def test_the_issue_30_headline():
    """Node 1's watch saw rank 0 inside all_reduce #8 and rank 1 exited normally (world 2)."""
    ranks = [view(0, "running", [record(0, i, t=i) for i in range(1, 8)] + [record(0, 8, state="entered", t=8)]),
             view(1, "passed", [record(1, i, t=i) for i in range(1, 9)], finished_at=1.0)]
    d = diagnose(ranks, "timeout", 6)
    assert d.headline == ("rank 0 is inside all_reduce #8 of group default from /w/test_x.py:5 and did not "
                          "complete it within the 6 s bound (a transport or peer problem: rank 1 left the test "
                          "(passed) after 8 collectives in group default)")


def test_a_subgroup_names_only_its_finished_members():
    """Ranks 0,1 wait in a group of ranks 0-2; rank 3, outside that group, is not named."""
    pg = "tp[0-2]"
    ranks = [view(r, "running", [record(r, 1, pg=pg, state="entered")]) for r in (0, 1)]
    ranks += [view(2, "passed", [record(2, 1, pg=pg)], finished_at=1.0), view(3, "passed", [], finished_at=1.0)]
    h = diagnose(ranks, "timeout", 6).headline
    assert h.startswith("ranks 0,1 are inside all_reduce #1 of group tp[0-2]") and "rank 2 left the test" in h, h
    assert "rank 3" not in h, h
