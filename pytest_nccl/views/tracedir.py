"""The one writer of a trace directory (``--nccl-trace-dir`` for a failed test, ``pytest-nccl watch
--trace-dir`` for a job's verdict): from one ``CallOutcome``,

- ``<name>.json``: the trace (``report.trace_json``), and ``<name>.fr/rank_N``: the ranks' Flight
  Recorder dumps where they produced them (the layout torch's ``fr_trace`` reads);
- ``<name>.trace.json``: Chrome trace events, for Perfetto (``timeline``);
- ``<name>.html``: the swimlane page (``swimlane``).

The JSON is the record: failing to write it raises ``OSError``. The two views are a convenience: a
failure there goes to ``on_view_error`` and never hides the verdict they show.
"""

from __future__ import annotations

import os
from typing import Callable

from ..core.reports import CallOutcome
from .report import safe_filename, trace_json, write_trace_dir
from .swimlane import swimlane_html
from .timeline import timeline_json


def write_trace(directory: str, name: str, outcome: CallOutcome,
                on_view_error: Callable[[str], None]) -> list[str]:
    """Every file of ``outcome``'s trace under ``directory``; the files written, the JSON first and
    the swimlane page last (absent when the views could not be written)."""
    views, diag = outcome.views, outcome.diagnosis
    args = (name, views, diag, outcome.elapsed, outcome.bound, outcome.backend)
    written = write_trace_dir(directory, name, trace_json(*args, reason=outcome.reason), outcome.fr_pickle)
    base = os.path.join(directory, safe_filename(name))
    try:
        with open(base + ".trace.json", "w", encoding="utf-8") as f:
            f.write(timeline_json(*args))
        written.append(base + ".trace.json")
        with open(base + ".html", "w", encoding="utf-8") as f:
            f.write(swimlane_html(*args))
        written.append(base + ".html")
    except Exception as exc:  # a view is a convenience: whatever it raises, the verdict it shows stands
        on_view_error(f"cannot write the trace views of {name}: {type(exc).__name__}: {exc}")
    return written
