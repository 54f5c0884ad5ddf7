"""What a watched job could leave behind, and who removes it.

- ``/dev/shm`` files the job's processes have open (``/proc/PID/fd``) or mapped (``/proc/PID/maps``):
  noted while they run (``ShmFiles.note``, every ``NOTE_EVERY`` s, and just before the watch ends the job),
  because a process that is gone shows nothing. Once the watch has ended the job they are removed
  (``remove``): DeepSpeed's ranks, for one, never unlink their ``deepspeed_allreduce_buffer_*`` when
  they are ended. Only files noted as open by the job's own processes, only regular files of this
  user, only once those processes are gone. A job that ends on its own keeps its files: what it
  leaves is its own doing.
- the guardian (``guardian.py``): a small process started with the watch, outside the job, that
  outlives a watch killed by SIGKILL (a CI step's hard timeout), which no handler sees. When its
  pipe from the watch closes without the word ``done``, it ends every process that carries the
  job's directory in its environment (a ``multiprocessing`` helper that never imported torch, its
  resource tracker: ranks already end themselves), removes the noted ``/dev/shm`` files, and the
  job's directory.
"""

from __future__ import annotations

import os
import subprocess
import sys

SHM = "/dev/shm/"
NOTED = "shm-files"          # in the job's directory: the /dev/shm files noted, one a line
# seconds between two notes while the job runs (a scan of /proc): often, because a rank that aborts
# right after it made its files (DeepSpeed's buffers) takes its launcher's other ranks down with it
# within a second
NOTE_EVERY = 0.25
GUARDIAN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guardian.py")


def shm_files(pids) -> set[str]:
    """The /dev/shm files the processes ``pids`` have open or mapped now."""
    found: set[str] = set()
    for pid in pids:
        base = f"/proc/{pid}"
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    target = os.readlink(f"{base}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(SHM) and not target.endswith(" (deleted)"):
                    found.add(target)
        except OSError:
            continue
        try:
            with open(f"{base}/maps") as f:
                for line in f:
                    at = line.find(SHM)
                    if at >= 0 and not line.rstrip().endswith("(deleted)"):
                        found.add(line[at:].rstrip("\n"))
        except OSError:
            pass
    return found


class ShmFiles:
    """The /dev/shm files of one job, noted in ``<directory>/shm-files`` for the guardian too."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, NOTED)
        self.seen: set[str] = set()
        self.next_note = 0.0         # the watch's clock: when its loop notes next

    def due(self, now: float) -> bool:
        """The loop's note is due (a scan of /proc every ``NOTE_EVERY`` s, not every tick)."""
        if now < self.next_note:
            return False
        self.next_note = now + NOTE_EVERY
        return True

    def note(self, pids) -> None:
        new = shm_files(pids) - self.seen
        if not new:
            return
        self.seen |= new
        try:
            with open(self.path, "a") as f:
                f.write("".join(p + "\n" for p in sorted(new)))
        except OSError:
            pass

    def remove(self) -> list[str]:
        """Unlink the noted files still there (the job's processes are gone); the ones removed."""
        removed = remove(self.seen)
        self.seen.clear()
        return removed


def remove(paths) -> list[str]:
    removed = []
    for path in sorted(paths):
        if not path.startswith(SHM) or "/../" in path:
            continue
        try:
            st = os.lstat(path)
            if st.st_uid == os.getuid() and os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
    return removed


class Guardian:
    """The guardian process of one watch; ``done()`` when the watch ends as it should."""

    def __init__(self, directory: str):
        self.proc: subprocess.Popen | None = None
        try:  # -I -S: none of the job's environment or site hooks; a clean environment
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", GUARDIAN, directory], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         env={"PATH": os.environ.get("PATH", "")}, start_new_session=True)
        except OSError:
            self.proc = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def done(self, clean: bool = True) -> None:
        """The watch ends; ``clean``: nothing of the job is left (else the guardian ends what is)."""
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(b"done" if clean else b"left")
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
