"""What the watches of one job on several nodes say to each other, through a store found through the
one the job already has: the launcher's c10d store at ``MASTER_ADDR:MASTER_PORT`` (torchrun's agent
store, or the one rank 0 hosts under srun), which every rank reaches anyway. The watch of rank 0's
node hosts the channel's store itself and announces it there (``connect``): the job's store ends
with its launcher, and a verdict must outlive a node whose job ended first.

Every watch publishes what it follows of its own node's ranks, and reads what the others publish of
theirs, under ``pytest-nccl-watch/<job>/``:

    info/<rank>            the rank's info (its rank-R.json)
    journal/<rank>/count   how many chunks of its journal were published (``add``)
    journal/<rank>/<i>     chunk i: the journal's bytes read in one tick; only the last
                           ``KEEP_CHUNKS`` are kept (the store lives in the deciding watch's memory)
    exit/<rank>            its exit report (``RankReport`` JSON): its own record, or how the owning
                           watch saw it end (a signal, the stacks faulthandler wrote)
    progress/<rank>        the Flight Recorder's per-group progress, as last asked (JSON)
    ask/<rank>/count       questions for the rank's agent; ask/<rank>/<i>: the request word
    answer/<rank>/<i>      the owning watch's relay of the agent's answer (JSON)
    watches                how many watches follow the job (each adds one when it joins)
    synced                 how many of them have published what their ranks wrote before they
                           joined (a watch that decides waits for the others to be in sync)
    flush                  how many times a deciding watch asked the others to publish what their
                           ranks wrote up to now; flushed/<n>: how many did, for request n
    verdict                the deciding watch's finding (pickled), the same on every node
    verdict-taken          how many other watches have it (the deciding watch's store lives on
                           the launcher of its node: it ends that job once every watch has it)

A store error is first taken for a hiccup (a loaded host: a client's socket timed out or was reset):
the call is retried on a fresh client, ``ATTEMPTS`` times. Only when that fails too, or no fresh
client can be had (nothing listens at the store's address: ``_store``), is the channel lost (the
deciding watch, which hosts the store, ended): every call then answers "nothing", and the watch goes
on with what it sees itself; the other nodes' ranks it could no longer follow are unseen
(``RankState.UNSEEN``), never evidence about the job (``Monitor``).

The calls into torch's store run in background threads (connect, the relay) with the GIL released:
one that returned while the interpreter finalized was ended by ``pthread_exit``, whose unwinding
through torch's C++ called ``std::terminate`` (SIGABRT). The exit waits for them (``_InTorch``).
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import pickle
import socket
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ..core.messages import AgentRequest
from ..core.reports import RankReport
from .jobdir import RankInfo
from .timing import TIMING

PREFIX = "pytest-nccl-watch"
KEEP_CHUNKS = 64        # journal chunks kept per rank: about 3 s of journal at one chunk per tick
ATTEMPTS = 4            # tries of one store call, each on a fresh client after the first failure
# how long a watch waits for the channel to come up (its own import of torch, the other watches' and
# the announcement in the job's store): seconds on an idle host, tens of seconds on a loaded one
CONNECT_WAIT = 30.0
EXIT_WAIT = 30.0        # how long the exit waits for the store calls under way (seconds each)


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


class Channel:
    """The keys of one job in a store (anything with torch's Store methods: set, get, check, add,
    delete_key). ``reopen``: a fresh client of the same store (None when it cannot be had), to retry
    a call that failed on this one."""

    def __init__(self, store, job: str, reopen: Callable[[], object] | None = None):
        self.store, self.prefix = store, f"{PREFIX}/{job}/"
        self.reopen = reopen
        self.lost = False
        self.errors = 0       # store calls that failed and were retried (PYTEST_NCCL_WATCH_DEBUG says each)
        self._lock = threading.Lock()   # one client: the monitor's thread and the relay's share it
        self._chunks: dict[int, int] = {}   # rank -> chunks published by this watch
        self._answered: dict[int, set] = {}  # rank -> numbers of the questions this watch answered

    def _k(self, *parts) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def _call(self, fn, *args, default=None):
        """``fn(*args)`` on the store; ``fn`` takes the store first (a fresh client may replace it)."""
        with self._lock:
            for attempt in range(ATTEMPTS):
                if self.lost:  # found so before, maybe by the thread that held the lock: not tried again
                    return default
                try:
                    with IN_TORCH.call() as allowed:
                        if not allowed:  # the process exits
                            return default
                        return fn(self.store, *args)
                except Exception as exc:  # a hiccup, or the store went away (its node ended)
                    self.errors += 1
                    _debug(f"channel: {getattr(fn, '__name__', fn)}: {type(exc).__name__}: {exc} "
                           f"(try {attempt + 1} of {ATTEMPTS})")
                    if attempt + 1 < ATTEMPTS:
                        time.sleep(TIMING.ask_poll * (attempt + 1))
                        if self.reopen is None:
                            continue
                        fresh = self.reopen()
                        if fresh is None:  # nothing listens there any more: the store ended with its watch
                            break
                        self.store = fresh
            # On with what this watch sees. Each try that waited out a fresh client's timeout on a
            # store that was gone held the lock: the watch's loop waited in line behind the relay
            # thread, then tried as often itself, and a clean job's watch ended 50-130 s late (soak).
            self.lost = True
            _debug("channel: lost")
            return default

    def _get(self, key: str) -> bytes | None:
        def get(store):
            return store.get(key) if store.check([key]) else None
        return self._call(get)

    def _set(self, key: str, value: bytes | str) -> None:
        self._call(_set, key, value)

    def _add(self, name: str, n: int) -> int:
        """The counter ``name`` of the job, raised by ``n`` (0: read)."""
        return self._call(_add, self._k(name), n, default=0)

    # -- ranks --------------------------------------------------------------------------------------
    def publish_info(self, rank: int, info: dict) -> None:
        self._set(self._k("info", rank), json.dumps(info))

    def info(self, rank: int) -> dict | None:
        return _decoded(self._get(self._k("info", rank)))

    # -- journals -------------------------------------------------------------------------------------
    def push(self, rank: int, data: bytes) -> None:
        """Publish the bytes of the rank's journal read since the last push."""
        if not data:
            return
        i = self._chunks.get(rank, 0)

        def push(store):
            if not store.check([self._k("journal", rank, i)]):  # a retry after the set went through
                store.set(self._k("journal", rank, i), data)
                store.add(self._k("journal", rank, "count"), 1)
            if i >= KEEP_CHUNKS:
                store.delete_key(self._k("journal", rank, i - KEEP_CHUNKS))
        self._call(push)
        self._chunks[rank] = i + 1

    def pull(self, rank: int, after: int) -> tuple[int, bytes]:
        """(chunks published so far, the bytes of those after the first ``after``). Chunks dropped
        before this watch read them (it fell ``KEEP_CHUNKS`` behind) are skipped."""
        def pull(store):
            count = store.add(self._k("journal", rank, "count"), 0)
            out = b""
            for i in range(max(after, count - KEEP_CHUNKS), count):
                key = self._k("journal", rank, i)
                if store.check([key]):
                    out += store.get(key)
            return count, out
        return self._call(pull, default=(after, b""))

    # -- how ranks ended, how far they got -----------------------------------------------------------------
    def publish_exit(self, report: RankReport) -> None:
        self._set(self._k("exit", report.rank), report.to_json())

    def exit_report(self, rank: int) -> RankReport | None:
        raw = self._get(self._k("exit", rank))
        try:
            return RankReport.from_json(raw.decode()) if raw else None
        except (ValueError, TypeError):
            return None

    def publish_progress(self, rank: int, progress) -> None:
        self._set(self._k("progress", rank), json.dumps(progress))

    def progress(self, rank: int):
        return _tuples(_decoded(self._get(self._k("progress", rank))))

    # -- questions for a rank's agent, relayed by the watch that owns the rank ----------------------------
    def ask(self, rank: int, request: AgentRequest, timeout: float) -> dict | None:
        """The rank's agent's answer to ``request``, through its node's watch."""
        n = self._call(_add, self._k("ask", rank, "count"), 1)
        if n is None:
            return None
        self._set(self._k("ask", rank, n - 1), request.value)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.lost:
            raw = self._get(self._k("answer", rank, n - 1))
            if raw is not None:
                return _decoded(raw)
            time.sleep(TIMING.ask_poll)
        return None

    def questions(self, rank: int) -> list[tuple[int, AgentRequest | None]]:
        """Questions for ``rank`` not answered yet by this watch: (number, request; None for a word
        this version does not know)."""
        def questions(store):
            count = store.add(self._k("ask", rank, "count"), 0)
            answered = self._answered.get(rank, set())
            out = []
            for i in range(max(0, count - 16), count):  # the latest questions: older ones timed out
                key = self._k("ask", rank, i)
                if i not in answered and store.check([key]):
                    out.append((i, AgentRequest.read(store.get(key).decode(errors="replace"))))
            return out
        return self._call(questions, default=[])

    def answer(self, rank: int, number: int, answer: dict | None) -> None:
        self._set(self._k("answer", rank, number), json.dumps(answer))
        self._answered.setdefault(rank, set()).add(number)

    # -- the watches, and the verdict ---------------------------------------------------------------------
    def join(self) -> None:
        """One more watch follows the job (the deciding one waits for each to have its verdict)."""
        self._add("watches", 1)

    def watches(self) -> int:
        return self._add("watches", 0)

    def synced(self) -> None:
        """This watch has published everything its node's ranks wrote before it joined."""
        self._add("synced", 1)

    def synced_watches(self) -> int:
        return self._add("synced", 0)

    def request_flush(self) -> int:
        """Ask every other watch to publish what its ranks wrote up to now; the request's number."""
        return self._add("flush", 1)

    def flush_requests(self) -> int:
        return self._add("flush", 0)

    def flushed(self, number: int) -> None:
        self._add(f"flushed/{number}", 1)

    def flushed_watches(self, number: int) -> int:
        return self._add(f"flushed/{number}", 0)

    def acknowledge(self) -> None:
        """This watch has the verdict: the deciding watch may exit, and the channel with it."""
        self._add("verdict-taken", 1)

    def acknowledged(self) -> int:
        return self._add("verdict-taken", 0)

    def publish_verdict(self, finding) -> None:
        self._set(self._k("verdict"), pickle.dumps(finding))

    def verdict(self):
        raw = self._get(self._k("verdict"))
        try:
            return pickle.loads(raw) if raw else None
        except Exception:  # a torn or foreign value: unpickling raises any of a dozen types
            return None


