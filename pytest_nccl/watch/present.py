"""Controller side of ``pytest-nccl watch``: what is printed and written once the watch concludes.

The report is ``report.format_report``'s, the test modes' own, with the words of a job instead of a
test ("exited normally" for "left the test (passed)"; the bound is ``--timeout``, a stall) and the
collective numbers the ranks counted: the monitor keeps a window of each group and renumbers it from
``base``, so a headline's ``all_reduce #3`` becomes ``#2003`` again here.
"""

from __future__ import annotations

import json
import re
import time

from ..core.states import Reason
from ..views.report import format_report, trace_json, write_trace_dir
from .finding import Finding

# a process group label as the tracer writes it ("default", "pg3[0,2]"); point-to-point labels
# ("default:p2p") are never renumbered
_LABEL = r"(?:default|pg[^\s\[\]:;,()]*(?:\[[^\]]*\])?)(?!:p2p|[\w\[])"
_WORDS = (("left the test (passed)", "exited normally"),
          ("never started this test", "never created the default process group"),
          ("the test exceeded its", "the job exceeded its"))


def job_words(text: str, timeout: float) -> str:
    for test, job in _WORDS:
        text = text.replace(test, job)
    text = re.sub(r"(?m)^(  rank \d+: )passed( \[)", r"\1exited normally\2", text)  # where each rank is
    text = re.sub(r"(?m)^(  rank \d+: )failed: ", r"\1raised ", text)
    text = text.replace(f"for the whole {timeout:g} s bound", f"{timeout:g} s (--timeout) with no progress")
    return text.replace(f"the {timeout:g} s bound", f"{timeout:g} s (--timeout)")


def absolute(text: str, bases: dict, counts: dict | None = None) -> str:
    """Collective numbers in a headline or report, counted from the rank's first collective."""
    if not any(bases.values()):
        return text

    def add(m, fmt):
        return fmt.format(int(m[1]) + bases.get(m[2], 0), m[2])

    text = re.sub(rf"#(\d+) of group ({_LABEL})", lambda m: add(m, "#{} of group {}"), text)
    text = re.sub(rf"after (\d+) collectives? in group ({_LABEL})",
                  lambda m: add(m, "after {} collectives in group {}"), text)
    lines, group = [], None
    for line in text.split("\n"):
        head = re.match(r"group (\S+):$", line)
        if head:
            group = head[1]
        elif group is not None and bases.get(group):
            row = re.match(r"(>>|  )\s*#(\d+)( .*)$", line)
            folded = re.match(r"  \.\.\. (\d+)( (?:matching )?collectives? folded)$", line)
            if row:
                line = f"{row[1]}{('#' + str(int(row[2]) + bases[group])).rjust(5)}{row[3]}"
            elif folded:
                line = f"  ... {int(folded[1]) + bases[group]}{folded[2]}"
        total = re.match(r"  rank (\d+): (.*) \[\d+ collectives?\]$", line)
        if total and counts and int(total[1]) in counts:
            line = f"  rank {total[1]}: {total[2]} [{sum(counts[int(total[1])].values())} collectives]"
        lines.append(line)
    return "\n".join(lines)


def report_text(finding: Finding, timeout: float) -> str:
    text = format_report(finding.views, finding.diagnosis, finding.elapsed, timeout, finding.backend)
    text = text.replace(f"{finding.elapsed:.2f} s of a {timeout:g} s bound)",
                        f"{finding.elapsed:.1f} s after init_process_group, --timeout {timeout:g} s)")
    return absolute(job_words(text, timeout), finding.bases, finding.counts)


def headline(finding: Finding, timeout: float) -> str:
    return absolute(job_words(finding.verdict.headline, timeout), finding.bases)


def to_absolute(finding: Finding, timeout: float) -> None:
    """The records and the diagnosis with the ranks' own numbers (for the JSON); once the text is made."""
    diag = finding.diagnosis
    for view in finding.views:
        for rec in view.records:
            if not rec.pg.endswith(":p2p"):
                rec.seq += finding.bases.get(rec.pg, 0)
    if diag is not None:
        diag.headline = headline(finding, timeout)
        if diag.seq is not None and diag.pg is not None:
            diag.seq += finding.bases.get(diag.pg, 0)
    finding.bases = {}


def write_trace(directory: str, finding: Finding, timeout: float) -> list:
    name = "watch-" + time.strftime("%Y%m%d-%H%M%S")
    text = trace_json(name, finding.views, finding.diagnosis, finding.elapsed, timeout, finding.backend)
    return write_trace_dir(directory, name, text, finding.fr_pickles)


def summary(finding: Finding | None, *, exit_code: int, job_exit_code, command: list, timeout: float,
            ended_by_watch: bool, trace_files: list, restart: int = 0, earlier: tuple | list = (),
            peers_missing: str | None = None, watched: dict | None = None) -> str:
    """The ``--json`` document: the same whether or not there was a verdict. ``verdict``: the exit
    status is 3 (or 4) for it; ``post_mortem``: the job ended before the watch concluded (the
    launcher's own status is ``job_exit_code``); ``restart``: the launcher's attempt it belongs to;
    ``earlier_attempts``: the verdicts of the attempts the launcher restarted; ``watched``: the
    ranks of the last attempt and the collectives each entered (rank -> count)."""
    diag = finding.diagnosis if finding is not None else None
    return json.dumps({
        "verdict": diag is not None,
        "post_mortem": finding is not None and diag is not None and finding.reason == Reason.COMPLETED,
        "exit_code": exit_code, "job_exit_code": job_exit_code, "ended_by_watch": ended_by_watch,
        "command": command, "timeout_s": timeout,
        "reason": None if finding is None else str(finding.reason),
        "kind": diag.kind if diag else None, "headline": diag.headline if diag else None,
        "ranks": diag.ranks if diag else [], "group": diag.pg if diag else None,
        "seq": diag.seq if diag else None, "exception": diag.exception_name if diag else None,
        "world": None if finding is None else len(finding.views),
        "elapsed_s": None if finding is None else round(finding.elapsed, 3),
        "trace_files": trace_files, "restart": restart,
        "earlier_attempts": [{"restart": n, "kind": f.diagnosis.kind, "headline": f.diagnosis.headline,
                              "ranks": f.diagnosis.ranks} for n, f in earlier],
        "peers_missing": peers_missing, "watched": {str(r): n for r, n in sorted((watched or {}).items())},
    }, indent=1)
