"""The store I/O under ``core.sidejoin``: this watch in the stores of the vLLM groups its members
belong to, through one background thread (it imports torch and makes every store call: the watch's
loop never waits on a store). The loop hands it this watch's notes (``offer``) and reads what it
last heard (``others``, ``stored``, ``answer``, ``taken``); it asks for the verdict to be put in the
store (``propose``) or taken (``acknowledge``).

Per round (``ROUND``) and group: the record set when it changed or its beat is due (one call), the
other watches' records, the verdict and its takers read (one call: every key read exists). A
store that cannot be reached (its host process, the group's member 0, ended) leaves this watch with
its own notes, as without the join, and nothing said (``PYTEST_NCCL_WATCH_DEBUG`` says it).
Nothing outlives the watch: ``close`` publishes the watch's last record, ends the thread and drops
the clients; a store call under way at the interpreter's exit is waited for (``IN_TORCH``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any

from ...core.sidecalls import group_key
from ...core.sidejoin import (
    BEAT,
    NO_VERDICT,
    TAKEN,
    VERDICT,
    WATCHES,
    Published,
    Shared,
    address,
    watch_key,
)
from ..debug import debug as _debug
from .channel_store import IN_TORCH, make_store

ROUND = 0.2             # seconds between two rounds of store calls
CONNECT_EVERY = 1.0     # a store not reached yet (its member still binding it) is tried again after
CLIENT_TIMEOUT = 5.0    # a store call's bound (a store whose host hangs)
CLOSE_WAIT = 2.0        # at the watch's end, for its last record to be set


class _Link:
    """This watch in one group's store. The loop's fields (``record``, ``proposal``, ``ack``) and
    the thread's (the rest) are read and set under ``SideJoin.lock``."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.store: Any = None        # a TCPStore client of the group's store, None: not reached now
        self.registered = False
        self.ever = False            # reached once: failing to reach it again means its host ended
        self.next_try = 0.0
        self.record: Published | None = None   # the loop's latest, to publish
        self.proposal: Shared | None = None    # the loop's verdict, to put in the store
        self.ack = False                       # the loop took another watch's verdict
        self.sent = ""                         # the record's text set last
        self.sent_at = 0.0
        self.beat = 0
        self.others: list[Published] = []      # the other watches' records, as last read
        self.stored: Shared | None = None      # the verdict in the store
        self.answer: Shared | None = None      # the store's answer to ``proposal``
        self.taken = 0
        self.acked = False

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


