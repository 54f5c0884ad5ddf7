"""Controller side of ``pytest-nccl watch``: the launch command's processes.

- ``launch``: the command in a process group of its own (so that ending it never signals the
  watch), with ``PR_SET_PDEATHSIG`` = SIGTERM: if the watch dies, even by SIGKILL, the launcher is
  told to stop its ranks (torchrun does). Its stdout and stderr are the watch's, untouched.
- the watch makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a rank whose launcher died
  becomes the watch's child rather than init's, so ``descendants()`` still finds it (torchrun starts
  every rank in a session of its own: the launcher's process group does not reach them).
- ``end``: SIGTERM to the launcher's process group and to every descendant, then SIGKILL to whatever
  is left after ``term_wait``; then the /dev/shm files the job's processes had open are removed
  (``leftovers``: noted while they ran, since a process that is gone shows none).
- ``guard``: the guardian (``leftovers.Guardian``), which outlives a watch killed by SIGKILL and then
  ends the job's processes that are not ranks (ranks end themselves) and removes those files.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from ...core import jobdir
from ...core.nccl_env import dump_env, nccl_env
from ..timing import TIMING
from .leftovers import Guardian, ShmFiles

WATCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTUP_DIR = os.path.join(WATCH_DIR, "inrank", "startup")


def job_env(directory: str) -> dict:
    """The environment of a watched job: the start-up hook first on its path, its directory, this watch,
    and the NCCL settings (core/nccl_env.py) where unset."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = STARTUP_DIR + (os.pathsep + old if old else "")
    env[jobdir.ENV_DIR] = directory
    env[jobdir.ENV_PKG] = os.path.dirname(os.path.dirname(WATCH_DIR))
    env[jobdir.ENV_WATCHER] = str(os.getpid())
    env[jobdir.ENV_WATCHER_HOST] = socket.gethostname()
    env.update(nccl_env(env))  # the Flight Recorder, NCCL's watchdog (core/nccl_env.py)
    if directory:  # ... and its dumps on a timeout, read for the verdict (a launched test's session
        env.update(dump_env(env, directory))  # template has no directory: its tests keep their own)
    return env


def job_dir() -> str:
    """A private directory for one watched job, at a path short enough for its ranks' unix sockets."""
    directory = tempfile.mkdtemp(prefix="pytest-nccl-watch-")
    if len(directory) > 80:  # unix socket paths are short (108 bytes)
        shutil.rmtree(directory, ignore_errors=True)
        directory = tempfile.mkdtemp(prefix="pytest-nccl-watch-", dir="/tmp")
    return directory

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


class _Guarded:
    """This watch's guardian (not a process of the job: ``descendants`` skips it) and the job's
    /dev/shm files noted so far."""
    guardian: Guardian | None = None
    shm: ShmFiles | None = None
    directory: str | None = None


def guard(directory: str) -> Guardian:
    """Start the guardian of the job whose directory is ``directory``; ``Guardian.done()`` at a normal end."""
    _Guarded.guardian, _Guarded.shm, _Guarded.directory = Guardian(directory), ShmFiles(directory), directory
    return _Guarded.guardian


def note_shm(now: float | None = None) -> None:
    """Note the /dev/shm files the job's processes have open now: at once (before ending the job), or
    from the watch's loop (``now``) when ``NOTE_EVERY`` s passed since the last such note."""
    shm = _Guarded.shm
    if shm is None or (now is not None and not shm.due(now)):
        return
    shm.note(descendants())


def _ending() -> None:
    """The launcher may fold its report of the SIGTERM that follows (``fold.py``)."""
    if _Guarded.directory is not None:
        try:
            jobdir.touch(jobdir.ending(_Guarded.directory))
        except OSError:
            pass


def _remove_shm() -> None:
    if _Guarded.shm is not None:
        _Guarded.shm.remove()


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def launch(command: list, env: dict) -> subprocess.Popen:
    """Raises FileNotFoundError / PermissionError when the command cannot be executed."""
    watcher = os.getpid()

    def in_child():  # between fork and exec: async-signal-safe calls only
        os.setpgid(0, 0)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != watcher:  # the watch died before the prctl
            os._exit(1)

    return subprocess.Popen(command, env=env, preexec_fn=in_child)


def descendants(root: int | None = None) -> list[int]:
    """Live (not zombie) processes below ``root`` (default: this process), from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != jobdir.ProcState.ZOMBIE:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    spared = _Guarded.guardian.pid if _Guarded.guardian is not None else None
    while todo:
        for child in children.get(todo.pop(), []):
            if child == spared:
                continue
            found.append(child)
            todo.append(child)
    return found


def reap(launcher: subprocess.Popen) -> None:
    """Collect exited children other than the launcher (ranks adopted as subreaper); the launcher's
    status stays for ``Popen``."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return
        if info.si_pid == launcher.pid:
            if launcher.poll() is None:
                return
            continue
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end(launcher: subprocess.Popen, term_wait: float = 5.0) -> None:
    """End the launcher and every process below the watch: SIGTERM (once each: torchrun takes a
    second one in the middle of stopping its workers badly), then SIGKILL after ``term_wait``
    seconds to whatever is left; then the job's /dev/shm files."""
    note_shm()
    _ending()
    try:
        os.killpg(launcher.pid, signal.SIGTERM)
    except OSError:
        pass
    _signal([pid for pid in descendants() if _pgid(pid) != launcher.pid], signal.SIGTERM)
    deadline = time.monotonic() + term_wait
    while time.monotonic() < deadline:
        reap(launcher)
        if launcher.poll() is not None and not descendants():
            _remove_shm()
            return
        time.sleep(TIMING.reap_poll)
    kill_all(launcher)


def kill_all(launcher: subprocess.Popen) -> None:
    note_shm()
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(20):  # a process may fork while we kill its parent
        left = descendants()
        if not left:
            break
        _signal(left, signal.SIGKILL)
        time.sleep(TIMING.reap_poll)
        reap(launcher)
    try:
        launcher.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    reap(launcher)
    if not descendants():
        _remove_shm()
