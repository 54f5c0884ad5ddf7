"""What the watch knows of one rank, as the judge's ``RankReport``: its exit record (its own, or the
one its node's watch published), or what the watch saw from outside (a process that died, a fatal
signal that faulthandler recorded, a rank on a node this watch cannot see)."""

from __future__ import annotations

import linecache
import re

from ...core.exits import decode_wait_status
from ...core.reports import RankReport
from ...core.states import RankState
from .follow import Followed, LocalRank

#: faulthandler's words for a fatal signal -> the signal's name
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


ON_ANOTHER_NODE = "runs on another node, which this watch cannot see"
OUTSIDE = ("runs outside this watch (another node, or a process not started under it): its peers completed "
           "collectives with it")


# a frame as faulthandler writes it: '  File "x.py", line 13 in <module>' (no source line follows)
_FAULTHANDLER_FRAME = re.compile(r'^\s*File "(.+)", line (\d+) in ')


def with_sources(stack: str) -> str:
    """faulthandler's stacks with each frame's source line under it, as a traceback shows it, so that
    a headline says what the rank was doing there ('time.sleep(600)'); read on this host, where the
    rank ran."""
    out = []
    for line in stack.splitlines():
        out.append(line)
        frame = _FAULTHANDLER_FRAME.match(line)
        source = linecache.getline(frame[1], int(frame[2])).strip() if frame else ""
        if source:
            out.append(f"    {source}")
    return "\n".join(out)


def report_of(r: int, f: Followed | None, answer: dict | None, t0: float, outside: str | None) -> RankReport:
    """Rank ``r``'s report; ``f``: how the watch follows it (None: never seen); ``answer``: its
    agent's answer to "dump" (its stacks); ``t0``: the call's start on the watch's clock;
    ``outside``: where a rank never seen runs, when the watch knows it runs somewhere
    (``ON_ANOTHER_NODE``, ``OUTSIDE``), else None."""
    if f is None and outside:
        return RankReport(r, RankState.UNSEEN, message=outside)
    if f is None:
        return RankReport(r, RankState.NOT_STARTED, message="never created the default process group")
    if f.unseen and f.state is None:
        return RankReport(r, RankState.UNSEEN, message="runs on another node; this watch lost sight of it "
                          "(that node's watch no longer answers)")
    report = RankReport(r, f.state or RankState.RUNNING)
    if f.exit is not None:
        report.exc_type, report.exc_text, report.message = f.exit.exc_type, f.exit.exc_text, f.exit.message
        if not f.local:  # its node's watch saw how it ended
            report.stack, report.exit_code, report.signal_name = f.exit.stack, f.exit.exit_code, f.exit.signal_name
            report.oom = f.exit.oom
    if f.finished_at is not None:
        report.finished_at = f.finished_at - t0
    if answer:
        report.stack = answer.get("stack") or ""
    if report.state == RankState.DEAD and f.local:
        fatal = f.source.fatal()
        ended = f.source.ended_by()
        if fatal:
            report.stack = with_sources(fatal[-6000:])
            report.signal_name = next((sig for text, sig in FATAL_SIGNALS.items()
                                       if f"Fatal Python error: {text}" in fatal), None)
        elif ended is not None:  # its launcher (or a scheduler) ended it: where it was then
            report.signal_name, report.stack = ended[0], with_sources(ended[1][-6000:])
        if f.source.exit_code is not None and report.signal_name is None:
            report.exit_code, report.signal_name = decode_wait_status(f.source.exit_code)
        if isinstance(f.source, LocalRank):  # SIGKILL, or nothing says how: the OOM killer's, if counted
            report.oom = f.source.memory.killed(report.signal_name, report.exit_code)
        if report.oom is not None:
            report.signal_name = report.oom.SIGNAL
    return report
