"""The fork server: one process per pytest session that imports torch (and the test modules, and
what they import: trl takes 6-7 s) once, then forks a rank per request in about a millisecond.

Started by ``group.Zygote`` as ``python -m pytest_nccl.zygote FD``; speaks pickled tuples over the
socket FD:
    controller -> zygote: ("import", [(module, path), ...], sys_path) | ("fork", spec)
    zygote -> controller: ("ready", info) | ("imported", failures) | ("forked", pid)
                          | ("exited", pid, raw_wait_status)
It reaps its children and reports each exit, because ranks are not the controller's children.
It dies with the controller (PR_SET_PDEATHSIG), and every rank dies with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from multiprocessing.connection import Connection, wait

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)


def _import_modules(modules, sys_path) -> list[str]:
    from . import rank
    for entry in sys_path:
        if entry not in sys.path:
            sys.path.append(entry)
    failures = []
    for name, path in modules:
        try:
            if path:
                rank.load_module(name, path)
            else:
                __import__(name)
        except BaseException as exc:  # a test module that fails to import fails in its rank, later
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    return failures


def _fork_rank(conn: Connection, pidfds: dict, spec: dict) -> int:
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            conn.close()
            for fd in pidfds:
                os.close(fd)
            os.setsid()  # its own process group: teardown reaches whatever the rank starts
            die_with_parent(parent)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            from . import rank
            rank.main(spec)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(72)
    return pid


def main() -> None:
    fd = int(sys.argv[1])
    die_with_parent(int(sys.argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to pytest, which tears us down
    conn = Connection(fd)
    config = conn.recv()
    sys.path[:] = config["sys_path"]
    os.environ.update(config["env"])
    import torch
    import torch.distributed  # noqa: F401
    from . import rank, tracer  # noqa: F401
    if config["trace"]:
        tracer.install()
    info = {"torch": torch.__version__, "failures": _import_modules(config["preload"], [])}
    conn.send(("ready", info))

    pidfds: dict[int, int] = {}
    while True:
        for ready in wait([conn, *pidfds]):
            if ready is conn:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    for pid in pidfds.values():
                        try:
                            os.killpg(pid, signal.SIGKILL)
                        except OSError:
                            pass
                    os._exit(0)
                if msg[0] == "import":
                    conn.send(("imported", _import_modules(msg[1], msg[2])))
                elif msg[0] == "fork":
                    pid = _fork_rank(conn, pidfds, msg[1])
                    pidfds[os.pidfd_open(pid)] = pid
                    conn.send(("forked", pid))
            else:
                pid = pidfds.pop(ready)
                os.close(ready)
                try:
                    _, status = os.waitpid(pid, 0)
                except ChildProcessError:
                    status = -1
                conn.send(("exited", pid, status))


if __name__ == "__main__":
    main()
