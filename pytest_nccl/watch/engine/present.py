"""Controller side of ``pytest-nccl watch``: what is printed and written once the watch concludes.

The report is the test modes' own (``views.report.report_text``) in a job's words (``wording.JOB``:
"exited normally" for "left the test (passed)"; the bound is ``--timeout``, a stall); the numbers are
the ranks' own (each record of a long job's window keeps the collectives ``before`` it). The trace
directory is a failing test's (``views.tracedir``).
"""

from __future__ import annotations

import json
import time
from typing import Callable

from ...core.diagnosis.wording import JOB
from ...core.reports import CallOutcome
from ...core.states import Kind, Reason
from ...views import tracedir
from ...views.report import report_text as views_report_text

PROG = "pytest-nccl watch"   # how every line the watch prints starts


def report_text(finding: CallOutcome, timeout: float | None = None) -> str:
    """The report, in a job's words (the judge worded the headline so, ``wording.JOB``); ``timeout``
    is the outcome's own bound."""
    return views_report_text(finding, JOB)


def headline(finding: CallOutcome, timeout: float | None = None) -> str:
    return finding.verdict.headline


def banner(prog: str, title: str) -> str:
    """The line that opens every verdict's report: 'diagnosed (rank-left)', 'diagnosed (rendezvous,
    side group)'."""
    return f"\n{'=' * 20} {prog}: {title} {'=' * 20}"


def recap(prog: str, headline: str, code: int, interrupted: bool = False) -> str:
    """The verdict again, the watch's last line: what the launcher wrote while it was being ended
    (torchrun's warnings, its workers' SIGTERM messages) comes before it. ``interrupted``: where the
    ranks were when a signal ended the watch, not a verdict of its own."""
    return f"{prog}: {'interrupted' if interrupted else 'verdict'} (exit {code}): {headline}"


def to_absolute(finding: CallOutcome, timeout: float | None = None) -> None:
    """The records and the diagnosis numbered as the ranks counted (for the JSON and the trace
    views); once the text is made."""
    diag = finding.diagnosis
    for view in finding.views:
        for rec in view.records:
            rec.seq, rec.before = rec.number, 0
    if diag is not None and diag.seq is not None and diag.pg is not None:
        diag.seq += finding.bases.get(diag.pg, 0)
    finding.bases = {}


def write_trace(directory: str, finding: CallOutcome, on_view_error: Callable[[str], None]) -> list:
    """The verdict's trace directory, as a failing test writes it (``views.tracedir``): the JSON, the
    Flight Recorder dumps, the Perfetto trace and the swimlane page."""
    return tracedir.write_trace(directory, "watch-" + time.strftime("%Y%m%d-%H%M%S"), finding, on_view_error)


def summary(finding: CallOutcome | None, *, exit_code: int, job_exit_code, command: list, timeout: float,
            ended_by_watch: bool, trace_files: list, restart: int = 0, earlier: tuple | list = (),
            peers_missing: str | None = None, watched: dict | None = None, side_group_missing: bool = False) -> str:
    """The ``--json`` document: the same whether or not there was a verdict. ``verdict``: the exit
    status is 3 (or 4) for it; ``post_mortem``: the job ended before the watch concluded (the
    launcher's own status is ``job_exit_code``); ``restart``: the launcher's attempt it belongs to;
    ``earlier_attempts``: the verdicts of the attempts the launcher restarted; ``watched``: the
    ranks of the last attempt and the collectives each entered (rank -> count). Members of a side
    group that never connected (``side_group_missing``) are a verdict too: ``peers_missing`` is its
    headline. ``interrupted``: the signal that ended the watch (SIGINT...), the headline then where
    each rank was, no verdict of the watch's own."""
    diag = finding.diagnosis if finding is not None else None
    side = side_group_missing and diag is None
    interrupted = finding is not None and finding.reason == Reason.INTERRUPTED
    return json.dumps({
        "verdict": (diag is not None and not interrupted) or side,
        "interrupted": finding.interrupted if finding is not None and interrupted else None,
        "post_mortem": finding is not None and diag is not None and finding.reason == Reason.COMPLETED,
        "exit_code": exit_code, "job_exit_code": job_exit_code, "ended_by_watch": ended_by_watch,
        "command": command, "timeout_s": timeout,
        "reason": None if finding is None else str(finding.reason),
        "kind": diag.kind if diag else (Kind.RENDEZVOUS if side else None),
        "headline": diag.headline if diag else (peers_missing if side else None),
        "ranks": diag.ranks if diag else [], "group": diag.pg if diag else None,
        "seq": diag.seq if diag else None, "exception": diag.exception_name if diag else None,
        "world": None if finding is None else len(finding.views),
        "elapsed_s": None if finding is None else round(finding.elapsed, 3),
        "trace_files": trace_files, "restart": restart,
        "earlier_attempts": [{"restart": n, "kind": f.diagnosis.kind, "headline": f.diagnosis.headline,
                              "ranks": f.diagnosis.ranks} for n, f in earlier],
        "peers_missing": peers_missing, "watched": {str(r): n for r, n in sorted((watched or {}).items())},
    }, indent=1)
