"""Client of the fork server (``pytest_nccl/rank/zygote.py``): start it, ask it to import test modules and
to fork (or spawn) ranks, take in the exit statuses it reports (ranks are its children, not ours).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

from ..core.messages import (
    Exited,
    Forked,
    ForkRank,
    Imported,
    ImportModules,
    RankSpec,
    RankStart,
    Ready,
    ZygoteConfig,
    ZygoteInfo,
)
from ..errors import RankSetupError
from .timing import TIMING


class Zygote:
    """Client of the fork server (``zygote.py``)."""

    def __init__(self, workdir: str, preload: list, env: dict, trace: bool,
                 rank_start: str = RankStart.AUTO):  # a RankStart, or its word
        self.workdir = workdir
        self.exits: dict[int, int] = {}  # pid -> raw wait status, as the zygote reports them
        self.imported: set = {name for name, _ in preload}
        parent_sock, child_sock = socket.socketpair()
        self.log_path = os.path.join(workdir, "zygote.log")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_nccl.rank.zygote", str(child_sock.fileno()), str(os.getpid())],
            pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=os.environ.copy())
        log.close()
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send(ZygoteConfig(list(sys.path), env, trace, list(preload), RankStart(rank_start)))
        self.info: ZygoteInfo | None = None  # set by ready(): the fork server imports torch meanwhile
        self.cuda_initialized_by: str | None = None  # the module that made forked ranks unusable
        self.pending_imports = 0                      # import requests not answered yet
        self.start_mode = RankStart.FORK

    def ready(self) -> "Zygote":
        """Wait until the fork server has imported torch and the preloaded modules."""
        if self.info is None:
            self.info = self._reply(Ready, TIMING.fork_server_start).info
            self._note(self.info)
        return self

    def _note(self, info: ZygoteInfo) -> None:
        self.cuda_initialized_by = info.cuda_initialized_by or self.cuda_initialized_by
        self.start_mode = info.start

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def _reply(self, answer: type, timeout: float):
        """The next message of class ``answer``; exit reports that come first are taken in."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                raise RankSetupError(f"the fork server did not answer '{answer.__name__}' within {timeout:.0f} s"
                                     f"\n{self._log_tail()}")
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                raise RankSetupError(f"the fork server exited (code {self.proc.poll()}):\n"
                                     f"{self._log_tail()}") from None
            if isinstance(msg, Exited):
                self.exits[msg.pid] = msg.status
            elif isinstance(msg, answer):
                return msg

    def drain(self) -> None:
        """Take in exit reports that arrived while nobody asked."""
        try:
            while self.conn.poll(0):
                msg = self.conn.recv()
                if isinstance(msg, Exited):
                    self.exits[msg.pid] = msg.status
        except (EOFError, OSError):
            pass

    def import_modules(self, modules: list, wait: bool = True, environ: dict | None = None) -> list[str]:
        """Have the fork server import these modules (with ``environ`` as its environment first,
        when given: what conftest files set during collection). ``wait=False`` returns at once; the
        answer is taken before the next fork or import."""
        todo = [(n, p) for n, p in modules if n not in self.imported]
        if not todo:
            return []
        self.conn.send(ImportModules(todo, list(sys.path), environ))
        self.imported.update(n for n, _ in todo)
        self.pending_imports += 1
        return self.settle_imports() if wait else []

    def settle_imports(self) -> list[str]:
        """Wait for the answers to imports asked without waiting; their failures."""
        failures = []
        while self.pending_imports:
            info = self._reply(Imported, TIMING.fork_server_start).info
            self.pending_imports -= 1
            self._note(info)
            failures += info.failures
        return failures

    def fork(self, spec: RankSpec) -> int:
        self.settle_imports()
        self.conn.send(ForkRank(spec))
        return self._reply(Forked, 30).pid

    def close(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
