"""Reads a process's memory cgroup and its OOM-kill counter from /proc and the cgroup mounts, for
``core.oom`` to decide on: the watch follows each rank of its node this way (``OomWatch``), and so
do the forked groups their rank processes. Nothing here is known where the files cannot be read
(no memory controller, another namespace): every answer is then None and no report says more."""

from __future__ import annotations

from .core.oom import MemoryCgroup, OomCount, OomKill, exiting, killed_by_oom, memory_cgroup, parse_oom_kills


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process is gone, the file is not there, or not ours to read
        return None


def count(cgroup: MemoryCgroup) -> OomCount | None:
    """The OOM kills ``cgroup`` counted so far; None where its counter cannot be read."""
    text = _read(cgroup.counter)
    kills = parse_oom_kills(text) if text is not None else None
    return OomCount(cgroup, kills) if kills is not None else None


class OomWatch:
    """One process's memory cgroup, followed while it lives: the OOM-kill counter as it was when the
    process was first seen in its current cgroup (``refresh`` notices a move), read again once the
    process is found dead (``killed``)."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.mounts = _read("/proc/self/mountinfo") or ""
        self.seen: str | None = None          # /proc/PID/cgroup as last read
        self.before: OomCount | None = None
        self.after: OomCount | None = None    # read once the process was found dead (``ended``)
        # no process, or no memory cgroup resolvable at all (no memory controller mounted): nothing to read
        self.off = pid is None or not self.mounts
        self.refresh()

    def refresh(self) -> None:
        """Once per tick while the process lives: a new cgroup (a process moved, or moved itself)
        gets its counter read now; the same one costs one small read."""
        if self.off:
            return
        text = _read(f"/proc/{self.pid}/cgroup")
        if text is None or text == self.seen or exiting(_read(f"/proc/{self.pid}/stat") or ""):
            return  # read after the text: an exiting task's flag is set before its cgroup reads '/'
        first, self.seen = self.seen is None, text
        cgroup = memory_cgroup(text, self.mounts)
        if cgroup is None and first:
            self.off = True
            return
        self.before = count(cgroup) if cgroup is not None else None

    def restart(self) -> None:
        """Count from now (a forked group's next call: a kill before it is not this call's)."""
        self.seen = self.after = None
        self.refresh()

    def ended(self) -> None:
        """The process was found dead: its cgroup's counter now (the kernel counts an OOM kill before
        it sends the SIGKILL), before a later kill of another process there could add to it."""
        if not self.off and self.before is not None and self.after is None:
            self.after = count(self.before.cgroup)

    def killed(self, signal_name: str | None, exit_code: int | None) -> OomKill | None:
        """The OOM killer's kill of the dead process, by how it was seen to end (``core.oom``)."""
        self.ended()
        return killed_by_oom(signal_name, exit_code, self.before, self.after)
