"""Rank side: torch's Flight Recorder through the entry points this torch has, and what it records.

The Flight Recorder is what sees collectives issued from C++ (DDP's reducer): the Python tracer
cannot. Its generic dumps (``_dump_fr_trace_json``, ``_dump_fr_trace``) came with its recording of
gloo; before them (torch 2.6) only NCCL's dumps exist (``_dump_nccl_trace_json``,
``_dump_nccl_trace``: same arguments, same format) and gloo's collectives are recorded nowhere. A
CPU-only build of such a torch has neither. Where a backend is not recorded, ``gap`` says so in one
line (the session header), since a rank inside such a collective looks busy outside any collective.
"""

from __future__ import annotations

import torch

_C = getattr(torch._C, "_distributed_c10d", None)
_GENERIC = getattr(_C, "_dump_fr_trace_json", None) is not None


def _entry(generic: str, nccl: str):
    found = getattr(_C, generic, None)
    return found if found is not None else getattr(_C, nccl, None)


DUMP_JSON = _entry("_dump_fr_trace_json", "_dump_nccl_trace_json")  # (includeCollectives, onlyActive)
DUMP_PICKLE = _entry("_dump_fr_trace", "_dump_nccl_trace")  # (includeCollectives, includeStackTraces, onlyActive)


def recorded_backends() -> frozenset[str]:
    """The backends whose collectives this torch's Flight Recorder records."""
    if _GENERIC:
        return frozenset({"gloo", "nccl"})
    return frozenset({"nccl"}) if DUMP_JSON is not None else frozenset()


def gap(backend: str) -> str:
    """One line saying what this torch's Flight Recorder does not record on ``backend``, or ''."""
    if backend in recorded_backends():
        return ""
    why = "its Flight Recorder records NCCL only" if DUMP_JSON is not None else "this build has no Flight Recorder"
    return f"torch {torch.__version__}: collectives issued from C++ (DDP's reducer) are not traced on {backend}: {why}"


def dump_json(*args) -> bytes:
    """The Flight Recorder's JSON dump; raises where this torch has none."""
    if DUMP_JSON is None:
        raise RuntimeError(f"torch {torch.__version__} has no Flight Recorder dump")
    return DUMP_JSON(*args)


def dump_pickle(*args) -> bytes:
    """The Flight Recorder's pickled dump (with stack traces and pg config); raises where none."""
    if DUMP_PICKLE is None:
        raise RuntimeError(f"torch {torch.__version__} has no Flight Recorder dump")
    return DUMP_PICKLE(*args)
