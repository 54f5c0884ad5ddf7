"""The group id: a label is taken apart once (name, the ranks it carries, its point-to-point side) and
formats back to the same string, so journals and messages keep carrying the label unchanged."""

import pickle

import pytest

from pytest_nccl.core.flight import group_name_of
from pytest_nccl.core.groups import GroupId, label_ranks, members_of

LABELS = ["default", "default:p2p", "tp[2,3]", "tp[2,3]:p2p", "pg4[0-15]", "pg7[0-62:2]", "pg7[0-62:2]:p2p",
          "pg3[0,1,2,...]", "weights[0,+1]", "weights[3]", "tp.pg5[2,3]", "tp.3", "gloo1", "x[]", "mesh_dp[1,0]"]


@pytest.mark.parametrize("label", LABELS)
def test_a_label_formats_back_to_itself(label):
    gid = GroupId.parse(label)
    assert gid.label == str(gid) == label
    assert pickle.loads(pickle.dumps(gid)) == gid
    assert gid.collectives.transfers.label == (label if gid.p2p else label + ":p2p")
    assert not gid.collectives.p2p and gid.transfers.p2p


def test_its_parts():
    assert GroupId.parse("tp[2,3]:p2p") == GroupId("tp", "2,3", True)
    assert GroupId.parse("default") == GroupId("default") and GroupId.parse("default:p2p").name == "default"
    assert GroupId.parse("pg7[0-62:2]") == GroupId("pg7", "0-62:2", False)  # a stride's colon is not the p2p side
    assert GroupId.parse("tp.3") == GroupId("tp.3", None, False)
    assert GroupId.parse("tp[2,3]:p2p").collectives.label == "tp[2,3]"
    assert GroupId.parse("tp[2,3]").transfers.label == "tp[2,3]:p2p"


def test_its_members():
    assert GroupId.parse("tp[2,3]:p2p").members == [2, 3]  # the transfers of a group are among its members
    assert GroupId.parse("mesh_dp[1,0]").members == [1, 0]  # group rank order, not sorted
    assert GroupId.parse("pg7[0-62:2]").members == list(range(0, 64, 2))
    assert GroupId.parse("weights[0,+1]").members == [0]  # a side group: the others are not ranks of this world
    for unknown in ("default", "default:p2p", "pg3[0,1,2,...]", "tp.3", "x[]", "pg4[a,b]"):
        assert GroupId.parse(unknown).members is None, unknown
        assert GroupId.parse(unknown).members_in(3) == [0, 1, 2]
    assert GroupId.parse("dp[0-15]").members_in(8) == list(range(8))  # ranks beyond the world left out
    assert label_ranks("tp[2,3]") == [2, 3] and members_of("tp[2,3]:p2p", 4) == [2, 3]


def test_the_c10d_name_behind_a_label():
    assert group_name_of("default") == "0" and group_name_of("pg3[0,1]") == "3"
    assert group_name_of("pg3[0,1]:p2p") == "3" and group_name_of("pg7[0-62:2]") == "7"
    assert group_name_of("tp[2,3]", group="5") == "5"
