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


class InterruptingTransport(FakeTransport):
    """Ctrl-C (or a front-end's ``Interrupted``) arrives while the driver waits for news, at ``at``."""

    def __init__(self, *args, at: float, interrupt: KeyboardInterrupt, **kwargs):
        super().__init__(*args, **kwargs)
        self.at, self.interrupt = at, interrupt

    def receive(self, until):
        if until >= self.at:
            self.clock.now = self.at
            raise self.interrupt
        super().receive(until)


def test_an_interrupt_while_watching_concludes_at_once_with_where_each_rank_is():
    """Rank 0 waits in #4, rank 1 sleeps after 3: a SIGTERM at 8.2 s of a 300 s bound ends the watch;
    the live ranks' stacks are taken (no settle), and the headline says where each was, not a bound."""
    from pytest_nccl.core.call import Interrupted

    journals = {0: [record(0, s) for s in (1, 2, 3)] + [record(0, 4, state="entered", site="t.py:10")],
                1: [record(1, s) for s in (1, 2, 3)]}
    clock = Clock()
    referee = Referee(2, 300.0, 0.0)
    stacks = {1: 'Thread MainThread:\n  File "/w/t.py", line 9, in test_x\n    time.sleep(600)\n'}
    transport = InterruptingTransport(clock, referee, journals, stacks=stacks, at=8.2,
                                      interrupt=Interrupted("SIGTERM"))
    outcome = CallDriver(referee, transport, clock).run(backend="gloo")
    assert outcome.reason == Reason.INTERRUPTED and outcome.interrupted == "SIGTERM"
    assert transport.log[0] == ("dumps", [0, 1]) and clock.now == 8.2  # no settle: it is ended now
    assert outcome.diagnosis.headline == (
        "interrupted after 8.2 s (SIGTERM): rank 1 is busy outside any collective at /w/t.py:9 (in test_x): "
        "time.sleep(600), after 3 collectives in group default; rank 0 waits in all_reduce #4 of group "
        "default from t.py:10")


def test_an_interrupt_after_every_rank_finished_is_a_clean_completion():
    """The signal came as the last rank finished: nothing was cut short, nothing is reported."""
    journals = {0: [record(0, 1)], 1: [record(1, 1)]}
    clock = Clock()
    referee = Referee(2, 60.0, 0.0)
    transport = FakeTransport(clock, referee, journals)
    for rank in (0, 1):
        referee.finished(rank, RankState.PASSED, 0.1)
        transport.finished[rank] = RankReport(rank, RankState.PASSED)
    outcome = CallDriver(referee, transport, clock).conclude(Reason.INTERRUPTED, interrupted="SIGINT")
    assert outcome.reason == Reason.COMPLETED and outcome.clean and outcome.interrupted == ""


class SlowlyReleasing(InterruptingTransport):
    """A live rank cannot be released at once (SPMD: a rank waiting in C++ takes the whole release wait)."""

    def release(self, live):
        super().release(live)
        self.clock.now += 5.0


def test_an_interrupted_call_is_timed_when_it_was_ended_not_once_its_ranks_were_released():
    from pytest_nccl.core.call import Interrupted

    journals = {0: [record(0, 1, state="entered", site="t.py:10")], 1: []}
    clock = Clock()
    referee = Referee(2, 300.0, 0.0)
    transport = SlowlyReleasing(clock, referee, journals, at=8.2, interrupt=Interrupted("SIGTERM"))
    outcome = CallDriver(referee, transport, clock).run(backend="gloo")
    assert clock.now == 13.2 and outcome.elapsed == 8.2
    assert outcome.diagnosis.headline.startswith("interrupted after 8.2 s (SIGTERM): "), outcome.diagnosis.headline


class Watched(FakeTransport):
    """Notes whether the driver still watched at each receive and at the dumps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.driver, self.seen = None, []

    def receive(self, until):
        self.seen.append(("receive", self.driver.watching))
        super().receive(until)

    def dumps(self, reason, live):
        self.seen.append(("dumps", self.driver.watching))
        return super().dumps(reason, live)


def test_the_driver_says_it_watches_only_while_the_referees_loop_runs():
    """SPMD's decider raises an interrupt from ``receive`` only while the driver watches: once a call is
    decided (its settle also receives), the conclusion is not cut short."""
    journals = {0: [record(0, 1), record(0, 2, state="entered")], 1: [record(1, 1)]}
    clock = Clock()
    referee = Referee(2, 60.0, 0.0)
    transport = Watched(clock, referee, journals, [(0.1, 1, RankState.PASSED)])
    driver = transport.driver = CallDriver(referee, transport, clock)
    driver.run()
    assert ("receive", True) in transport.seen and transport.seen[-1] == ("dumps", False)
    assert not driver.watching
