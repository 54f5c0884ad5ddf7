"""The diagnosis of the arguments the ranks must agree on (issue 12): every argument the ranks must
agree on, point-to-point pairing, certain deadlocks failed fast and blamed by issue order, the user's
group names, gloo's own size checks, headlines that stay short at world 64.

Pure checks on hand-written records: determinism under shuffled orders and timings, world 64
lengths, the journal format, the referee's rule (the real inner sessions: test_diagnosis_sessions.py)."""

from __future__ import annotations

import random
import re

import pytest
from collective_records import record, view

from pytest_nccl.core.agreement import digests_agree
from pytest_nccl.core.diagnosis import diagnose
from pytest_nccl.core.groups import members_of, rank_ranges
from pytest_nccl.core.journal import parse_journal
from pytest_nccl.core.records import P2P, CollectiveRecord, RankView
from pytest_nccl.core.referee import (
    TIMING,
    Referee,
    deadlocked,
    stuck_on_mismatch,
    waits_for_a_finished_rank,
)
from pytest_nccl.core.states import RankState, Reason

S = "/w/test_x.py"


def rec(rank, seq, op="all_reduce", shapes="[4]", state="completed", pg="default", line=5, **kw):
    if op in ("all_reduce", "reduce_scatter_tensor") and "reduce_op" not in kw:
        kw["reduce_op"] = "SUM"
    return record(rank, seq, op, shapes, state, pg, dtype="float32" if shapes else "", site=f"{S}:{line}",
                  t=0.001 * seq, **kw)


def p2p(rank, seq, op, *transfers, state="entered", line=5):
    return record(rank, seq, op, "[2]", state, "default:p2p", site=f"{S}:{line}",
                  async_op=op in ("isend", "irecv", "batch_isend_irecv"), p2p=list(transfers))


def waiting(*transfers_states):
    return [P2P(send, peer, tag, state) for send, peer, tag, state in transfers_states]


# -- each pattern of the issue, as the journals show it -----------------------------------------------