class SideJoin:
    """This watch's links to its vLLM groups' stores (``core.sidejoin``), kept by one thread."""

    def __init__(self):
        self.watch = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lock = threading.Lock()
        self.links: dict[tuple, _Link] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    # -- the watch's loop ---------------------------------------------------------------------------
    def offer(self, own: list, alive: dict, closed: bool = False) -> None:
        """This watch's notes now (``alive``: pid -> its process runs), per group to publish."""
        groups: dict = {}
        for n in own:
            if n.store and n.world > 0:
                groups.setdefault(group_key(n), []).append(n)
        with self.lock:
            for key, notes in groups.items():
                link = self.links.get(key)
                if link is None and not closed and (where := address(notes)) is not None:
                    link = self.links[key] = _Link(*where)
                if link is not None:
                    link.record = Published(self.watch, notes, {n.pid: alive.get(n.pid, True) for n in notes},
                                            closed=closed)
        if self.links and self.thread is None and not closed:
            self.thread = threading.Thread(target=self._run, name="pytest-nccl-side-join", daemon=True)
            self.thread.start()

    def joined(self, key: tuple) -> bool:
        """This watch publishes in the group's store now."""
        with self.lock:
            link = self.links.get(key)
            return link is not None and link.store is not None and link.registered

    def others(self) -> list[Published]:
        """The other watches' records, of every group this watch reached."""
        with self.lock:
            return [r for link in self.links.values() for r in link.others]

    def stored(self) -> Shared | None:
        """A verdict another watch put in one of the stores."""
        with self.lock:
            return next((link.stored for link in self.links.values()
                         if link.stored is not None and link.stored.watch != self.watch), None)

    def propose(self, shared: Shared) -> None:
        with self.lock:
            if (link := self.links.get(shared.verdict.group)) is not None:
                link.proposal = link.proposal or shared

    def answer(self, key: tuple) -> Shared | None:
        """The store's verdict once the proposal was made (this watch's, or one put there first)."""
        with self.lock:
            link = self.links.get(key)
            return link.answer if link is not None else None

    def taken(self, key: tuple) -> int:
        with self.lock:
            link = self.links.get(key)
            return link.taken if link is not None else 0

    def acknowledge(self) -> None:
        """This watch took the verdict another one put in the store."""
        with self.lock:
            for link in self.links.values():
                link.ack = link.ack or (link.stored is not None and link.stored.watch != self.watch)

    def close(self, own: list, alive: dict) -> None:
        """The watch ends: its last record (closed) set where it publishes, the thread ended, the
        clients dropped."""
        if self.thread is None:
            return
        self.offer(own, alive, closed=True)
        self.stop.set()
        self.thread.join(CLOSE_WAIT)
        with self.lock:
            for link in self.links.values():
                link.store = None

    # -- the thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            final = self.stop.is_set()  # the watch closes: its last record, then no more calls
            with self.lock:
                links = list(self.links.values())
            for link in links:
                self._round(link, final)
            if final:
                return
            self.stop.wait(ROUND)

    def _round(self, link: _Link, final: bool = False) -> None:
        now = time.monotonic()
        if link.store is None:
            if final or now < link.next_try:
                return
            link.next_try = now + CONNECT_EVERY
            store = make_store(link.host, link.port, CLIENT_TIMEOUT)
            with self.lock:
                if store is None:
                    if link.ever and (link.others or link.stored):
                        _debug(f"side group {link.name}: its store is gone; on with this watch's notes")
                    link.others, link.stored = [], None
                    return
                link.store, link.registered, link.ever = store, False, True
        try:
            with IN_TORCH.call() as allowed:
                if allowed:
                    self._exchange(link, now, final)
        except Exception as exc:  # a hiccup, or the store's host ended: tried again on a fresh client
            _debug(f"side group {link.name}: {type(exc).__name__}: {exc}")
            with self.lock:
                link.store = None

    def _exchange(self, link: _Link, now: float, final: bool) -> None:
        with self.lock:
            record, proposal, ack = link.record, link.proposal, link.ack and not link.acked
        store = link.store
        if record is None or store is None:
            return
        if now - link.sent_at >= BEAT:
            link.beat += 1
        record.beat = link.beat
        text = record.encode()
        if text != link.sent:
            store.set(watch_key(self.watch), text)
            link.sent, link.sent_at = text, now
        if not link.registered:
            store.append(WATCHES, self.watch + "\n")
            store.compare_set(VERDICT, "", NO_VERDICT)
            store.add(TAKEN, 0)
            link.registered = True
            _debug(f"side group {link.name}: this watch publishes there as {self.watch}")
        if final:
            return
        answer = Shared.decode(store.compare_set(VERDICT, NO_VERDICT, proposal.encode())) if proposal else None
        if ack:
            store.add(TAKEN, 1)
        with self.lock:
            known = [r.watch for r in link.others]
        raw = store.multi_get([WATCHES, VERDICT, TAKEN, *[watch_key(w) for w in known]])
        ids = [w for w in raw[0].decode().split() if w != self.watch]
        others = [r for r in map(Published.decode, raw[3:]) if r is not None]
        others += [Published(w) for w in ids if w not in known]  # read next round (its key exists)
        with self.lock:
            if len(others) != len(link.others):
                _debug(f"side group {link.name}: {len(others) + 1} watches publish there")
            link.others = others
            link.stored = Shared.decode(raw[1])
            link.taken = int(raw[2])
            link.answer = link.answer or answer
            link.acked = link.acked or ack
