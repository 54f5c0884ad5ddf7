"""Whether the kernel's OOM killer took a rank, decided once, on data: the OOM-kill counter of the
rank's memory cgroup read while it ran and again once it was found dead by SIGKILL (``OomCount``);
when it grew, the rank was the OOM killer's (``OomKill``), said in its exit's words. The texts of
``/proc/PID/cgroup``, ``/proc/self/mountinfo`` and the counter files are parsed here; ``memcg.py``
reads them.

cgroup v2: ``memory.events``, field ``oom_kill`` (counts the cgroup's descendants too); cgroup v1:
``memory.oom_control`` under the ``memory`` controller's mount, field ``oom_kill`` (this cgroup's
own). The kernel counts the kill before it sends the SIGKILL, so a dead rank's count is final.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .states import Word

OOM_KILL_FIELD = "oom_kill"


class CgroupVersion(Word):
    """Which hierarchy the memory controller is on, which names the counter's file."""
    V1 = "v1"
    V2 = "v2"

    @property
    def counter_file(self) -> str:
        return "memory.oom_control" if self is CgroupVersion.V1 else "memory.events"


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup: its path in the hierarchy ('/x/y', as /proc/PID/cgroup says it) and
    the counter's file on this host."""
    path: str
    version: CgroupVersion
    counter: str


@dataclass(frozen=True)
class OomCount:
    """The OOM kills a memory cgroup had counted at one moment."""
    cgroup: MemoryCgroup
    kills: int


@dataclass(frozen=True)
class OomKill:
    """The OOM killer took the rank: its memory cgroup counted ``kills`` more OOM kills between the
    rank's start (or its move into that cgroup) and its death by SIGKILL."""
    cgroup: str
    kills: int

    SIGNAL = "SIGKILL"  # the OOM killer's only signal

    def describe(self) -> str:
        """The exit as a report says it, after "rank 1 " or "it was "."""
        return (f"killed by the kernel's OOM killer ({self.SIGNAL}; its memory cgroup {self.cgroup} counted "
                f"{self.kills} OOM kill{'s' if self.kills != 1 else ''})")

    def to_dict(self) -> dict:
        return {"cgroup": self.cgroup, "kills": self.kills}

    @classmethod
    def from_dict(cls, data) -> OomKill | None:
        """The note a JSON form describes; None for anything else (an older or newer writer)."""
        try:
            return cls(str(data["cgroup"]), int(data["kills"]))
        except (KeyError, TypeError, ValueError):
            return None


def oom_kill(before: OomCount | None, after: OomCount | None) -> OomKill | None:
    """The OOM killer's kill of a rank found dead by SIGKILL (or without any record of how it ended),
    or None: unknown where either count could not be read or they are of different cgroups, and
    not the OOM killer's where the counter did not grow (a plain ``kill -9``)."""
    if before is None or after is None or before.cgroup != after.cgroup or after.kills <= before.kills:
        return None
    return OomKill(after.cgroup.path, after.kills - before.kills)


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill`` field of ``memory.events`` or ``memory.oom_control``; None without one."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == OOM_KILL_FIELD:
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class _Mount:
    root: str       # the part of the hierarchy this mount shows
    point: str      # where it is mounted
    fstype: str
    options: frozenset


def _unescape(field: str) -> str:
    # mountinfo writes a space, a tab, a newline and a backslash as octal escapes ("\040")
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mounts(mountinfo: str) -> list[_Mount]:
    mounts = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 3:
            continue
        mounts.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), after[0], frozenset(after[2].split(","))))
    return mounts


def _under(mount: _Mount, path: str) -> str | None:
    """Where cgroup ``path`` is on this host through ``mount``; None when the mount does not show it."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    return os.path.join(mount.point, path[len(root):].lstrip("/"))


def memory_cgroup(proc_cgroup: str, mountinfo: str) -> MemoryCgroup | None:
    """The memory cgroup a process's ``/proc/PID/cgroup`` names, with its counter's file through the
    reader's mounts (``/proc/self/mountinfo``): the v1 ``memory`` controller's when it has one (a
    hybrid host keeps memory there), else the v2 hierarchy's; None where no mount shows it."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    mounts = _mounts(mountinfo)
    if v1 is not None:
        for mount in mounts:
            place = _under(mount, v1) if mount.fstype == "cgroup" and "memory" in mount.options else None
            if place is not None:
                return MemoryCgroup(v1, CgroupVersion.V1, os.path.join(place, CgroupVersion.V1.counter_file))
        return None
    if v2 is not None:
        for mount in mounts:
            place = _under(mount, v2) if mount.fstype == "cgroup2" else None
            if place is not None:
                return MemoryCgroup(v2, CgroupVersion.V2, os.path.join(place, CgroupVersion.V2.counter_file))
    return None


def killed_by_oom(signal_name: str | None, exit_code: int | None, before: OomCount | None,
                  after: OomCount | None) -> OomKill | None:
    """How a dead rank went, when the OOM killer took it: it was killed by SIGKILL, or nothing says
    how (its launcher reaped it before the watch saw its status), and its cgroup's counter grew
    (``oom_kill``). None for any other ending: an exit status, a fatal signal faulthandler recorded, a
    SIGTERM the rank noted."""
    if exit_code is not None or signal_name not in (None, OomKill.SIGNAL):
        return None
    return oom_kill(before, after)


PF_EXITING = 0x4  # the kernel's task flag, set as the task begins to exit


def exiting(proc_stat: str) -> bool:
    """The process of this ``/proc/PID/stat`` text is exiting (or the text is not one): on cgroup v1 an
    exiting task's ``/proc/PID/cgroup`` names the root, which is no move of the rank."""
    try:
        flags = int(proc_stat.rsplit(")", 1)[1].split()[6])
    except (IndexError, ValueError):
        return True
    return bool(flags & PF_EXITING)
