"""The judge on hand-written reports and records: every transport's one call once the referee stopped
watching; the rank report's JSON form; the one digest; exit statuses."""

from __future__ import annotations

import os
import signal

import pytest
from collective_records import record

from pytest_nccl.core.agreement import Digest, digest_of, digests_agree
from pytest_nccl.core.exits import decode_wait_status, describe_wait_status, signal_name
from pytest_nccl.core.judge import judge, settled
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import Kind, RankState, Reason


def reports(*states, digest=None) -> dict:
    return {r: RankReport(r, RankState(s), digest=digest) for r, s in enumerate(states)}


class Journals:
    """A journals() callable that counts how often it was asked."""

    def __init__(self, journals: dict):
        self.journals, self.asked = journals, 0

    def __call__(self) -> dict:
        self.asked += 1
        return self.journals


def test_a_clean_call_reads_no_journal():
    digest = {"default": Digest(2, 7)}
    journals = Journals({})
    result = judge(reports("passed", "passed", digest=digest), 2, Reason.COMPLETED, 60, journals)
    assert result.clean and result.all_passed and journals.asked == 0
    assert [v.status for v in result.ranks] == [RankState.PASSED, RankState.PASSED]


def test_digests_that_differ_make_a_passing_call_a_failure_with_the_records():
    reps = {0: RankReport(0, RankState.PASSED, digest={"default": Digest(2, 7)}),
            1: RankReport(1, RankState.PASSED, digest={"default": Digest(1, 3)})}
    journals = Journals({0: [record(0, 1), record(0, 2)], 1: [record(1, 1)]})
    result = judge(reps, 2, Reason.COMPLETED, 60, journals)
    assert not result.clean and journals.asked == 1
    assert result.diagnosis.kind == Kind.RANK_LEFT
    assert result.diagnosis.headline.startswith("rank 1 left the test (passed) after 1 collective in group default")
    assert len(result.ranks[0].records) == 2


def test_reports_without_digests_are_checked_on_their_records():
    """A watched job's ranks send no digest: the judge computes it from the journals, once."""
    same = Journals({0: [record(0, 1)], 1: [record(1, 1)]})
    assert judge(reports("passed", "passed"), 2, Reason.COMPLETED, 60, same).clean and same.asked == 1
    differ = Journals({0: [record(0, 1, shapes="[4]")], 1: [record(1, 1, shapes="[5]")]})
    result = judge(reports("passed", "passed"), 2, Reason.COMPLETED, 60, differ)
    assert result.diagnosis.kind == Kind.SHAPE_MISMATCH and differ.asked == 1


def test_untraced_calls_compare_no_digest():
    journals = Journals({})
    assert judge(reports("passed", "passed"), 2, Reason.COMPLETED, 60, journals, trace=False).clean
    assert journals.asked == 0


def test_a_rank_without_a_report_is_running_and_an_error_is_a_failure():
    result = judge({0: RankReport(0, RankState.ERROR, message="cannot load x")}, 2, Reason.DECIDED, 60,
                   Journals({0: [], 1: []}))
    assert [v.status for v in result.ranks] == [RankState.FAILED, RankState.RUNNING]
    assert result.diagnosis.kind == Kind.RAISED and "rank 0 raised cannot load x" in result.diagnosis.headline


def test_a_decision_overtaken_by_every_rank_finishing_clean_is_a_clean_completion():
    """A rule decided on what it saw (a rank of another node looked gone under load), but every rank
    had passed by the time the reports were taken: clean, not 'the ranks disagree' (a CI failure of a
    clean two-node job)."""
    digest = {"default": Digest(8, 3)}
    result = judge(reports("passed", "passed", digest=digest), 2, Reason.DECIDED, 6, Journals({}))
    assert result.clean and result.reason == Reason.COMPLETED
    result = judge(reports("passed", "failed", digest=digest), 2, Reason.DECIDED, 6, Journals({0: [], 1: []}))
    assert result.diagnosis.kind == Kind.RAISED and "rank 1" in result.diagnosis.headline


def test_every_rank_finished_only_after_the_bound_is_a_timeout_rounded_for_people():
    result = judge(reports("passed", "passed", digest={}), 2, Reason.TIMEOUT, 2.87518, Journals({0: [], 1: []}))
    assert result.diagnosis.kind == Kind.TIMEOUT
    assert "its 2.9 s bound" in result.diagnosis.headline


def test_settled_when_every_live_rank_waits_in_a_collective():
    journals = {0: [record(0, 1, state="entered")], 1: [record(1, 1)]}
    assert settled(journals, [0])
    assert not settled(journals, [0, 1])  # rank 1 is outside any collective: it may still finish


def test_the_report_json_round_trip_keeps_every_field():
    report = RankReport(3, RankState.FAILED, message="RuntimeError: x", exc_type="RuntimeError", exc_text="tb",
                        output="hello", digest={"default": Digest(2, 9, ((1, "1,1/1,1"),))}, stack="Thread",
                        exit_code=None, signal_name=None, initialized=False, dangling=1, ended=12.5,
                        finished_at=0.25, duration=0.2, call_id=4, value=b"\x00\x01", unloadable=True)
    assert RankReport.from_json(report.to_json()) == report


