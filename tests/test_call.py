"""The call driver (core/call.py), on a fake transport and a fake clock: no torch, no processes."""

from collective_records import record

from pytest_nccl.core.call import CallDriver, Dumps
from pytest_nccl.core.referee import TIMING, Referee
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import RankState, Reason


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeTransport:
    """Journals and outcomes scripted by time: ``events`` is [(at, rank, state)]; what happened is
    logged in ``log``."""

    def __init__(self, clock, referee, journals, events=(), stacks=None):
        self.clock, self.referee, self.journals_now = clock, referee, journals
        self.events = sorted(events)
        self.stacks = stacks or {}
        self.finished: dict = {}
        self.log: list = []

    def journals(self):
        return self.journals_now

    def journal_sizes(self):
        return [len(j) for _, j in sorted(self.journals_now.items())]

    def flight_recorder_journals(self):
        return None

    def receive(self, until):
        while self.events and self.events[0][0] <= until:
            at, rank, state = self.events.pop(0)
            self.clock.now = max(self.clock.now, at)
            self.finished[rank] = RankReport(rank, state)
            self.referee.finished(rank, state, at)
            return  # news: back to the driver
        self.clock.now = max(self.clock.now, until)

    def dumps(self, reason, live):
        self.log.append(("dumps", list(live)))
        return Dumps(stacks={r: self.stacks.get(r, "") for r in live})

    def release(self, live):
        self.log.append(("release", list(live)))

    def reports(self, reason, running):
        self.log.append(("reports", sorted(running)))
        return {**self.finished, **running}

    def final_journals(self, reports, dumps):
        return self.journals_now


def drive(journals, events, bound=60.0, stacks=None):
    clock = Clock()
    referee = Referee(len(journals), bound, 0.0)
    transport = FakeTransport(clock, referee, journals, events, stacks)
    outcome = CallDriver(referee, transport, clock).run(backend="gloo")
    return outcome, transport, clock


def test_every_rank_passing_is_clean_and_asks_no_dumps():
    journals = {0: [record(0, 1)], 1: [record(1, 1)]}
    outcome, transport, clock = drive(journals, [(0.2, 0, RankState.PASSED), (0.3, 1, RankState.PASSED)])
    assert outcome.reason == Reason.COMPLETED and outcome.clean and outcome.backend == "gloo"
    assert ("dumps", []) not in transport.log and transport.log == [("reports", [])]
    assert outcome.elapsed == clock.now == 0.3


def test_a_wait_a_finished_rank_never_matches_settles_then_dumps_the_live_ranks():
    """Rank 1 passed after one collective; rank 0 waits in #2 and rank 2, outside any collective,
    finishes within the settle period: its outcome is taken, only rank 0 is dumped."""
    journals = {0: [record(0, 1), record(0, 2, state="entered")], 1: [record(1, 1)], 2: [record(2, 1)]}
    events = [(0.1, 1, RankState.PASSED), (0.1 + TIMING.poll + TIMING.settle / 2, 2, RankState.PASSED)]
    outcome, transport, clock = drive(journals, events, stacks={0: "stuck in all_reduce"})
    assert outcome.reason == Reason.DECIDED
    assert transport.log == [("dumps", [0]), ("release", [0]), ("reports", [0])]
    assert outcome.views[2].status == RankState.PASSED and outcome.views[0].status == RankState.RUNNING
    assert outcome.reports[0].stack == "stuck in all_reduce"
    assert outcome.diagnosis is not None and outcome.verdict.ranks


def test_settling_ends_at_once_when_every_live_rank_waits_in_a_collective():
    journals = {0: [record(0, 1), record(0, 2, state="entered")], 1: [record(1, 1)]}
    outcome, _, clock = drive(journals, [(0.1, 1, RankState.PASSED)])
    assert outcome.reason == Reason.DECIDED
    assert clock.now <= 0.1 + TIMING.poll + 1e-9  # decided at the next poll, no settle wait


def test_the_bound_ends_a_call_whose_ranks_never_finish():
    journals = {0: [record(0, 1, state="entered")], 1: [record(1, 1, state="entered")]}
    outcome, transport, clock = drive(journals, [], bound=5.0)
    assert outcome.reason == Reason.TIMEOUT and clock.now == 5.0
    assert transport.log[0] == ("dumps", [0, 1])


def test_the_watch_gives_a_rank_a_moment_behind_the_others_time_to_reach_the_collective():
    """Under the watch (JOB_RULES) a rank that finishes 1.5 s after the decision is taken as what it
    became; with the test modes' settle it is reported as still running."""
    from pytest_nccl.watch.engine.monitor import JOB_RULES

    journals = {0: [record(0, 1), record(0, 2, state="entered")], 1: [record(1, 1)], 2: [record(2, 1)]}
    events = [(0.1, 1, RankState.PASSED), (1.6, 2, RankState.PASSED)]
    statuses = {}
    for name, timing in (("tests", TIMING), ("job", JOB_RULES)):
        clock = Clock()
        referee = Referee(3, 60.0, 0.0, timing=timing)
        outcome = CallDriver(referee, FakeTransport(clock, referee, journals, list(events)), clock).run()
        statuses[name] = outcome.views[2].status
    assert statuses == {"tests": RankState.RUNNING, "job": RankState.PASSED}
