"""The referee's rules, on hand-written journals and a fake clock: no torch, no processes."""

import pytest
from collective_records import record

from pytest_nccl.core.agreement import digests_agree
from pytest_nccl.core.judge import is_clean, verdict
from pytest_nccl.core.records import RankView
from pytest_nccl.core.referee import (
    TIMING,
    Referee,
    stuck_on_mismatch,
    waits_for_a_finished_rank,
)
from pytest_nccl.core.states import RankState, Reason, Source


def rec(rank, seq, op="all_reduce", shapes="[4]", state="completed", pg="default", async_op=False,
        source="python"):
    return record(rank, seq, op, shapes, state, pg, async_op=async_op, source=Source(source))


class FakeView:
    """What a transport would report: journals that the test changes between steps."""

    def __init__(self, journals, flight_recorder=None):
        self.journals_now = journals
        self.flight_recorder = flight_recorder
        self.reads = 0

    def journals(self):
        self.reads += 1
        return self.journals_now

    def journal_sizes(self):
        return [len(j) for _, j in sorted(self.journals_now.items())]

    def flight_recorder_journals(self):
        return self.flight_recorder


def run_until_decided(referee, view, start=0.0, step=0.01, limit=100.0):
    """Step a fake clock until the referee decides; (reason, time)."""
    now = start
    while now <= start + limit:
        reason = referee.step(now, view)
        if reason is not None:
            return reason, now
        now = round(now + step, 6)
    raise AssertionError("no decision")


# -- the pure predicates ----------------------------------------------------------------------------

def test_waits_for_a_finished_rank_never_reached():
    journals = {0: [rec(0, 1), rec(0, 2, state="entered")], 1: [rec(1, 1)]}
    assert waits_for_a_finished_rank(journals, {0: None})
    assert not waits_for_a_finished_rank(journals, {0: None, 1: None})   # rank 1 may still get there


def test_waits_for_a_finished_rank_left_inside_without_completing():
    journals = {0: [rec(0, 1, state="entered")], 1: [rec(1, 1, state="entered")]}
    assert waits_for_a_finished_rank(journals, {0: None})               # rank 1 raised inside #1
    from_cpp = {0: [rec(0, 1, state="entered")], 1: [rec(1, 1, state="entered", source="flight-recorder")]}
    assert not waits_for_a_finished_rank(from_cpp, {0: None})           # its completion flag comes late


def test_waits_for_a_finished_rank_ignores_other_groups_and_p2p():
    journals = {0: [rec(0, 1, pg="pg1[0,2]", state="entered")], 1: [], 2: [rec(2, 1, pg="pg1[0,2]", state="entered")]}
    assert not waits_for_a_finished_rank(journals, {0: None, 2: None})
    p2p = {0: [rec(0, 1, "recv", pg="default:p2p", state="entered")], 1: []}
    assert not waits_for_a_finished_rank(p2p, {0: None})


def test_stuck_on_mismatch_needs_every_running_rank_waiting():
    views = {r: RankView(r) for r in range(2)}
    mismatch = {0: [rec(0, 1, shapes="[2]", state="entered")], 1: [rec(1, 1, shapes="[3]", state="entered")]}
    assert stuck_on_mismatch(mismatch, views, {0: None, 1: None})
    busy = {0: [rec(0, 1, shapes="[2]", state="entered")], 1: [rec(1, 1, shapes="[3]")]}
    assert not stuck_on_mismatch(busy, views, {0: None, 1: None})      # rank 1 is busy elsewhere
    agreeing = {0: [rec(0, 1, state="entered")], 1: [rec(1, 1, state="entered")]}
    assert not stuck_on_mismatch(agreeing, views, {0: None, 1: None})  # a hang, not a mismatch