def _set(store, key: str, value) -> None:
    store.set(key, value)


def _add(store, key: str, n: int) -> int:
    return store.add(key, n)


def _debug(text: str) -> None:
    if os.environ.get("PYTEST_NCCL_WATCH_DEBUG"):
        import sys
        sys.stderr.write(f"[watch {time.time():.3f}] {text}\n")


def _decoded(raw: bytes | None):
    """A published JSON value; None when nothing (or nothing readable) was published."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _tuples(value):
    """JSON turned the progress's tuples into lists: back to tuples, so it compares as published."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _store(host: str, port: int, timeout: float, server: bool = False):
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


def announcement_key(job: str) -> str:
    """The key, in the job's store, under which the watch of rank 0's node announces the channel
    (``job``: "<run id>/<attempt>")."""
    return f"{PREFIX}/{job}/channel"


def connect(info: RankInfo, decides: Callable[[], bool], timeout: float = 5.0,
            wait: float = CONNECT_WAIT) -> Channel | None:
    """The channel between the watches of the job a rank belongs to (``info``: its rank-R.json).

    The watch of rank 0's node (``decides()``) hosts it: a store of its own, which outlives the job's
    (that one lives in a launcher, which ends with its node's job), announced under
    ``pytest-nccl-watch/<job>/channel`` in the job's store at ``MASTER_ADDR:MASTER_PORT``; every other
    watch reads the address there (for ``wait`` seconds) and connects. None when the rank named no
    store, it cannot be reached, or no watch of rank 0's node announced a channel."""
    host, port = info.master_addr, info.master_port
    if not host or not port:
        return None
    job = f"{info.run_id or 'job'}/{info.attempt or 0}"
    key = announcement_key(job)
    deadline = time.monotonic() + wait
    job_store, server = None, None
    while time.monotonic() < deadline:
        # every failure here is retried until ``wait`` passes: on a loaded host a client's connection
        # times out or is reset now and then; a job's store that went away fails each time
        try:
            with IN_TORCH.call() as allowed:
                if not allowed:  # the watch exits: no channel to open
                    return None
                job_store = job_store or _store(str(host), int(port), timeout)
                if job_store is None:
                    pass
                elif decides():
                    server = server or _store(socket.gethostname(), 0, timeout, server=True)
                    if server is not None:
                        job_store.set(key, f"{socket.gethostname()}:{server.port}")
                        return Channel(server, job)
                elif job_store.check([key]):
                    there, _, at = job_store.get(key).decode().rpartition(":")

                    def reopen(there=there, at=int(at)):
                        return _store(there, at, timeout) or _store(str(host), at, timeout)
                    store = reopen()
                    if store is not None:
                        return Channel(store, job, reopen)
        except Exception as exc:  # any store's error (by torch version): said, tried again
            _debug(f"channel: the job's store at {host}:{port}: {type(exc).__name__}: {exc}")
            job_store = None
        time.sleep(TIMING.ask_poll)
    return None
