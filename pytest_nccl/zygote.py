"""The fork server: one process per pytest session that imports torch (and the test modules, and
what they import: trl takes 6-7 s) once, then forks a rank per request in about a millisecond.

Started by ``group.Zygote`` as ``python -m pytest_nccl.zygote FD PARENT``; speaks pickled tuples
over the socket FD:
    controller -> zygote: ("import", [(module, path), ...], sys_path, environ | None) | ("fork", spec)
    zygote -> controller: ("ready", info) | ("imported", info) | ("forked", pid)
                          | ("exited", pid, raw_wait_status)
    info: {"torch": version, "failures": [...], "cuda_initialized_by": module or None, "start": how}
It reaps its children and reports each exit, because ranks are not the controller's children.
It dies with the controller (PR_SET_PDEATHSIG), and every rank dies with it.

CUDA: a process that initialized CUDA cannot give CUDA to a forked child ("Cannot re-initialize
CUDA in forked subprocess"). The fork server checks CUDA with NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``,
so ``torch.cuda.is_available()`` at import is harmless) and, after each import, whether a module
initialized CUDA anyway (a CUDA tensor at module level). From then on it starts each rank as a
fresh interpreter (``python -m pytest_nccl.zygote --rank SPEC PARENT``) that imports torch and the
same modules itself: seconds per group instead of a millisecond, but correct. ``rank_start`` =
"spawn" asks for that from the start, "fork" never (a rank that then touches CUDA fails).
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
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


def cuda_initialized() -> bool:
    """Whether this process holds CUDA state that a forked child cannot use: CUDA initialized by
    torch (a CUDA tensor, ``set_device``), or the driver queried outside NVML, which makes torch
    mark every later fork as a bad fork."""
    import torch
    if torch.cuda.is_initialized():
        return True
    if not torch.cuda._is_compiled():
        return False
    pid = os.fork()  # about a millisecond: ask a child whether torch considers it a bad fork
    if pid == 0:
        bad = getattr(torch._C, "_cuda_isInBadFork", lambda: False)()
        os._exit(3 if bad else 0)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3


def import_modules(modules, sys_path, state: dict) -> list[str]:
    """Import test modules and preloads; note in ``state`` the first one that initialized CUDA."""
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
        state["modules"].append((name, path))
        if state["cuda_initialized_by"] is None and state["check_cuda"] and cuda_initialized():
            state["cuda_initialized_by"] = path or name
    return failures


def _info(state: dict, failures: list) -> dict:
    return {"torch": state["torch"], "failures": failures, "cuda_initialized_by": state["cuda_initialized_by"],
            "start": "spawn" if _spawns(state) else "fork"}


def _spawns(state: dict) -> bool:
    return state["rank_start"] == "spawn" or (state["rank_start"] == "auto"
                                               and state["cuda_initialized_by"] is not None)


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


def _spawn_rank(state: dict, spec: dict) -> int:
    """Start a rank as a fresh interpreter: its own session (teardown reaches what it starts)."""
    path = spec["output_path"] + ".spec"
    with open(path, "wb") as f:
        pickle.dump({"spec": spec, "modules": list(state["modules"]), "sys_path": list(sys.path),
                     "trace": state["trace"]}, f)
    return os.posix_spawn(sys.executable, [sys.executable, "-m", "pytest_nccl.zygote", "--rank", path,
                                           str(os.getpid())], os.environ, setsid=True)


def spawned_rank_main(spec_path: str, parent: int) -> None:
    """A rank started as a fresh interpreter: what the fork server holds (torch, the tracer, the test
    modules), built here, then the same rank loop as a forked rank."""
    die_with_parent(parent)
    with open(spec_path, "rb") as f:
        job = pickle.load(f)
    spec = job["spec"]
    sys.path[:] = job["sys_path"]
    from . import rank
    rank.set_environment(spec)  # CUDA_VISIBLE_DEVICES and friends, before any module touches CUDA
    import torch.distributed  # noqa: F401
    from . import tracer
    if job["trace"]:
        tracer.install()
    rank.main(spec, prepare=lambda: import_modules(job["modules"], [], _state(job["trace"], "fork", False)))


def _state(trace: bool, rank_start: str, check_cuda: bool) -> dict:
    return {"modules": [], "cuda_initialized_by": None, "trace": trace, "rank_start": rank_start,
            "check_cuda": check_cuda, "torch": ""}


def main() -> None:
    if sys.argv[1] == "--rank":
        try:
            spawned_rank_main(sys.argv[2], int(sys.argv[3]))
        finally:
            os._exit(72)
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
    try:  # what loading a test module needs (assertion rewriting), while pytest still collects
        import _pytest.assertion.rewrite  # noqa: F401
    except ImportError:
        pass
    state = _state(config["trace"], config.get("rank_start", "auto"), config.get("rank_start", "auto") == "auto")
    state["torch"] = torch.__version__
    failures = import_modules(config["preload"], [], state)
    gc.freeze()  # what is loaded now is shared by every fork: keep the collector from touching (copying) it
    conn.send(("ready", _info(state, failures)))

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
                    if msg[3]:  # the controller's environment after collection (conftest files set some)
                        os.environ.clear()
                        os.environ.update(msg[3])
                    info = _info(state, import_modules(msg[1], msg[2], state))
                    gc.freeze()
                    conn.send(("imported", info))
                elif msg[0] == "fork":
                    if _spawns(state):
                        pid = _spawn_rank(state, msg[1])
                    else:
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
