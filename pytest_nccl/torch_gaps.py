"""Controller side: what the installed torch lacks that a feature needs, said once in the session
header rather than as a traceback or a report that is silently short (README "Support range")."""

from __future__ import annotations


def gap_line(backend: object) -> str:
    """A second header line saying what this torch lacks on ``backend`` (torch 2.6's Flight Recorder
    does not record gloo: collectives issued from C++ go unseen), or ''."""
    try:
        from .rank import flight_api
    except ImportError:  # no torch: the session says so where it needs it
        return ""
    gap = flight_api.gap(str(backend))
    return f"\nnccl: {gap}" if gap else ""