def test_digests_agree_per_group_members():
    assert digests_agree({0: {"default": (2, 7)}, 1: {"default": (2, 7)}}, 2)
    assert not digests_agree({0: {"default": (2, 7)}, 1: {"default": (2, 8)}}, 2)
    assert not digests_agree({0: {"default": (1, 7)}, 1: {}}, 2)          # rank 1 issued none
    assert digests_agree({0: {"pg1[0]": (3, 1)}, 1: {}}, 2)               # rank 1 is not a member


# -- the rules, with a fake clock -------------------------------------------------------------------------

def test_every_rank_finished_is_completed():
    view = FakeView({0: [rec(0, 1)], 1: [rec(1, 1)]})
    referee = Referee(2, bound=10, t0=0.0)
    referee.finished(0, RankState.PASSED, 0.1)
    assert referee.step(0.1, view) is None
    referee.finished(1, RankState.PASSED, 0.2)
    assert referee.step(0.2, view) == Reason.COMPLETED


def test_bound_is_a_timeout_and_wake_at_never_passes_it():
    referee = Referee(2, bound=3, t0=10.0, trace=False)
    assert referee.step(12.99, FakeView({})) is None and referee.wake_at() == 13.0
    assert referee.step(13.0, FakeView({})) == Reason.TIMEOUT


def test_a_failure_gets_the_grace_period_then_is_decided():
    referee = Referee(3, bound=60, t0=0.0, trace=False)
    referee.finished(1, RankState.FAILED, 2.0)
    assert referee.wake_at() == 2.0 + TIMING.grace_after_failure
    assert referee.step(2.0 + TIMING.grace_after_failure - 0.01, FakeView({})) is None
    assert referee.step(2.0 + TIMING.grace_after_failure, FakeView({})) == Reason.DECIDED


def test_a_live_rank_waiting_on_a_finished_one_is_decided_within_a_poll():
    view = FakeView({0: [rec(0, 1), rec(0, 2, "all_gather", state="entered")], 1: [rec(1, 1)]})
    referee = Referee(2, bound=60, t0=0.0)
    referee.finished(1, RankState.PASSED, 0.5)
    reason, at = run_until_decided(referee, view, start=0.5)
    assert reason == Reason.DECIDED and at <= 0.5 + TIMING.poll + 1e-9 and referee.settle


def test_journals_are_read_only_once_a_poll_is_due():
    view = FakeView({0: [rec(0, 1, state="entered")], 1: [rec(1, 1, state="entered")]})
    referee = Referee(2, bound=60, t0=0.0)
    for i in range(10):
        referee.step(i * 0.001, view)   # ten wake-ups within one poll interval
    assert view.reads == 0


def test_stalled_mismatch_is_decided_after_two_stall_checks():
    view = FakeView({0: [rec(0, 1, shapes="[2]", state="entered")], 1: [rec(1, 1, shapes="[3]", state="entered")]})
    referee = Referee(2, bound=60, t0=0.0)
    reason, at = run_until_decided(referee, view)
    assert reason == Reason.DECIDED
    # the first check only notes the sizes; the next one, a stall_check later (on the poll's beat),
    # sees them unchanged
    assert 2 * TIMING.stall_check - 1e-9 <= at <= 2 * TIMING.stall_check + 2 * TIMING.poll


def test_a_growing_journal_is_not_a_stall():
    view = FakeView({0: [rec(0, 1, shapes="[2]", state="entered")], 1: [rec(1, 1, shapes="[3]", state="entered")]})
    referee = Referee(2, bound=60, t0=0.0)
    now = 0.0
    while now < 5.0:
        view.journals_now[0].append(rec(0, len(view.journals_now[0]) + 1))  # rank 0 makes progress
        assert referee.step(now, view) is None
        now = round(now + 0.05, 6)


def test_a_true_hang_waits_for_the_bound():
    view = FakeView({0: [rec(0, 1, state="entered")], 1: [rec(1, 1, state="entered")]})
    reason, at = run_until_decided(Referee(2, bound=4, t0=0.0), view, step=0.05)
    assert reason == Reason.TIMEOUT and at == pytest.approx(4.0)


