"""Crossed point-to-point pairs (core/diagnosis/pairing.py), on hand-written records: the k-th send
from A to B pairs with B's k-th receive from A; a pair whose tensors differ is a verdict even when
every rank passed (the judge reads the journals of a call that issued transfers)."""

from __future__ import annotations

import re
from functools import partial

import collective_records as cr

from pytest_nccl.core.agreement import Digest, digests_agree, transfers_traced
from pytest_nccl.core.diagnosis import diagnose
from pytest_nccl.core.diagnosis.pairing import PairingFollower, crossed_pairs, ordinal
from pytest_nccl.core.journal import parse_journal, parse_p2p, transfer_text, transfers_entered
from pytest_nccl.core.judge import judge
from pytest_nccl.core.records import P2P
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import Kind, RankState, Reason, RecordState

PG = "default:p2p"
record = partial(cr.record, pg=PG, site="/w/test_pp.py:12")
view = cr.view
DONE = RecordState.COMPLETED


def send(peer, shape, dtype="float32", state=DONE):
    return P2P(send=True, peer=peer, shape=shape, dtype=dtype, state=state)


def recv(peer, shape, dtype="float32", state=DONE):
    return P2P(send=False, peer=peer, shape=shape, dtype=dtype, state=state)


def batch(rank, seq, *ops, state=DONE, site="/w/test_pp.py:12"):
    return record(rank, seq, "batch_isend_irecv", shapes="", dtype="", state=state, async_op=True, p2p=list(ops),
                  site=site)


def exchange(first_rank0, second_rank0, recv_rank1, state=DONE):
    """Rank 0 sends two tensors to rank 1 in one batch; rank 1 receives two in the order given."""
    return [view(0, RankState.PASSED, [batch(0, 1, send(1, first_rank0), send(1, second_rank0), state=state)]),
            view(1, RankState.PASSED, [batch(1, 1, *[recv(0, s) for s in recv_rank1], state=state,
                                             site="/w/test_pp.py:20")])]


def test_crossed_pair_is_named_with_both_sides_and_places():
    views = exchange("[2, 16]", "[4, 8]", ["[4, 8]", "[2, 16]"])
    diag = diagnose(views, Reason.COMPLETED, 60)
    assert diag is not None and diag.kind == Kind.P2P_MISMATCH
    assert diag.headline.startswith(
        "p2p pairing: rank 0's 1st send to rank 1 [2, 16] was received as rank 1's 1st recv from rank 0 [4, 8] (from ")
    assert re.search(r"test_pp.py:12; rank 1 from \S*test_pp.py:20\), and 1 more crossed pair; the backend "
                     "completed it without an error", diag.headline)
    assert diag.ranks == [0, 1]


def test_pairs_in_order_are_silent():
    assert crossed_pairs({v.rank: v for v in exchange("[2, 16]", "[4, 8]", ["[2, 16]", "[4, 8]"])}) == []
    assert diagnose(exchange("[2, 16]", "[4, 8]", ["[2, 16]", "[4, 8]"]), Reason.COMPLETED, 60) is None


def test_dtype_disagreement_names_the_dtypes():
    views = [view(0, RankState.PASSED, [batch(0, 1, send(1, "[4]", "float32"))]),
             view(1, RankState.PASSED, [batch(1, 1, recv(0, "[4]", "int32"))])]
    diag = diagnose(views, Reason.COMPLETED, 60)
    assert "send to rank 1 [4] float32 was received as rank 1's 1st recv from rank 0 [4] int32" in diag.headline


def test_second_send_crossing_counts_per_peer_and_group():
    # rank 0 sends to rank 2 first (another peer), then twice to rank 1: the places count per peer
    r0 = [batch(0, 1, send(2, "[3]")), batch(0, 2, send(1, "[1]"), send(1, "[4, 8]")),
          record(0, 1, "send", pg="pp[0,1]:p2p", shapes="[5]", p2p=[send(1, "[5]")])]
    r1 = [batch(1, 1, recv(0, "[1]")), batch(1, 2, recv(0, "[2, 8]")),
          record(1, 1, "recv", pg="pp[0,1]:p2p", shapes="[5]", p2p=[recv(0, "[5]")])]
    r2 = [batch(2, 1, recv(0, "[3]"))]
    views = [view(0, RankState.PASSED, r0), view(1, RankState.PASSED, r1), view(2, RankState.PASSED, r2)]
    found = crossed_pairs({v.rank: v for v in views})
    assert len(found) == 1
    diag = diagnose(views, Reason.COMPLETED, 60)
    assert "rank 0's 2nd send to rank 1 [4, 8] was received as rank 1's 2nd recv from rank 0 [2, 8]" in diag.headline


def test_receive_from_any_source_and_unknown_tensors_are_not_compared():
    any_source = [view(0, RankState.PASSED, [batch(0, 1, send(1, "[4]"))]),
                  view(1, RankState.PASSED, [batch(1, 1, recv(None, "[8]"))])]
    assert crossed_pairs({v.rank: v for v in any_source}) == []
    unknown = [view(0, RankState.PASSED, [batch(0, 1, send(1, "[4]"))]),
               view(1, RankState.PASSED, [batch(1, 1, recv(0, ""))])]
    assert crossed_pairs({v.rank: v for v in unknown}) == []


