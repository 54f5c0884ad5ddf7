"""Which rank processes have ended: rank 0's decider learns of a rank that died inside a test (an
``os._exit``, a signal, gloo's abort) without waiting for the launcher, where it can see that process
(the same machine and PID namespace). Each rank publishes its ``RankProcess`` when it connects."""

from __future__ import annotations

import os
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


def pid_space() -> str:
    """This machine's boot and this process's PID namespace: two processes whose pids mean the same
    thing have the same. A hostname would not do: containers with the host's network share it, not
    their pids. '' where either cannot be read (nothing is then said of other processes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


@dataclass(frozen=True)
class RankProcess:
    """One rank's process, as published in the launcher's store (key ``store.PROC``)."""
    space: str      # ``pid_space()`` where it runs
    pid: int
    started: int

    @classmethod
    def mine(cls) -> "RankProcess":
        return cls(pid_space(), os.getpid(), _start_ticks(os.getpid()) or 0)

    def to_text(self) -> str:
        return f"{self.space} {self.pid} {self.started}"

    @classmethod
    def from_text(cls, text: str) -> "RankProcess":
        space, pid, started = text.rsplit(" ", 2)
        return cls(space, int(pid), int(started))

    def ended(self) -> bool:
        """True when this process is known to have ended (its pids are this process's); False when
        it runs or cannot be seen from here."""
        if not self.space or self.space != pid_space():
            return False
        return _start_ticks(self.pid) != self.started
