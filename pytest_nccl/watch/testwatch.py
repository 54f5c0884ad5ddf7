"""One test's ranks, followed in the helper (``intest.py``) as ``pytest-nccl watch`` follows a
command's: the same ``cli.Watch`` (monitor, referee, judge, the launcher's attempts, peers that never
appear), with the test as the job and its call as the launcher; its verdict goes to pytest as a
``LaunchedVerdict`` with the report text, not to a terminal. Imported by the helper once a test's
processes import torch."""

from __future__ import annotations

import argparse
import time

from ..core.judge import launcher_restarts
from ..core.messages import LaunchedVerdict, TestCall
from ..core.reports import CallOutcome
from ..errors import CollectiveTimeout
from . import present
from .cli import Watch
from .monitor import Monitor
from .testprocs import TestProcesses

LAUNCHER_GRACE = 10.0   # seconds a launcher has to end its job itself after a rank raised or died


def test_words(text: str) -> str:
    """The watch's report names its option; in a test the bound is the plugin's."""
    return text.replace("--timeout", "--nccl-timeout")


class TestWatch(Watch):
    """One test's ranks, followed as the watch follows a command's: the test's call is the launcher,
    ending the job ends every process the test started."""

    __test__ = False

    def __init__(self, call: TestCall, processes: TestProcesses):
        args = argparse.Namespace(timeout=call.bound, quiet=True, keep_running=False, trace_dir=None, json=None)
        super().__init__(args, [], call.directory)
        self.processes = processes
        self.monitor = Monitor(call.directory, call.bound)
        self.verdict: LaunchedVerdict | None = None   # decided while the test ran

    def tick(self, now: float) -> None:
        if self.verdict is not None:
            return
        self._next_attempt(now)
        if self._step(None, now):
            assert self.finding is not None  # _step reported it
            self.verdict = self._verdict(self.finding, live=True)
        elif self.peers_missing:
            self.verdict = LaunchedVerdict(test_words(self.peers_missing.replace("; ending the job", "")),
                                           CollectiveTimeout.__name__, "", live=True, launcher_sees=False)

    def wake_at(self, now: float) -> float:
        return now + 0.2 if self.verdict is not None else super().wake_at(now)

    def conclude(self, failed: bool) -> LaunchedVerdict | None:
        """The test's call returned (``failed``: it raised): the verdict of the run, if any."""
        if self.verdict is not None:
            return self.verdict
        finding = None
        if self.attempt_done:
            if self.earlier and self.earlier[-1][0].restart == self.attempt:  # the launcher gave up
                finding = self.earlier[-1][1]
        else:
            finding = self.monitor.after_exit(time.monotonic(), launcher_ok=not failed)
        if finding is None and (other := self.worlds.after_exit(time.monotonic(), launcher_ok=not failed)):
            finding = other[1]  # another default world the test's processes created
        return self._verdict(finding, live=False) if finding is not None else None

    def _verdict(self, finding: CallOutcome, live: bool) -> LaunchedVerdict:
        timeout = self.args.timeout
        diag = finding.verdict
        report = test_words(present.report_text(finding, timeout))
        headline = test_words(present.headline(finding, timeout))
        present.to_absolute(finding, timeout)  # the trace with the ranks' own numbers
        diag.headline = headline
        return LaunchedVerdict(headline, diag.exception_name, report, live, launcher_restarts(diag), finding,
                               finding.backend)

    def _end_job(self, launcher, finding: CallOutcome | None = None) -> None:
        if finding is not None and finding.diagnosis is not None and launcher_restarts(finding.diagnosis):
            # a rank raised or died: the test's launcher (mp.spawn's join, torchrun) ends the others and
            # tells the test in its own words (a test may expect them); ours only if it does not
            self.processes.wait_gone(LAUNCHER_GRACE)
        self.processes.end()

    def _report(self, finding, title=None, where="") -> None:
        pass  # the verdict goes to pytest (``_verdict``), not to a terminal
