"""The guardian of one ``pytest-nccl watch`` (``leftovers.Guardian``), run as a script with ``-I -S``:
it imports nothing of the package, so it starts in milliseconds and outlives the watch.

It reads its stdin, the watch's pipe, to the end. ``done``: the watch ended as it should (it ended
the job itself); anything else, the watch died (SIGKILL): end every process whose environment
carries the job's directory (``PYTEST_NCCL_WATCH_DIR``), SIGTERM then SIGKILL, remove the /dev/shm
files noted in the job's directory, then that directory.
"""

import os
import shutil
import signal
import sys
import time

ENV = b"PYTEST_NCCL_WATCH_DIR="
TERM_WAIT = 3.0


def job_processes(tag: bytes) -> list:
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    with open(f"/proc/{name}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


def signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def sweep(directory: str) -> None:
    tag = ENV + os.fsencode(directory)
    signal_all(job_processes(tag), signal.SIGTERM)
    deadline = time.monotonic() + TERM_WAIT
    while job_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(50):  # a process may fork while its parent is killed
        left = job_processes(tag)
        if not left:
            break
        signal_all(left, signal.SIGKILL)
        time.sleep(0.1)
    try:
        with open(os.path.join(directory, "shm-files")) as f:
            noted = [line.rstrip("\n") for line in f if line.startswith("/dev/shm/")]
    except OSError:
        noted = []
    for path in noted:
        try:
            if os.lstat(path).st_uid == os.getuid() and os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
        except OSError:
            pass
    shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    directory = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is the watch's to handle
    said = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    if said != b"done":
        sweep(directory)


if __name__ == "__main__":
    main()
