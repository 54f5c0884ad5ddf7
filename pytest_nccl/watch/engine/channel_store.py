"""The torch store under the channel between watches (``channel.py``): clients and the server made
safely, the calls into torch that the exit waits for (``IN_TORCH``), and what crosses it counted
(``Counted``, written at exit when ``PYTEST_NCCL_WATCH_STATS`` names a directory: the scale
benchmark reads it).

The calls into torch's store run in background threads (connect, the relay) with the GIL released:
one that returned while the interpreter finalized was ended by ``pthread_exit``, whose unwinding
through torch's C++ called ``std::terminate`` (SIGABRT). The exit waits for them (``_InTorch``).
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

EXIT_WAIT = 30.0        # how long the exit waits for the store calls under way (seconds each)
ENV_STATS = "PYTEST_NCCL_WATCH_STATS"


class _InTorch:
    """The calls into torch's store under way in this process; none starts once it exits."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        # also in a forked child: it has none of its parent's threads, nor their calls
        self.calls, self.exiting, self.cond = 0, False, threading.Condition()

    @contextmanager
    def call(self) -> Iterator[bool]:
        """True: the call may run, and the exit waits for it; False: the process exits, make none."""
        with self.cond:
            allowed = not self.exiting
            self.calls += allowed
        try:
            yield allowed
        finally:
            with self.cond:
                self.calls -= allowed
                self.cond.notify_all()

    def settle(self, wait: float = EXIT_WAIT) -> bool:
        """Refuse new calls and wait for those under way; False if one outlived ``wait``. Runs at
        exit, before the interpreter finalizes (atexit): a call that returned after that aborted it."""
        with self.cond:
            self.exiting = True
            return self.cond.wait_for(lambda: self.calls == 0, timeout=wait)


IN_TORCH = _InTorch()
atexit.register(IN_TORCH.settle)
os.register_at_fork(after_in_child=IN_TORCH.reset)


class Stats:
    """What this process's channel sent and received: store calls (round trips) and bytes."""

    def __init__(self):
        self.calls = self.bytes_out = self.bytes_in = 0
        self.t0 = time.monotonic()
        self.decides = False

    def write(self) -> None:
        directory = os.environ.get(ENV_STATS)
        if not directory:
            return
        try:
            with open(os.path.join(directory, f"{os.getpid()}.json"), "w") as f:
                json.dump({"calls": self.calls, "bytes_out": self.bytes_out, "bytes_in": self.bytes_in,
                           "seconds": time.monotonic() - self.t0, "decides": self.decides}, f)
        except OSError:
            pass


STATS = Stats()
if os.environ.get(ENV_STATS):
    atexit.register(STATS.write)


def _size(value) -> int:
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8


class Counted:
    """A store whose calls are counted in ``STATS`` (each method call is one round trip)."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        method = getattr(self._store, name)
        if not callable(method):
            return method

        def counted(*args):
            STATS.calls += 1
            STATS.bytes_out += sum(_size(a) for a in args)
            out = method(*args)
            STATS.bytes_in += _size(out)
            return out
        return counted


def make_store(host: str, port: int, timeout: float, server: bool = False):
    """A TCPStore client of ``host:port`` (or a server on an ephemeral port), None when it cannot be
    had: at once when nothing listens there (TCPStore's own client retries a refused connection for
    twice its ``timeout``; a live store's port accepts at once however loaded its host)."""
    # torch's C++ log would print each failed connection attempt with a stack: the watch says it once
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    if not server and not _listening(host, port, timeout):
        return None
    try:
        with IN_TORCH.call() as allowed:
            if not allowed:
                return None
            import torch.distributed as dist

            return dist.TCPStore(host, port, is_master=server, wait_for_workers=False,
                                 timeout=datetime.timedelta(seconds=timeout))
    except Exception:  # TCPStore's error differs by torch version and cause: no store
        return None


def _listening(host: str, port: int, timeout: float) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:  # refused (gone), unreachable, unresolvable, or no answer within the timeout
        return False
