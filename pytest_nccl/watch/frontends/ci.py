"""The watch's verdict for GitHub Actions (``--github``): one error annotation at the diverging
collective's call site in the checkout, and the verdict appended to the job summary. The words and
the escaping are ``views/github.py``'s."""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence, TextIO

from ...core.reports import CallOutcome
from ...views import gate
from ...views import github as words


def verdict(finding: CallOutcome | None, exit_code: int, trace_files: Sequence[str], mode: str,
            environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> None:
    """What the watch ended with, for GitHub: nothing unless ``mode`` and the environment want it.
    Without a verdict, no annotation, and one line in the summary."""
    environ = os.environ if environ is None else environ
    annotate, summary_path = words.wanted(mode, environ)
    title = finding.verdict.exception_name if finding is not None else ""
    headline = finding.verdict.headline if finding is not None else ""
    if annotate and finding is not None:
        note = words.annotation(title, headline, finding, words.checkout_root(environ, os.getcwd()))
        out = out or sys.stdout
        out.flush()
        out.write("\n" + note.command() + "\n")  # a workflow command counts only at a line's start
        out.flush()
    if summary_path:
        shown = [os.path.relpath(f) if not os.path.relpath(f).startswith(os.pardir) else f for f in trace_files]
        try:
            gate.append_step_summary(words.watch_summary(title, headline, exit_code, shown),
                                     {"GITHUB_STEP_SUMMARY": summary_path})
        except OSError as exc:
            sys.stderr.write(f"pytest-nccl watch: cannot append to GITHUB_STEP_SUMMARY {summary_path}: {exc}\n")