def test_the_report_json_form_tolerates_what_a_newer_writer_adds():
    back = RankReport.from_json('{"rank": 1, "state": "some-new-state", "extra": 3}')
    assert back.rank == 1 and back.state == RankState.FAILED
    assert RankReport.from_json('{"rank": 0, "state": "passed"}').digest is None


def test_digest_of_records_is_the_tracers_digest_format():
    records = [record(0, 1, reduce_op="SUM"), record(0, 2, op="broadcast", root=1),
               record(0, 3, op="all_to_all_single", splits="1,1/1,1"),
               record(0, 1, op="send", pg="default:p2p")]
    digest = digest_of(records)
    assert set(digest) == {"default"} and digest["default"].count == 3
    assert digest["default"].splits == ((3, "1,1/1,1"),)
    other = digest_of([record(1, 1, reduce_op="MAX"), *records[1:3]])
    assert not digests_agree({0: digest, 1: other}, 2)
    assert digests_agree({0: digest, 1: digest_of(records)}, 2)


@pytest.mark.parametrize("status, code, sig, text", [
    (0, 0, None, "exited with code 0"),
    (3 << 8, 3, None, "exited with code 3"),
    (signal.SIGKILL, None, "SIGKILL", "killed by SIGKILL"),
    (-1, None, None, "exited"),
])
def test_wait_statuses_decode_once(status, code, sig, text):
    if status >= 0 and sig is not None:
        assert os.WIFSIGNALED(status)
    assert decode_wait_status(status) == (code, sig)
    assert describe_wait_status(status) == text


def test_an_unknown_signal_number_is_named_by_its_number():
    assert signal_name(200) == "signal 200"


TRACED = r'''
import os, sys, tempfile
import torch, torch.distributed as dist
from pytest_nccl.rank import tracer
from pytest_nccl.core.agreement import Digest, digest_of
from pytest_nccl.core.journal import read_journal
tracer.install()
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
journal = tempfile.mktemp()
tracer.start(journal)
t = torch.ones(4)
dist.all_reduce(t)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
dist.broadcast(t, src=0)
dist.reduce(t, dst=0)
dist.all_to_all_single(torch.empty(4), t)
dist.barrier()
digest, _ = tracer.stop()
dist.destroy_process_group()
ours = {pg: Digest(*d) for pg, d in digest.items()}
theirs = digest_of(read_journal(journal, 0))
print(ours == theirs, ours, theirs)
sys.exit(0 if ours == theirs else 1)
'''


def test_the_tracers_digest_and_the_digest_of_its_journal_are_one_hash(tmp_path):
    """The tracer folds each collective into its digest on its hot path; a transport that has only
    the journal (a watched job) computes it with ``digest_of``: the two must be the same hash."""
    import subprocess
    import sys
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", TRACED], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_interrupted_call_says_how_long_it_ran_where_a_bound_would_be():
    """Every rank waits in the same collective when Ctrl-C comes: the hang's words, with the time the
    call ran instead of the bound it never reached, and the signal."""
    journals = {r: [record(r, 1, state="entered")] for r in range(2)}
    outcome = judge(reports("running", "running"), 2, Reason.INTERRUPTED, 300.0, Journals(journals),
                    elapsed=8.24, interrupted="SIGINT")
    assert outcome.diagnosis.kind == Kind.HANG and outcome.interrupted == "SIGINT"
    assert outcome.diagnosis.headline.startswith("interrupted after 8.2 s (SIGINT): every rank is inside "
                                                 "all_reduce #1 of group default")
    assert "none completed within 8.2 s (" in outcome.diagnosis.headline and "300" not in outcome.diagnosis.headline


def test_an_interrupted_call_outside_any_collective_is_not_said_to_exceed_a_bound():
    stack = 'Thread MainThread:\n  File "/w/t.py", line 3, in f\n    time.sleep(60)\n'
    full = {r: RankReport(r, RankState.RUNNING, stack=stack) for r in range(2)}
    outcome = judge(full, 2, Reason.INTERRUPTED, 60.0, Journals({}), elapsed=2.0, interrupted="SIGHUP")
    assert outcome.diagnosis.headline == ("interrupted after 2 s (SIGHUP): the test was outside any collective "
                                          "(ranks 0,1 at /w/t.py:3 (in f): time.sleep(60))")


def test_ranks_the_same_ctrl_c_ended_keep_the_call_interrupted():
    """Every rank finished, one by the KeyboardInterrupt a terminal's Ctrl-C gave it too: still an
    interrupted call, its headline saying where that rank was."""
    full = {0: RankReport(0, RankState.PASSED), 1: RankReport(1, RankState.FAILED, exc_type="KeyboardInterrupt",
                                                              message="KeyboardInterrupt")}
    journals = {0: [record(0, 1)], 1: [record(1, 1)]}
    outcome = judge(full, 2, Reason.INTERRUPTED, 60.0, Journals(journals), elapsed=3.0, interrupted="SIGINT")
    assert outcome.reason == Reason.INTERRUPTED and outcome.diagnosis.kind == Kind.RAISED
    assert outcome.diagnosis.headline.startswith("interrupted after 3 s (SIGINT): rank 1 raised KeyboardInterrupt")
