"""What the watches of one job on several nodes say to each other, through a store found through the
one the job already has: the launcher's c10d store at ``MASTER_ADDR:MASTER_PORT`` (torchrun's agent
store, or the one rank 0 hosts under srun), which every rank reaches anyway. The watch of rank 0's
node (the deciding watch) hosts the channel's store itself and announces it there (``connect``):
the job's store ends with its launcher, and a verdict must outlive a node whose job ended first.

Summaries cross, details are asked for (docs/watch.md, "At scale"). Each other watch publishes one
summary of its node's ranks when it changed, and looks, in one call a tick, for questions to its
node; only the deciding watch reads the summaries, and asks a node for the records of its ranks
(``Details``) when a rule needs them, or for a rank's stacks when a verdict is being made. Per node
the traffic is flat in the node count. Under ``pytest-nccl-watch/<job>/``:

    info/<rank>            the rank's info (its rank-R.json), published once by its node's watch
    node/<n>/summary       node n's summary (JSON): per rank a ``RankSummary``, and the node's
                           ``beat``, raised at least every ``WatchTiming.beat_every`` (its watch lives)
    node/<n>/asks          how many questions were asked of node n; node/<n>/ask/<i>: question i (an
                           ``Ask``, pickled); node/<n>/answer/<i>: the node's answer (pickled)
    bases                  the deciding watch's window bases (JSON, group -> collectives dropped):
                           a node keeps its ranks' records from there, so asked records join up
    watches                how many watches follow the job (each adds one when it joins: its ``n``)
    synced                 how many have published their first summary (the deciding watch waits
                           for the others to be in sync before it judges)
    verdict                the deciding watch's finding (pickled), the same on every node
    verdict-taken          how many other watches have it (the deciding watch's store lives on
                           the launcher of its node: it ends that job once every watch has it)

A store error is first taken for a hiccup (a loaded host: a client's socket timed out or was reset):
the call is retried on a fresh client, ``ATTEMPTS`` times. Only when that fails too, or no fresh
client can be had (nothing listens at the store's address), is the channel lost (the deciding
watch, which hosts the store, ended): every call then answers "nothing", and the watch goes on with
what it sees itself; the other nodes' ranks it could no longer follow are unseen
(``RankState.UNSEEN``), never evidence about the job (``Monitor``).
"""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from ...core.jobdir import RankInfo
from ...core.messages import AgentRequest
from ..debug import debug as _debug
from ..timing import TIMING
from .channel_store import IN_TORCH, STATS, Counted, make_store

PREFIX = "pytest-nccl-watch"
ATTEMPTS = 4            # tries of one store call, each on a fresh client after the first failure
# how long a watch waits for the channel to come up (its own import of torch, the other watches' and
# the announcement in the job's store): seconds on an idle host, tens of seconds on a loaded one
CONNECT_WAIT = 30.0
RECENT_ASKS = 16        # questions a node looks at: older ones timed out
VALUE_MAX = 4 << 20     # bytes of one value this channel sets at most (TCPStore refuses past 8 MiB)
VERDICT_RECORDS = 40    # records per rank a verdict past VALUE_MAX keeps (the report shows fewer)


@dataclass
class RankSummary:
    """What the deciding watch follows of another node's rank every tick: its progress (journal
    bytes read, the Flight Recorder's per-group progress), collectives entered per group, and how
    it ended (its ``RankReport`` JSON)."""
    consumed: int = 0
    counts: dict = field(default_factory=dict)
    fr: tuple | None = None
    exit: str | None = None

    @classmethod
    def decode(cls, data) -> RankSummary | None:
        if not isinstance(data, dict):
            return None
        return cls(int(data.get("consumed") or 0), dict(data.get("counts") or {}), _tuples(data.get("fr")),
                   data.get("exit"))


@dataclass
class NodeSummary:
    """A node's summary: its ranks', its watch's heartbeat, and whether that watch closed (its last
    records are under ``final``: it answers no more questions)."""
    beat: int
    ranks: dict[int, RankSummary]
    closed: bool = False


@dataclass
class Ask:
    """A question to a node: the answers of its ranks ``agents_of``'s agents to ``request``, rank ->
    answer; or the records of its ranks ``details_of`` after ``bases`` (the asker's window), rank ->
    ``Details``."""
    request: AgentRequest | None = None
    agents_of: tuple = ()
    details_of: tuple = ()
    bases: dict = field(default_factory=dict)


