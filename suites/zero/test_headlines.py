"""``expect_diagnosis``'s reading of headlines (controller side, no ranks): which rank sets a
headline names, so a check can ask for "rank 3" or "ranks 0,1,2" at any world size."""

import pytest
from headlines import describe, named_rank_sets, names_ranks, parse_rank_list

LEFT = ("rank 3 left the test (passed) after 12 collectives in group default; ranks 0,1,2 wait in "
        "all_gather_into_tensor #13 of group pg1[0,1,2,3] from deepspeed/runtime/zero/stage_1_and_2.py:2001")
GROUPED = "ranks 1,3 left the test (passed) after 4 collectives in group default; ranks 0,2 wait in all_gather #5"
SHAPES = ("shape mismatch in all_gather_into_tensor #25 of group default: ranks 0,1,2 [353], rank 3 [182] "
          "(from partition_parameters.py:123); rank 0 killed by SIGABRT inside it")


@pytest.mark.parametrize("text, ranks", [("1", {1}), ("1,3", {1, 3}), ("1-3", {1, 2, 3}), ("0,2-4,7", {0, 2, 3, 4, 7})])
def test_parse_rank_list(text, ranks):
    assert parse_rank_list(text) == ranks


def test_mentions_in_order_and_group_labels_ignored():
    assert named_rank_sets(LEFT) == [{3}, {0, 1, 2}]  # not pg1[0,1,2,3]
    assert named_rank_sets(SHAPES) == [{0, 1, 2}, {3}, {0}]  # not the shapes


@pytest.mark.parametrize("headline, ranks, named", [
    (LEFT, 3, True), (LEFT, {3}, True), (LEFT, [0, 1, 2], True), (LEFT, 0, False), (LEFT, {0, 1}, False),
    (GROUPED, {1, 3}, True), (GROUPED, {3, 1}, True), (GROUPED, 1, False), (GROUPED, 3, False),
    (GROUPED, {0, 2}, True), ("ranks 1-3 left the test", {1, 2, 3}, True), ("ranks 1-3 left", 2, False),
    (SHAPES, 3, True), (SHAPES, 0, True), (SHAPES, 1, False), ("rank 10 left", 1, False),
])
def test_names_ranks_exactly(headline, ranks, named):
    assert names_ranks(headline, ranks) is named


def test_describe():
    assert describe(3) == "rank 3" and describe({2, 0}) == "ranks 0,2"