PATTERNS = {
    "p2p-tag": ([view(0, "running", [p2p(0, 1, "send", P2P(True, 1, 1), line=8)]),
                 view(1, "running", [p2p(1, 1, "recv", P2P(False, 0, 2), line=10)])],
                "p2p tag mismatch: rank 0 waits in send(dst=1, tag=1) from /w/test_x.py:8, which rank 1 never "
                "receives; rank 1 waits in recv(src=0, tag=2) from /w/test_x.py:10, which rank 0 never sends",
                "CollectiveMismatch"),
    "broadcast-root": ([view(r, "running", [rec(r, 1, "broadcast", state="entered", root=r)]) for r in range(2)],
                       "root mismatch in broadcast #1 of group default: rank 0 src=0, rank 1 src=1 "
                       "(from /w/test_x.py:5)", "CollectiveMismatch"),
    "gather-dst": ([view(r, "running", [rec(r, 1, "gather", state="entered", root=r)]) for r in range(2)],
                   "root mismatch in gather #1 of group default: rank 0 dst=0, rank 1 dst=1 (from /w/test_x.py:5)",
                   "CollectiveMismatch"),
    "reduce-op": ([view(r, "passed", [rec(r, 1, reduce_op="MAX" if r else "SUM")]) for r in range(2)],
                  "reduce-op mismatch in all_reduce #1 of group default: rank 0 SUM, rank 1 MAX (from "
                  "/w/test_x.py:5); the backend completed it without an error: its result is wrong",
                  "CollectiveMismatch"),
    "ring": ([view(0, "passed", [p2p(0, 1, "batch_isend_irecv", P2P(True, 1, 0, "completed"),
                                     P2P(False, 3, 0, "completed"), state="completed")]),
              view(1, "running", [p2p(1, 1, "batch_isend_irecv", *waiting((True, 3, 0, "waiting"),
                                                                          (False, 0, 0, "entered")), state="waiting")]),
              view(2, "running", [p2p(2, 1, "batch_isend_irecv", *waiting((True, 3, 0, "completed"),
                                                                          (False, 1, 0, "waiting")), state="waiting")]),
              view(3, "passed", [p2p(3, 1, "batch_isend_irecv", P2P(True, 0, 0, "completed"),
                                     P2P(False, 2, 0, "completed"), state="completed")])],
             "p2p peer mismatch: rank 1 waits in isend(dst=3, tag=0) from /w/test_x.py:5, which rank 3 never "
             "receives (it passed); rank 2 waits in irecv(src=1, tag=0) from /w/test_x.py:5, which rank 1 never sends",
             "CollectiveMismatch"),
    "a2a-splits": ([view(0, "running", [rec(0, 1, "all_to_all_single", state="entered", splits="2,2/2,2")]),
                    view(1, "failed", [rec(1, 1, "all_to_all_single", state="entered", splits="1,3/2,2")],
                         message="RuntimeError: [enforce fail at gloo/alltoallv.cc:138] "
                                 "inLengthPerRank[myRank] == outLengthPerRank[myRank].")],
                   "split mismatch in all_to_all_single #1 of group default: rank 1 sends [1, 3] but "
                   "rank 0 expects 2 from it, and 1 more pair (from /w/test_x.py:5); gloo rejected it on rank 1 "
                   "(inLengthPerRank[myRank] == outLengthPerRank[myRank])", "CollectiveMismatch"),
    "mesh-skip": ([view(r, "running", [rec(r, 1, pg="tp[0,1]", line=51), rec(r, 1, "barrier", "", "entered", line=52)])
                   for r in (0, 1)]
                  + [view(2, "running", [rec(2, 1, "barrier", "", "entered", line=52)]),
                     view(3, "running", [rec(3, 1, pg="tp[2,3]", state="entered", line=51)])],
                  "rank 2 skipped all_reduce #1 of group tp[2,3] from /w/test_x.py:51 and waits in barrier #1 of "
                  "group default from /w/test_x.py:52; ranks 0,1 issued it first, rank 3 waits in it",
                  "CollectiveMismatch"),
    # a receive from any source: where the ranks that could send are (issue 40)
    "any-source-recv": ([view(0, "running", [p2p(0, 1, "recv", P2P(False, None, 0), line=7)])]
                        + [view(r, "running", [rec(r, 1, "barrier", "", "entered", line=8)]) for r in (1, 2)],
                        "p2p deadlock: rank 0 waits in recv(src=*, tag=0) from /w/test_x.py:7, which no rank "
                        "sends (ranks 1,2 wait in barrier #1 of group default from /w/test_x.py:8)",
                        "CollectiveMismatch"),
    # NCCL: rank 0 skipped the second all_reduce; rank 1's returned and never completed (issue 38)
    "nccl-in-flight": ([view(0, "passed", [rec(0, 1)]), view(1, "running", [rec(1, 1), rec(1, 2, state="in-flight")])],
                       "rank 0 left the test (passed) after 1 collective in group default; rank 1 waits for "
                       "all_reduce #2 of group default from /w/test_x.py:5 (enqueued, not completed)",
                       "CollectiveMismatch"),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_headline(name):
    views, headline, exception = PATTERNS[name]
    diag = diagnose(views, "decided", 60)
    assert (diag.headline, diag.exception_name) == (headline, exception)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_same_failure_same_headline_whatever_the_order_and_timing(name):
    """The views in any order, their journals timed any way, ranks finished in any order: one
    headline (the transports read journals in whatever order they come)."""
    views, headline, _ = PATTERNS[name]
    rng = random.Random(name)
    for _ in range(50):
        shuffled = [RankView(v.rank, v.status, records=[CollectiveRecord(**{**r.__dict__, "t_start": rng.random()})
                                                          for r in v.records],
                             message=v.message, finished_at=rng.random()) for v in views]
        rng.shuffle(shuffled)
        assert diagnose(shuffled, rng.choice(["decided", "timeout"]), 60).headline == headline


# -- world 64 ---------------------------------------------------------------------------------------

W = 64


def _tp(r):
    return f"tp[{rank_ranges(range(r // 4 * 4, r // 4 * 4 + 4))}]"


def _mesh64(r):
    if r == 5:  # skips its tp all_reduce
        return view(r, "running", [rec(r, 1, "barrier", "", "entered", line=52)])
    if r // 4 == 1:  # its tp partners wait for it
        return view(r, "running", [rec(r, 1, pg=_tp(r), state="entered", line=51)])
    return view(r, "running", [rec(r, 1, pg=_tp(r), line=51), rec(r, 1, "barrier", "", "entered", line=52)])


STACK = 'Thread MainThread:\n  File "/w/test_x.py", line {}, in test_y\n    time.sleep(9)\n'
WORLD_64 = {
    "op": [view(r, "running", [rec(r, 1, "barrier", "", "entered") if r == 63 else rec(r, 1, state="entered")])
           for r in range(W)],
    "root": [view(r, "running", [rec(r, 1, "broadcast", state="entered", root=r)]) for r in range(W)],
    "reduce-op": [view(r, "passed", [rec(r, 1, reduce_op="MAX" if r == 15 else "SUM")]) for r in range(W)],
    "shape": [view(r, "running", [rec(r, 1, shapes=f"[{r}]", state="entered")]) for r in range(W)],
    "split": [view(r, "running", [rec(r, 1, "all_to_all_single", state="entered",
                                      splits=f"{','.join(['2'] * W)}/{','.join(['2'] * (W - 1) + ['3'])}")])
              for r in range(W)],
    "left": [view(r, "passed", []) if r in (5, 9) else view(r, "running", [rec(r, 1, state="entered")])
             for r in range(W)],
    "raised": [view(r, "failed", [], message=f"ValueError: boom {r}") if r % 2 else
               view(r, "running", [rec(r, 1, state="entered")]) for r in range(W)],
    "died": [view(r, "dead" if r > 3 else "running", [rec(r, 1, state="entered")], signal_name="SIGKILL")
             for r in range(W)],
    "p2p-ring": [view(r, "running", [p2p(r, 1, "recv", P2P(False, (r - 1) % W, 0))]) for r in range(W)],
    "p2p-tag": [view(r, "running", [p2p(r, 1, "send" if r % 2 == 0 else "recv", P2P(r % 2 == 0, r ^ 1, r % 2))])
                for r in range(W)],
    "mesh": [_mesh64(r) for r in range(W)],
    "slow": [view(r, "running", [] if r == 7 else [rec(r, 1, state="entered")], stack=STACK.format(9))
             for r in range(W)],
    "timeout": [view(r, "running", [], stack=STACK.format(9 + (r == 3))) for r in range(W)],
    "hang": [view(r, "running", [rec(r, 1, state="entered")]) for r in range(W)],
}


@pytest.mark.parametrize("name", sorted(WORLD_64))
def test_headlines_stay_short_and_grouped_at_world_64(name):
    diag = diagnose(WORLD_64[name], "decided", 60)
    assert len(diag.headline) < 200, diag.headline
    # ranks are grouped, never listed one by one
    assert not re.search(r"rank \d+[^;]*rank \d+[^;]*rank \d+[^;]*rank \d+", diag.headline), diag.headline


def test_world_64_headlines_name_the_odd_ones():
    assert diagnose(WORLD_64["op"], "decided", 60).headline.startswith(
        "op mismatch at collective #1 of group default: ranks 0-62 all_reduce, rank 63 barrier")
    assert "ranks 0-14,16-63 SUM, rank 15 MAX" in diagnose(WORLD_64["reduce-op"], "completed", 60).headline
    mesh = diagnose(WORLD_64["mesh"], "decided", 60)
    assert mesh.ranks == [5] and mesh.headline.startswith("rank 5 skipped all_reduce #1 of group tp[4-7]")
    assert diagnose(WORLD_64["p2p-ring"], "decided", 60).headline.startswith(
        "p2p deadlock: ranks 0-63 all receive first: rank 0 waits in recv(src=63, tag=0)")


# -- the pieces -----------------------------------------------------------------------------------

def test_journal_v2_arguments_and_batch_transfers_read_back():
    text = ("E\tdefault\t1\tall_reduce\t0\t0.001\t[4]\tfloat32\t1\t/w/t.py:3\tred=MAX\n"
            "C\tdefault\t1\t0.002\n"
            "E\ttp[2,3]\t1\tbroadcast\t0\t0.003\t[4]\tfloat32\t1\t/w/t.py:4\troot=3 g=4\n"
            "E\tdefault\t2\tall_to_all_single\t0\t0.004\t[4]\tfloat32\t2\t/w/t.py:5\tsplit=1,3/2,2\n"
            "E\tdefault:p2p\t1\tbatch_isend_irecv\t1\t0.005\t\t\t\t/w/t.py:6\tp2p=s1:0,r*:7\n"
            "W\tdefault:p2p\t1\t0.006\t0\n"
            "C\tdefault:p2p\t1\t0.007\t0\n"
            "W\tdefault:p2p\t1\t0.008\t1\n")
    r = parse_journal(text, 2)
    assert (r[0].reduce_op, r[0].state, r[1].root, r[1].group, r[2].split_lists()) == \
        ("MAX", "completed", 3, "4", ([1, 3], [2, 2]))
    batch = r[3]
    assert [(p.send, p.peer, p.tag, p.state) for p in batch.p2p] == [(True, 1, 0, "completed"),
                                                                      (False, None, 7, "waiting")]
    assert batch.state == "waiting" and batch.blocking_p2p() == [batch.p2p[1]]
    assert batch.p2p[1].call(batch.op) == "irecv(src=*, tag=7)"
    # a v1 journal (no arguments field) still reads
    assert parse_journal("E\tdefault\t1\tall_reduce\t0\t0.001\t[4]\tfloat32\t1\t/w/t.py:3\n", 0)[0].reduce_op == ""


def test_group_labels_round_trip():
    assert rank_ranges([0, 1, 2, 3, 5, 7, 8, 9]) == "0-3,5,7-9"
    assert members_of("tp[2,3]", 4) == [2, 3] and members_of("dp[0-15]", 64) == list(range(16))
    assert members_of("pg7[0-62:2]", 64) == list(range(0, 64, 2)) and members_of("default", 3) == [0, 1, 2]
    assert members_of("pg3[0,1,2,...]", 8) == list(range(8))  # ranks not all shown: the world


def test_digests_cover_reduce_op_root_and_splits():
    assert not digests_agree({0: {"default": (1, 11)}, 1: {"default": (1, 12)}}, 2)  # crc of op/red/root differ
    consistent = {0: {"default": (1, 7, ((1, "1,2/1,2"),))}, 1: {"default": (1, 7, ((1, "2,1/2,1"),))}}
    assert digests_agree(consistent, 2)  # uneven, but what 0 sends 1 is what 1 expects from 0
    inconsistent = {0: {"default": (1, 7, ((1, "2,2/2,2"),))}, 1: {"default": (1, 7, ((1, "1,3/2,2"),))}}
    assert not digests_agree(inconsistent, 2)


def test_referee_decides_a_certain_deadlock_after_the_quiet_period():
    journals = {r: v.records for r, v in enumerate(PATTERNS["mesh-skip"][0])}

    class View:
        def journals(self):
            return journals

        def journal_sizes(self):
            return [len(j) for j in journals.values()]

        def flight_recorder_journals(self):
            return None

    live = dict.fromkeys(range(4))
    assert deadlocked(journals, live) and not stuck_on_mismatch(journals, {r: RankView(r) for r in live}, live)
    referee = Referee(4, bound=60, t0=0.0)
    now = 0.0
    while referee.step(now, View()) is None:
        now = round(now + 0.01, 6)
    # sizes first noted at the first stall check; decided once they stayed for deadlock_quiet
    assert TIMING.deadlock_quiet <= now <= TIMING.stall_check + TIMING.deadlock_quiet + 2 * TIMING.poll
    assert now < 2.0


def test_a_transfer_whose_peer_finished_without_its_counterpart_is_decided_at_once():
    journals = {r: v.records for r, v in enumerate(PATTERNS["ring"][0])}
    assert waits_for_a_finished_rank(journals, {1: None, 2: None})
    assert not deadlocked({0: [p2p(0, 1, "send", P2P(True, 1, 0))], 1: []}, {0: None, 1: None})  # 1 may still recv
    referee = Referee(4, bound=60, t0=0.0)
    referee.finished(0, RankState.PASSED, 0.1)
    referee.finished(3, RankState.PASSED, 0.1)

    class View:
        def journals(self):
            return journals

        def journal_sizes(self):
            return [1, 1, 1, 1]

    assert referee.step(0.1, View()) == Reason.DECIDED