@dataclass
class Details:
    """A rank's records as its node holds them (numbered from the journal's start: ``before`` 0),
    with the summary they go with."""
    records: list
    summary: RankSummary


class Channel:
    """The keys of one job in a store (anything with torch's Store methods: set, get, check, add,
    delete_key; ``multi_get`` where the store has it). ``reopen``: a fresh client of the same store
    (None when it cannot be had), to retry a call that failed on this one."""

    def __init__(self, store, job: str, reopen: Callable[[], object] | None = None):
        self.store, self.prefix = Counted(store), f"{PREFIX}/{job}/"
        self.reopen = reopen
        self.lost = False
        self.errors = 0       # store calls that failed and were retried (PYTEST_NCCL_WATCH_DEBUG says each)
        self._lock = threading.Lock()   # one client: the monitor's thread and the relay's share it
        self._answered: set = set()     # numbers of the questions this watch answered
        self._published: dict = {}      # key -> the value this watch set last (set again only when changed)
        self._present: set = set()      # keys seen to exist (``multi_get`` waits for a missing one)

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
                        self.store = Counted(fresh)
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

    def _set_changed(self, key: str, value: bytes | str) -> None:
        if self._published.get(key) != value:
            self._set(key, value)
            self._published[key] = value

    def _add(self, name: str, n: int) -> int:
        """The counter ``name`` of the job, raised by ``n`` (0: read)."""
        return self._call(_add, self._k(name), n, default=0)

    def _get_many(self, keys: list) -> list:
        """The values of ``keys`` (None for a missing one) in one call where the store can."""
        def get_many(store):
            unknown = [k for k in keys if k not in self._present]
            if unknown and not hasattr(store, "multi_get"):
                return [store.get(k) if store.check([k]) else None for k in keys]
            for k in unknown:  # once per key: multi_get would wait for a missing one
                if store.check([k]):
                    self._present.add(k)
            present = [k for k in keys if k in self._present]
            values = dict(zip(present, store.multi_get(present), strict=True)) if present else {}
            return [values.get(k) for k in keys]
        return self._call(get_many, default=[None] * len(keys))

    # -- ranks ----------------------------------------------------------------------------------------
    def publish_info(self, rank: int, info: dict) -> None:
        self._set(self._k("info", rank), json.dumps(info))

    def info(self, rank: int) -> dict | None:
        return _decoded(self._get(self._k("info", rank)))

    # -- summaries: every other node publishes, the deciding watch reads --------------------------------
    def publish_summary(self, node: int, ranks: dict[int, RankSummary], beat: int = 0, closed: bool = False) -> None:
        """Node ``node``'s summary of its ranks, set only when it changed since this watch's last."""
        self._set_changed(self._k("node", node, "summary"), json.dumps(
            {"beat": beat, "closed": closed, "ranks": {str(r): asdict(s) for r, s in sorted(ranks.items())}}))

    def publish_final(self, node: int, details: dict) -> None:
        """A closing watch's last records of its ranks (rank -> ``Details``): what it would have answered."""
        self._set(self._k("node", node, "final"), _packed(details))

    def final(self, node: int) -> dict:
        value = _unpacked(self._get(self._k("node", node, "final")))
        return value if isinstance(value, dict) else {}

    def summaries(self, nodes: list[int]) -> dict[int, NodeSummary]:
        """node -> its summary, for the nodes that published one (one call)."""
        out: dict = {}
        for node, raw in zip(nodes, self._get_many([self._k("node", n, "summary") for n in nodes]), strict=True):
            value = _decoded(raw)
            if isinstance(value, dict) and isinstance(value.get("ranks"), dict):
                ranks = {int(r): s for r, d in value["ranks"].items() if (s := RankSummary.decode(d)) is not None}
                out[node] = NodeSummary(int(value.get("beat") or 0), ranks, bool(value.get("closed")))
        return out

    def publish_bases(self, bases: dict) -> None:
        self._set_changed(self._k("bases"), json.dumps(bases, sort_keys=True))

    # -- questions to a node, answered by its watch (its ranks' agents, or its records) -----------------
    def ask(self, node: int, question: Ask, timeout: float):
        """Node ``node``'s answer to ``question``; None when none came within ``timeout``."""
        def ask(store):
            n = store.add(self._k("node", node, "asks"), 1) - 1
            store.set(self._k("node", node, "ask", n), _packed(question))
            return n
        n = self._call(ask)
        if n is None:
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.lost:
            raw = self._get(self._k("node", node, "answer", n))
            if raw is not None:
                return _unpacked(raw)
            time.sleep(TIMING.ask_poll)
        return None

    def questions(self, node: int) -> tuple[list[tuple[int, Ask]], dict]:
        """(questions to ``node`` this watch did not answer yet: (number, ``Ask``), the deciding
        watch's window bases): one call when there is no question."""
        def questions(store):
            count_key, bases_key = self._k("node", node, "asks"), self._k("bases")
            if hasattr(store, "multi_get"):
                count, bases = store.multi_get([count_key, bases_key])
            else:
                count, bases = store.get(count_key), store.get(bases_key)
            out = []
            for i in range(max(0, int(count) - RECENT_ASKS), int(count)):
                key = self._k("node", node, "ask", i)
                if i not in self._answered and store.check([key]):
                    question = _unpacked(store.get(key))
                    if isinstance(question, Ask):
                        out.append((i, question))
            return out, _decoded(bases) or {}
        return self._call(questions, default=([], {}))

    def answer(self, node: int, number: int, answer) -> None:
        self._set(self._k("node", node, "answer", number), _packed(answer))
        self._answered.add(number)

    # -- the watches, and the verdict ---------------------------------------------------------------------
    def join(self) -> int:
        """One more watch follows the job: its node's number (the deciding watch waits for each to
        have its verdict). Its question counter exists from here on (``questions`` reads it)."""
        node = self._add("watches", 1)
        self._call(_add, self._k("node", node, "asks"), 0)
        return node

    def watches(self) -> int:
        return self._add("watches", 0)

    def synced(self) -> None:
        """This watch has published its first summary."""
        self._add("synced", 1)

    def synced_watches(self) -> int:
        return self._add("synced", 0)

    def acknowledge(self) -> None:
        """This watch has the verdict: the deciding watch may exit, and the channel with it."""
        self._add("verdict-taken", 1)

    def acknowledged(self) -> int:
        return self._add("verdict-taken", 0)

    def publish_verdict(self, finding) -> None:
        """The deciding watch's finding (``CallOutcome``): whole when it fits a store value; else
        with each rank's last ``VERDICT_RECORDS`` records and no Flight Recorder dumps (hundreds of
        ranks' windows passed the 8 MiB a value may hold: the verdict never reached the others)."""
        packed = _packed(finding)
        if len(packed) > VALUE_MAX:
            packed = _packed(replace(finding, fr_json={}, fr_pickle={}, views=[
                replace(v, records=v.records[-VERDICT_RECORDS:]) for v in finding.views]))
        self._set(self._k("verdict"), packed)

    def verdict(self):
        return _unpacked(self._get(self._k("verdict")))


