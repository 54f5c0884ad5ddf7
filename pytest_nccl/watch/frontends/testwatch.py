"""One test's ranks, followed in the helper (``intest.py``) as ``pytest-nccl watch`` follows a
command's: the same ``engine.Engine`` (monitor, referee, judge, the launcher's attempts, peers that
never appear), with the test as the job and its call as the launcher; ``TestWatch`` is the engine's
front-end: its verdict goes to pytest as a ``LaunchedVerdict`` with the report text, not to a
terminal. Imported by the helper once a test's processes import torch."""

from __future__ import annotations

import sys

from ...core.judge import launcher_restarts
from ...core.messages import LaunchedVerdict, TestCall
from ...core.reports import CallOutcome
from ...errors import CollectiveTimeout
from ..engine import present
from ..engine.job import Engine
from .testprocs import TestProcesses

LAUNCHER_GRACE = 10.0   # seconds a launcher has to end its job itself after a rank raised or died


def test_words(text: str) -> str:
    """The watch's report names its option; in a test the bound is the plugin's."""
    return text.replace("--timeout", "--nccl-timeout")


class TestWatch:
    """One test's ranks, followed by an ``Engine`` as the watch follows a command's: the test's call
    is the launcher, ending the job ends every process the test started."""

    __test__ = False

    def __init__(self, call: TestCall, processes: TestProcesses):
        self.timeout = call.bound
        self.processes = processes
        self.verdict: LaunchedVerdict | None = None   # decided while the test ran
        self.engine = Engine(call.directory, self, timeout=call.bound, quiet=True)

    def tick(self, now: float) -> None:
        if self.verdict is not None:
            return
        engine = self.engine
        if engine.tick(now):
            assert engine.finding is not None  # the engine ended the job on it
            self.verdict = self._verdict(engine.finding, live=True)
        elif engine.peers_missing:
            self.verdict = LaunchedVerdict(test_words(engine.peers_missing),
                                           CollectiveTimeout.__name__, "", live=True, launcher_sees=False)

    def wake_at(self, now: float) -> float:
        return now + 0.2 if self.verdict is not None else self.engine.wake_at(now)

    def conclude(self, failed: bool, interrupted: str = "") -> LaunchedVerdict | None:
        """The test's call returned (``failed``: it raised, the launcher's status 1): the verdict of
        the run, if any. ``interrupted``: a signal ended pytest's wait (Ctrl-C): where the ranks are
        now, asked of them before they are ended."""
        if self.verdict is not None:
            return self.verdict
        if interrupted and (finding := self.engine.interrupt(interrupted)) is not None:
            return self._verdict(finding, live=True)
        # a test's ranks run on this host: what the journals show is this follower's own
        finding = self.engine.conclude(1 if failed else 0, agree=False).finding
        return self._verdict(finding, live=False) if finding is not None else None

    def close(self) -> None:
        self.engine.close()

    def _verdict(self, finding: CallOutcome, live: bool) -> LaunchedVerdict:
        timeout = self.timeout
        diag = finding.verdict
        report = test_words(present.report_text(finding, timeout))
        headline = test_words(present.headline(finding, timeout))
        present.to_absolute(finding, timeout)  # the trace with the ranks' own numbers
        diag.headline = headline
        return LaunchedVerdict(headline, diag.exception_name, report, live, launcher_restarts(diag), finding,
                               finding.backend)

    # -- the engine's front-end (``engine.FrontEnd``) ----------------------------------------------------
    def say(self, text: str) -> None:
        # the helper's stderr: pytest's with PYTEST_NCCL_WATCH_DEBUG set, else nowhere
        sys.stderr.write(text.rstrip("\n") + "\n")
        sys.stderr.flush()

    def report(self, finding: CallOutcome, title: str | None = None, where: str = "") -> None:
        pass  # the verdict goes to pytest (``_verdict``), not to a terminal

    def end_job(self, finding: CallOutcome | None) -> None:
        if finding is not None and finding.diagnosis is not None and launcher_restarts(finding.diagnosis):
            # a rank raised or died: the test's launcher (mp.spawn's join, torchrun) ends the others and
            # tells the test in its own words (a test may expect them); ours only if it does not
            self.processes.wait_gone(LAUNCHER_GRACE)
        self.processes.end()
