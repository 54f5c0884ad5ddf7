"""The fork server: one process per pytest session that imports torch (and the test modules, and
what they import: trl takes 6-7 s) once, then forks a rank per request in about a millisecond.

Started by ``forked.zygote_client.Zygote`` as ``python -m pytest_nccl.rank.zygote FD PARENT``; speaks
the fork server's messages of ``core/messages.py`` (pickled) over the socket FD. It reaps its children
and reports each exit, because ranks are not the controller's children.
It dies with the controller (PR_SET_PDEATHSIG), and every rank dies with it.

CUDA: a process that initialized CUDA cannot give CUDA to a forked child ("Cannot re-initialize
CUDA in forked subprocess"). The fork server checks CUDA with NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``,
so ``torch.cuda.is_available()`` at import is harmless) and, after each import, whether a module
initialized CUDA anyway (a CUDA tensor at module level). From then on it starts each rank as a
fresh interpreter (``python -m pytest_nccl.rank.zygote --rank SPEC PARENT``) that imports torch and the
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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, NoReturn

from ..core.messages import (
    Exited,
    Forked,
    ForkRank,
    Imported,
    ImportModules,
    RankSpec,
    RankStart,
    Ready,
    SpawnedRank,
    ZygoteConfig,
    ZygoteInfo,
)

PR_SET_PDEATHSIG = 1


@dataclass
class _ServerState:
    """What the fork server has done so far."""
    trace: bool
    rank_start: RankStart
    check_cuda: bool                              # look for CUDA initialized by an import (auto)
    modules: list = field(default_factory=list)   # (module, path) imported, in order
    cuda_initialized_by: str | None = None
    torch: str = ""

    @property
    def spawns(self) -> bool:
        return self.rank_start == RankStart.SPAWN or (self.rank_start == RankStart.AUTO
                                                      and self.cuda_initialized_by is not None)

    def info(self, failures: list) -> ZygoteInfo:
        return ZygoteInfo(self.torch, failures, self.cuda_initialized_by,
                          RankStart.SPAWN if self.spawns else RankStart.FORK)


def die_with_parent(expected_parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no libc, or no prctl (not Linux)
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


def import_modules(modules, sys_path, state: _ServerState) -> list[str]:
    """Import test modules and preloads; note in ``state`` the first one that initialized CUDA."""
    from . import loop
    for entry in sys_path:
        if entry not in sys.path:
            sys.path.append(entry)
    failures = []
    for name, path in modules:
        try:
            if path:
                loop.load_module(name, path)
            else:
                __import__(name)
        except BaseException as exc:  # a test module that fails to import fails in its rank, later
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
        state.modules.append((name, path))
        if state.cuda_initialized_by is None and state.check_cuda and cuda_initialized():
            state.cuda_initialized_by = path or name
    return failures


def _fork_rank(conn: Connection, pidfds: dict, spec: RankSpec) -> int:
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
            from . import loop
            loop.main(spec)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(72)
    return pid


def _spawn_rank(state: _ServerState, spec: RankSpec) -> int:
    """Start a rank as a fresh interpreter: its own session (teardown reaches what it starts)."""
    path = spec.output_path + ".spec"
    with open(path, "wb") as f:
        pickle.dump(SpawnedRank(spec, list(state.modules), list(sys.path), state.trace), f)
    return os.posix_spawn(sys.executable, [sys.executable, "-m", "pytest_nccl.rank.zygote", "--rank", path,
                                           str(os.getpid())], os.environ, setsid=True)


def spawned_rank_main(spec_path: str, parent: int) -> None:
    """A rank started as a fresh interpreter: what the fork server holds (torch, the tracer, the test
    modules), built here, then the same rank loop as a forked rank."""
    die_with_parent(parent)
    with open(spec_path, "rb") as f:
        job: SpawnedRank = pickle.load(f)
    sys.path[:] = job.sys_path
    from . import loop
    loop.set_environment(job.spec)  # CUDA_VISIBLE_DEVICES and friends, before any module touches CUDA
    import torch.distributed  # noqa: F401

    from . import tracer
    if job.trace:
        tracer.install()
    state = _ServerState(job.trace, RankStart.FORK, check_cuda=False)
    loop.main(job.spec, prepare=lambda: import_modules(job.modules, [], state))


class _Server:
    """The fork server's loop: one handler per message the controller sends."""

    def __init__(self, conn: Connection, state: _ServerState):
        self.conn, self.state = conn, state
        self.pidfds: dict[int, int] = {}   # pidfd -> pid of each rank not reaped yet

    def on_import(self, msg: ImportModules) -> None:
        if msg.environ:  # the controller's environment after collection (conftest files set some)
            os.environ.clear()
            os.environ.update(msg.environ)
        info = self.state.info(import_modules(msg.modules, msg.sys_path, self.state))
        gc.freeze()
        self.conn.send(Imported(info))

    def on_fork(self, msg: ForkRank) -> None:
        if self.state.spawns:
            pid = _spawn_rank(self.state, msg.spec)
        else:
            pid = _fork_rank(self.conn, self.pidfds, msg.spec)
        self.pidfds[os.pidfd_open(pid)] = pid
        self.conn.send(Forked(pid))

    def reap(self, pidfd: int) -> None:
        pid = self.pidfds.pop(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = -1
        self.conn.send(Exited(pid, status))

    def controller_gone(self) -> NoReturn:
        for pid in self.pidfds.values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)

    def serve(self) -> None:
        handlers: dict[type, Callable[[Any], None]] = {ImportModules: self.on_import, ForkRank: self.on_fork}
        while True:
            for ready in wait([self.conn, *self.pidfds]):
                if isinstance(ready, int):  # a child's pidfd: it exited
                    self.reap(ready)
                    continue
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    self.controller_gone()
                handlers[type(msg)](msg)


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
    config: ZygoteConfig = conn.recv()
    sys.path[:] = config.sys_path
    os.environ.update(config.env)
    import torch
    import torch.distributed  # noqa: F401

    from . import loop, tracer  # noqa: F401
    if config.trace:
        tracer.install()
    try:  # what loading a test module needs (assertion rewriting), while pytest still collects
        import _pytest.assertion.rewrite  # noqa: F401
    except ImportError:
        pass
    rank_start = RankStart(config.rank_start)
    state = _ServerState(config.trace, rank_start, check_cuda=rank_start == RankStart.AUTO, torch=torch.__version__)
    failures = import_modules(config.preload, [], state)
    gc.freeze()  # what is loaded now is shared by every fork: keep the collector from touching (copying) it
    conn.send(Ready(state.info(failures)))
    _Server(conn, state).serve()


if __name__ == "__main__":
    main()
