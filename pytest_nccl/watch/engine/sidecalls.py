"""The notes of the members of groups outside c10d (vLLM's ``StatelessProcessGroup`` and PyNccl,
``rank/trace_vllm.py``) in one attempt's directory, read on every tick and judged by the one rule
(``core.sidecalls.judge``)."""

from __future__ import annotations

import os
import socket
import time

from ...core.sidecalls import SideCall, SideVerdict, judge
from .. import jobdir

PREFIX = "sidecall-"


def notes(directory: str) -> tuple[list, dict]:
    """The notes of this host's members, and which of their processes still run (pid -> bool)."""
    found, alive = [], {}
    host = socket.gethostname()
    for name in jobdir.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(".json"):
            note = SideCall.decode(jobdir.read_json(os.path.join(directory, name)))
            if note is not None and note.host == host:
                found.append(note)
                alive[note.pid] = jobdir.process_start(note.pid) == note.start
    return found, alive


def side_call_verdict(directory: str, timeout: float) -> SideVerdict | None:
    """A verdict on the side groups followed in ``directory``, or None (keep waiting)."""
    found, alive = notes(directory)
    return judge(found, time.time(), timeout, alive) if found else None


def side_callers(directory: str) -> int:
    """How many of this host's processes reported through a group outside c10d (a note each)."""
    return len(notes(directory)[1])