def _set(store, key: str, value) -> None:
    store.set(key, value)


def _add(store, key: str, n: int) -> int:
    return store.add(key, n)


def _decoded(raw: bytes | None):
    """A published JSON value; None when nothing (or nothing readable) was published."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _packed(value) -> bytes:
    """A value pickled and compressed: a store's value is at most 8 MiB (TCPStore resets the
    connection past that), and records compress tenfold."""
    return zlib.compress(pickle.dumps(value), 1)


def _unpacked(raw: bytes | None):
    try:
        return pickle.loads(zlib.decompress(raw)) if raw else None
    except Exception:  # a torn or foreign value: unpickling raises any of a dozen types
        return None


def _tuples(value):
    """JSON turned the progress's tuples into lists: back to tuples, so it compares as published."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


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
                job_store = job_store or make_store(str(host), int(port), timeout)
                if job_store is None:
                    pass
                elif decides():
                    server = server or make_store(socket.gethostname(), 0, timeout, server=True)
                    if server is not None:
                        channel = Channel(server, job)
                        channel.publish_bases({})  # before another watch reads it (``questions``)
                        STATS.decides = True
                        job_store.set(key, f"{socket.gethostname()}:{server.port}")
                        return channel
                elif job_store.check([key]):
                    there, _, at = job_store.get(key).decode().rpartition(":")

                    def reopen(there=there, at=int(at)):
                        return make_store(there, at, timeout) or make_store(str(host), at, timeout)
                    store = reopen()
                    if store is not None:
                        return Channel(store, job, reopen)
        except Exception as exc:  # any store's error (by torch version): said, tried again
            _debug(f"channel: the job's store at {host}:{port}: {type(exc).__name__}: {exc}")
            job_store = None
        time.sleep(TIMING.ask_poll)
    return None