def test_the_flight_recorder_is_asked_once_a_rank_finished_and_decides():
    python_only = {0: [], 1: []}   # DDP's reducer: nothing the Python tracer saw
    merged = {0: [rec(0, 4, state="entered", source="flight-recorder")], 1: [rec(1, 1, source="flight-recorder")]}
    referee = Referee(2, bound=60, t0=0.0, flight_recorder=True)
    referee.finished(1, RankState.PASSED, 0.2)
    reason, at = run_until_decided(referee, FakeView(python_only, flight_recorder=merged), start=0.2)
    assert reason == Reason.DECIDED and at == pytest.approx(TIMING.flight_recorder_poll, abs=0.06)


def test_without_trace_only_the_bound_and_failures_decide():
    view = FakeView({0: [rec(0, 1), rec(0, 2, state="entered")], 1: [rec(1, 1)]})
    referee = Referee(2, bound=2, t0=0.0, trace=False)
    referee.finished(1, RankState.PASSED, 0.1)
    reason, _ = run_until_decided(referee, view, start=0.1)
    assert reason == Reason.TIMEOUT and view.reads == 0


# -- the verdict ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("states, reason, digests, clean", [
    ([RankState.PASSED, RankState.PASSED], Reason.COMPLETED, None, True),
    ([RankState.SKIPPED, RankState.SKIPPED], Reason.COMPLETED, None, True),
    ([RankState.PASSED, RankState.SKIPPED], Reason.COMPLETED, None, False),
    ([RankState.PASSED, RankState.PASSED], Reason.COMPLETED, {0: {"default": (1, 2)}, 1: {"default": (1, 3)}},
     False),
    ([RankState.PASSED, RankState.PASSED], Reason.DECIDED, None, False),
])
def test_is_clean(states, reason, digests, clean):
    views = [RankView(r, status=s) for r, s in enumerate(states)]
    assert is_clean(views, reason, digests) is clean


def test_verdict_always_has_a_diagnosis():
    views = [RankView(0, status=RankState.PASSED), RankView(1, status=RankState.SKIPPED)]
    diag = verdict(views, Reason.COMPLETED, 10)
    assert diag.headline and diag.exception_name


def test_states_print_as_their_values():
    assert f"{RankState.NOT_STARTED}" == "not-started" and str(Reason.TIMEOUT) == "timeout"
    assert RankState.ERROR.judged is RankState.FAILED  # a rank that could not run the call failed


def test_an_outcome_that_arrives_during_a_dump_request_reaches_the_referee():
    """The forked transport reads rank messages in several places (the main loop, the Flight Recorder
    poll, the stack request): an outcome read in any of them must reach the referee, or it waits for
    a rank that has long finished until the bound (seen: ZeRO-3 at world 4, 'every rank passed' after
    a 90 s timeout)."""
    from multiprocessing import Pipe
    from types import SimpleNamespace

    from pytest_nccl.core.messages import Call, CallDone, CallKind
    from pytest_nccl.core.reports import RankReport
    from pytest_nccl.forked.call import CallState
    from pytest_nccl.forked.group import RankGroup

    ours, theirs = Pipe()
    state = CallState(Call(7, CallKind.TEST), 2, 0.0, 0, Referee(2, bound=60, t0=0.0), conns={1: ours})
    theirs.send(CallDone(RankReport(1, RankState.PASSED, call_id=7)))
    RankGroup._receive(SimpleNamespace(conns={1: ours}), ours, state)   # as _request_dumps calls it
    assert state.referee.states == {1: RankState.PASSED} and 1 not in state.live


def test_ranks_that_finish_only_after_the_bound_are_a_timeout_not_a_disagreement():
    views = [RankView(r, status=RankState.PASSED) for r in range(2)]
    diag = verdict(views, Reason.TIMEOUT, 90)
    assert diag.exception_name == "CollectiveTimeout"
    assert diag.headline.startswith("the test took longer than its 90 s bound: every rank finished it")
