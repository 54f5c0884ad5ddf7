"""The processes of one attempt that wait to join a group, as their ``joining-PID.json`` notes say
(``jobdir.JoiningNote``): each one's ``outcome.Joining``, with the time the watch first saw it
waiting, kept while its note (the same wait) is there and its process is the one that wrote it."""

from __future__ import annotations

import os
import socket
from dataclasses import replace

from ...core import jobdir
from ...core.sites import headline_site
from .outcome import Joining, Waits, side_group_notice


class JoiningProcesses:
    """The waiting processes of one attempt's directory, read again on every ``read``."""

    def __init__(self, directory: str):
        self.directory = directory
        self.present: dict[int, Joining] = {}   # pid -> Joining, since first seen
        self.noticed: set[str] = set()          # side groups whose missing members were said

    def read(self, now: float) -> list[Joining]:
        """The processes of this host waiting now; a note whose process is gone (or another one with
        its pid) is not one."""
        present = {}
        for name in jobdir.listdir(self.directory):
            if not (name.startswith("joining-") and name.endswith(".json")):
                continue
            note = jobdir.read_joining(os.path.join(self.directory, name))
            if note is None or note.host != socket.gethostname():
                continue
            pid = note.pid or 0
            if jobdir.process_start(pid) != note.start:
                continue  # gone
            joining = Joining(pid, now, note.rank, note.world, headline_site(note.site), Waits.of(note.what),
                              note.group, note.store)
            seen = self.present.get(pid)
            # the same wait as last read keeps its start; a new one (the process joined its default
            # group and now waits in a side group's, between two reads) starts now
            present[pid] = seen if seen is not None and replace(seen, since=now) == joining else joining
        self.present = present
        return list(present.values())

    def notice(self, now: float, timeout: float) -> str | None:
        """The line, once, for a side group whose members wait for one that has not connected
        (``outcome.side_group_notice``), from the last ``read``."""
        return side_group_notice(list(self.present.values()), now, timeout, self.noticed)


def join_failures(directory: str) -> list:
    """The notes (``jobdir.JoiningNote``, ``error`` set) of this attempt's processes whose
    ``init_process_group`` raised, by rank."""
    notes = [jobdir.JoiningNote.decode(jobdir.read_json(os.path.join(directory, name)))
             for name in jobdir.listdir(directory) if name.startswith("joinfailed-") and name.endswith(".json")]
    return sorted((n for n in notes if n is not None and n.error), key=lambda n: (n.rank is None, n.rank or 0))
