"""Which rank processes have ended: rank 0's decider learns of a rank that died inside a test (an
``os._exit``, a signal, gloo's abort) without waiting for the launcher, where it can see that process
(on its own host). Each rank publishes its ``RankProcess`` when a marked test starts."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot; tells a reused pid apart), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # after the command, which may hold spaces
    if fields[0] == b"Z":  # a zombie: ended, not yet reaped by its launcher
        return None
    return int(fields[19])


@dataclass(frozen=True)
class RankProcess:
    """One rank's process, as published in the launcher's store (key ``TestKeys.process``)."""
    host: str
    pid: int
    started: int

    @classmethod
    def mine(cls) -> "RankProcess":
        return cls(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()) or 0)

    def to_text(self) -> str:
        return f"{self.host} {self.pid} {self.started}"

    @classmethod
    def from_text(cls, text: str) -> "RankProcess":
        host, pid, started = text.rsplit(" ", 2)
        return cls(host, int(pid), int(started))

    def ended(self) -> bool:
        """True when this process is known to have ended (it ran on this host); False when it runs
        or cannot be seen from here."""
        if self.host != socket.gethostname():
            return False
        return _start_ticks(self.pid) != self.started
