"""One whole process and everything it starts, timed (``bench_cold.py``'s runs): its wall time
from start to exit, the CPU time of what it waited for, and the processes it left behind, which are
killed (every process a run starts carries a tag in its environment)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

TAG_VAR = "PYTEST_NCCL_BENCH_TAG"
LEFTOVER_GRACE = 5.0  # seconds after a run's own process exits for its descendants to be gone


@dataclass
class Command:
    name: str
    argv: list[str]
    expect: str      # a string its output must contain: the run passed every test
    label: str = ""
    timeout: float = 300.0



def processes_with_tag(tag: str) -> list[int]:
    """Live processes whose environment carries the tag (zombies count as gone)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(entry))
    return found


def kill_tagged(tag: str, grace: float = 0.0) -> int:
    """Wait up to ``grace`` seconds for the tagged processes to be gone, then SIGKILL the rest.
    Returns how many had to be killed."""
    deadline = time.monotonic() + grace
    while True:
        left = processes_with_tag(tag)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5.0  # SIGKILL is delivered asynchronously: see them gone
    while left and processes_with_tag(tag) and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(left)


@dataclass
class Run:
    wall: float
    cpu: float       # user + sys of the process and the descendants it waited for
    leftovers: int   # tagged processes still alive LEFTOVER_GRACE s after it exited


class RunFailed(RuntimeError):
    pass


def run_once(cmd: Command, cwd: str, log_path: str) -> Run:
    """Run ``cmd`` as a whole process; its wall time from start to exit."""
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{TAG_VAR: tag})
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(cmd.timeout)
        except BaseException:  # timeout, Ctrl-C: nothing it started may outlive us
            proc.kill()
            proc.wait()
            kill_tagged(tag)
            raise
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    leftovers = kill_tagged(tag, LEFTOVER_GRACE)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(log_path, errors="replace") as f:
        out = f.read()
    if rc != 0 or cmd.expect not in out:
        raise RunFailed(f"{cmd.name} failed (exit {rc}, expected {cmd.expect!r} in its output): "
                        f"{' '.join(cmd.argv)}\n{out[-3000:]}")
    return Run(wall, cpu, leftovers)
