"""Journal v3 and the wording of waits outside any collective (issue 23, items 3 and 5), on
hand-written data: no torch, no processes."""

from __future__ import annotations

from pytest_nccl.core.diagnosis import diagnose
from pytest_nccl.core.diagnosis.outside import busy_at, in_rendezvous, outside_text
from pytest_nccl.core.groups import label_ranks, members_of
from pytest_nccl.core.journal import JournalTail, parse_journal
from pytest_nccl.core.records import CollectiveRecord, RankView
from pytest_nccl.core.states import RankState, Source

OUTSIDE = Source.OUTSIDE

S = "test_x.py"
STACK = 'Thread MainThread:\n  File "test_x.py", line {}, in test_y\n    {}\n'


def outside(rank, seq, what, line, state="entered", **detail):
    return CollectiveRecord(rank=rank, pg="outside", seq=seq, op=what, site=f"{S}:{line}", state=state,
                            source=OUTSIDE, detail={k: str(v) for k, v in detail.items()})


def test_journal_v3_lines_read_back_and_old_readers_skip_them():
    text = ("O\toutside\t1\tTCPStore\t0\t0.000100\t\t\t\t/w/t.py:3\tstore=127.0.0.1:5000 n=3 role=server\n"
            "E\tdefault\t1\tall_reduce\t0\t1520000e-9\t[4]\tfloat32\t1\t/w/t.py:4\tred=SUM\n"
            "O\toutside\t2\tProcessGroupGloo\t0\t0.002\t\t\t\t/w/t.py:5\tstore=127.0.0.1:5000 n=3 r=1\n"
            "U\toutside\t2\tjoined=1\n"
            "C\toutside\t1\t0.0015\n"
            "C\tdefault\t1\t1700000e-9\n")
    store, reduce, group = parse_journal(text, 1)
    assert (store.source, store.state, store.detail) == (OUTSIDE, "completed",
                                                         {"store": "127.0.0.1:5000", "n": "3", "role": "server"})
    assert abs(reduce.t_start - 0.00152) < 1e-12 and abs(reduce.duration - 0.00018) < 1e-9  # "<ns>e-9"
    assert group.pending and group.detail["joined"] == "1"
    view = RankView(1, records=[store, reduce, group])
    assert view.current is None and view.outside_wait is group  # a wait outside is never a collective
    tail = JournalTail(1)
    assert [r.op for r in tail.feed(text.encode())] == ["TCPStore", "all_reduce", "ProcessGroupGloo"]
    assert tail.by_key[("outside", 2)].detail["joined"] == "1"


def test_side_group_labels_name_only_this_worlds_ranks():
    assert label_ranks("weights[0,+1]") == [0] and members_of("weights[2,+3]", 4) == [2]
    assert label_ranks("tp[2,3]") == [2, 3]


def test_rendezvous_names_who_never_joined():
    server = RankView(0, records=[outside(0, 1, "TCPStore", 10, store="h:5", n=3, role="server")])
    client = RankView(1, records=[outside(1, 1, "TCPStore", 10, "completed", store="h:5", n=3, role="client"),
                                  outside(1, 2, "ProcessGroupGloo", 11, store="h:5", n=3, r=1, joined="1")])
    views = {0: server, 1: client}
    assert outside_text(server, views) == ("waits in TCPStore(h:5) as a server of 3 members at test_x.py:10: "
                                           "ranks 0,1 of this test arrived, 1 member never did")
    assert outside_text(client, views) == ("waits creating group gloo over h:5 (3 members, this rank 1) at "
                                           "test_x.py:11: group ranks 0,2 never joined")
    assert in_rendezvous(server) and in_rendezvous(client)
    diag = diagnose([server, client], "timeout", 6)
    assert diag.kind == "rendezvous" and diag.exception_name == "CollectiveTimeout"
    assert diag.headline.startswith("the test exceeded its 6 s bound outside any collective (rank 0 waits in "
                                    "TCPStore(h:5)"), diag.headline


def test_a_store_key_and_a_sleep_are_named_where_a_rank_waits():
    key = RankView(1, records=[CollectiveRecord(1, "default", 1, "all_reduce", state="completed"),
                               outside(1, 1, "store.wait", 20, store="h:5", key="checkpoint_path")])
    assert outside_text(key) == "waits on key 'checkpoint_path' of store h:5 (store.wait) at test_x.py:20"
    sleeping = RankView(1, records=[], stack=STACK.format(30, "time.sleep(60)"))
    assert busy_at(sleeping) == "at test_x.py:30 (in test_y): time.sleep(60)"
    waiting = RankView(0, records=[CollectiveRecord(0, "default", 1, "all_reduce", state="entered", site=f"{S}:5")])
    for other in (key, sleeping):
        diag = diagnose([waiting, RankView(1, status=RankState.RUNNING, records=other.records, stack=other.stack)],
                        "timeout", 60)
        assert diag.kind == "slow-rank", diag.headline
        assert ("checkpoint_path" in diag.headline) or ("time.sleep(60)" in diag.headline), diag.headline
        assert "rank 0 waited for the whole 60 s bound in all_reduce #1 of group default" in diag.headline


def test_bound_left_from_a_budget_reads_rounded():
    views = [RankView(r, records=[], stack=STACK.format(9, "x = 1")) for r in range(2)]
    assert "exceeded its 24.9 s bound" in diagnose(views, "timeout", 24.9481).headline