def test_a_crossing_comes_before_the_error_gloo_raised_for_it():
    views = exchange("[2, 16]", "[4, 8]", ["[4, 8]", "[2, 16]"], state=RecordState.WAITING)
    views[1] = view(1, RankState.FAILED, views[1].records, message="RuntimeError: size mismatch")
    diag = diagnose(views, Reason.COMPLETED, 60)
    assert diag.kind == Kind.P2P_MISMATCH
    assert diag.headline.endswith("; rank 1 raised RuntimeError: size mismatch")


def test_journal_keeps_each_transfers_tensor_and_reads_old_lines():
    text = transfer_text(True, 1, 0, (4, 8), "float32") + "," + transfer_text(False, 1, 0, (), "int64") + ",s2:3"
    sent, got, old = parse_p2p(text)
    assert (sent.shape, sent.dtype, got.shape, got.dtype) == ("[4, 8]", "float32", "[]", "int64")
    assert (old.peer, old.tag, old.shape) == (2, 3, "")
    # a single send's tensor is the E line's own
    journal = "E\tdefault:p2p\t1\tsend\t0\t0.1\t[2, 3]\tbfloat16\t\t/w/t.py:3\tp2p=s1:0\n"
    (rec,) = parse_journal(journal, 0)
    assert (rec.p2p[0].shape, rec.p2p[0].dtype) == ("[2, 3]", "bfloat16")


def test_the_judge_reads_journals_of_a_clean_call_with_transfers():
    reports = {r: RankReport(r, state=RankState.PASSED, digest={PG: Digest(1, 0)}) for r in (0, 1)}
    crossed = exchange("[2, 16]", "[4, 8]", ["[4, 8]", "[2, 16]"])
    outcome = judge(reports, 2, Reason.COMPLETED, 60, lambda: {v.rank: v.records for v in crossed})
    assert outcome.diagnosis is not None and outcome.diagnosis.kind == Kind.P2P_MISMATCH
    fine = exchange("[2, 16]", "[4, 8]", ["[2, 16]", "[4, 8]"])
    assert judge(reports, 2, Reason.COMPLETED, 60, lambda: {v.rank: v.records for v in fine}).clean
    # no transfers: no journal read at all
    plain = {r: RankReport(r, state=RankState.PASSED, digest={"default": Digest(1, 7)}) for r in (0, 1)}
    assert judge(plain, 2, Reason.COMPLETED, 60, lambda: 1 / 0).clean


def test_transfer_counts_differ_across_ranks_without_disagreeing():
    digests = {0: {PG: Digest(3, 0)}, 1: {PG: Digest(1, 0)}}  # a first stage sends, a middle one both
    assert digests_agree(digests, 2) and transfers_traced(digests)
    assert not transfers_traced({0: {"default": Digest(1, 0)}})


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]


def test_the_follower_pairs_as_transfers_come_and_keeps_only_the_unpaired():
    follower = PairingFollower()
    r0 = batch(0, 1, send(1, "[2, 16]"), send(1, "[4, 8]"))
    assert follower.add(0, r0) == []  # no receive yet: nothing to compare
    (first,) = follower.add(1, batch(1, 1, recv(0, "[4, 8]")))
    assert (first.send.k, first.send.p2p.shape, first.recv.p2p.shape) == (1, "[2, 16]", "[4, 8]")
    assert follower.add(1, batch(1, 2, recv(0, "[4, 8]"))) == []  # the 2nd pair agrees
    assert all(not sends and not recvs for sends, recvs in follower.queues.values())
    # a receive from any source on that channel: which send it takes is not known, nothing is said
    follower.add(1, batch(1, 3, recv(None, "[1]")))
    follower.add(0, batch(0, 2, send(1, "[9]")))
    assert follower.add(1, batch(1, 4, recv(0, "[3]"))) == []


def test_a_rank_gloo_aborted_is_the_consequence_not_its_peer_that_lost_the_connection():
    views = exchange("[2, 16]", "[4, 8]", ["[4, 8]", "[2, 16]"], state=RecordState.WAITING)
    views = [view(0, RankState.FAILED, views[0].records, message="RuntimeError: Connection reset by peer"),
             view(1, RankState.DEAD, views[1].records, signal_name="SIGABRT")]
    diag = diagnose(views, Reason.COMPLETED, 60)
    assert diag.kind == Kind.P2P_MISMATCH and diag.headline.endswith("; rank 1 killed by SIGABRT")


def test_the_watch_reads_only_transfer_lines():
    lines = (b"E\tdefault\t1\tall_reduce\t0\t0.1\t[4]\tfloat32\t\t/w/t.py:3\tred=SUM\n"
             b"E\tdefault:p2p\t1\tbatch_isend_irecv\t1\t0.2\t\t\t\t/w/t.py:4\tp2p=s1:0:4x8:float32,r1:0:2x16:float32\n"
             b"C\tdefault:p2p\t1\t0.3\n")
    (rec,) = transfers_entered(lines, 0)
    assert [(p.send, p.peer, p.shape) for p in rec.p2p] == [(True, 1, "[4, 8]"), (False, 1, "[2, 16]")]
    assert transfers_entered(lines.split(b"\n", 1)[0] + b"\n", 0) == []
