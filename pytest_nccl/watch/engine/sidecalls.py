"""The notes of the members of groups outside c10d (vLLM's ``StatelessProcessGroup`` and PyNccl,
``rank/trace_vllm.py``) in one attempt's directory, read on every tick and judged by the one rule
(``core.sidecalls.judge``); a group that waits ``outcome.SIDE_GROUP_NOTICE`` seconds is said once
before its verdict (``core.sidecalls.notice``), as a c10d side group's creation is."""

from __future__ import annotations

import os
import socket
import time

from ...core.sidecalls import SideCall, SideVerdict, judge, notice
from .. import jobdir
from .outcome import notice_after

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


class SideCalls:
    """The side groups of one attempt's directory: their notes read once a tick (``verdict``), and
    the groups whose wait was said (``notice``)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.found: list = []
        self.alive: dict = {}
        self.said: set = set()

    def verdict(self, timeout: float) -> SideVerdict | None:
        """The notes read now; a verdict on them, or None (keep waiting)."""
        self.found, self.alive = notes(self.directory)
        return judge(self.found, time.time(), timeout, self.alive) if self.found else None

    def notice(self, timeout: float) -> str | None:
        """The line, once per group, for one that waited ``SIDE_GROUP_NOTICE`` seconds (none where
        --timeout comes as soon), from the last ``verdict``'s notes."""
        after = notice_after(timeout)
        if after is None or not self.found:
            return None
        return notice(self.found, time.time(), after, timeout, self.said, self.alive)


def side_callers(directory: str) -> int:
    """How many of this host's processes reported through a group outside c10d (a note each)."""
    return len(notes(directory)[1])
