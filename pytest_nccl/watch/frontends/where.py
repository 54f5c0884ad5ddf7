"""``pytest-nccl where [PID|JOBDIR]``: ask a running ``pytest-nccl watch`` where each rank of its job
is, without ending anything (for a person who does not know the watch's pid).

A watch answers SIGUSR1 by printing where each rank is and writing it to its job directory's
``where.txt`` (``cli.Watch``); this command finds the watches of this user by their job directories
(``where.pid`` in ``pytest-nccl-watch-*`` under the temporary directory), sends the signal and prints
the answer. With no argument, every running watch of this user is asked.

Exit status: 0 every watch asked answered; 1 none found, or one did not answer in time; 2 usage.
"""

from __future__ import annotations

import glob
import os
import signal
import sys
import tempfile
import time

from ...core import jobdir
from ...usage import UsageError, line

PROG = "pytest-nccl where"
ANSWER_WAIT = 5.0  # seconds a watch has to answer (it asks its ranks' agents for their stacks: ~1 s)
USAGE = f"""usage: {PROG} [PID | JOBDIR]

Print where each rank of a job under `pytest-nccl watch` is (its last collective and count, the one it
waits in and for how long, its line, the slowest rank); the job goes on untouched. PID: the watch's
process id (its first line names it); JOBDIR: its job directory; neither: every watch of this user.
Exit: 0 answered; 1 no watch found, or no answer within {ANSWER_WAIT:g} s; 2 usage error."""


def running_watches() -> list[tuple[int, str]]:
    """(pid, job directory) of every running watch of this user, oldest first."""
    found = {}
    for base in {tempfile.gettempdir(), "/tmp"}:  # the watch falls back to /tmp for a short path
        for directory in glob.glob(os.path.join(base, "pytest-nccl-watch-*")):
            pid = _pid_of(directory)
            if pid is not None:
                found[os.path.realpath(directory)] = pid
    return sorted(((pid, d) for d, pid in found.items()), key=lambda w: (os.path.getmtime(w[1]), w[0]))


def _pid_of(directory: str) -> int | None:
    """The pid of the live watch of this user that answers in ``directory``, else None."""
    try:
        if os.stat(directory).st_uid != os.getuid():
            return None
        with open(jobdir.where_pid(directory)) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def ask(pid: int, directory: str, wait: float = ANSWER_WAIT) -> str | None:
    """Send the watch SIGUSR1 and return its answer, or None when none came within ``wait``."""
    answer = jobdir.where_answer(directory)

    def stamp():
        try:
            st = os.stat(answer)
            return st.st_ino, st.st_mtime_ns
        except OSError:
            return None

    before = stamp()
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:  # it ended since it was found
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if stamp() not in (None, before):
            try:
                with open(answer) as f:
                    return f.read()
            except OSError:
                return None
    return None


def _target(arg: str) -> list[tuple[int, str]]:
    """The watch an argument names: a pid or a job directory."""
    if arg.isdigit():
        named = [w for w in running_watches() if w[0] == int(arg)]
        if not named:
            raise UsageError(f"no running pytest-nccl watch of this user has pid {arg}")
        return named
    pid = _pid_of(arg) if os.path.isdir(arg) else None
    if pid is None:
        raise UsageError(f"{arg} is neither a pid nor the job directory of a running pytest-nccl watch")
    return [(pid, arg)]


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        if len(argv) > 1 or (argv and argv[0].startswith("-")):
            raise UsageError(f"unexpected argument {argv[-1]!r}: give at most a pid or a job directory")
        watches = _target(argv[0]) if argv else running_watches()
    except UsageError as exc:
        sys.stderr.write(line(PROG, str(exc)) + "\n")
        return 2
    if not watches:
        sys.stderr.write(f"{PROG}: no running pytest-nccl watch of this user was found\n")
        return 1
    code = 0
    for pid, directory in watches:
        text = ask(pid, directory)
        if len(watches) > 1:
            print(f"== pytest-nccl watch (pid {pid}, {directory}) ==")
        if text is None:
            print(f"{PROG}: the watch (pid {pid}) did not answer within {ANSWER_WAIT:g} s")
            code = 1
        else:
            print(text.rstrip("\n"))
    return code
