"""One verdict for a vLLM side group followed by several watches (issue 46): ``trl vllm-serve``'s
workers under one ``pytest-nccl watch`` and the trainer under another, or members on several hosts,
each host's watch seeing its own. Every member reaches the group's store (``StatelessProcessGroup``'s
TCPStore at HOST:PORT), hence every watch's host: the watches meet there, under ``PREFIX``.

What is decided here, pure and tested on data (tests/test_side_join.py); the store's I/O is
``watch/engine/sidejoin.py``:

- what a watch publishes of its members (``Published``: their notes and whether their processes
  run, with a beat that says the watch lives) and how it reads back;
- how the others' notes merge with a watch's own (``merge``): per member the newest note, a watch
  that closed counts with its processes ended, one that stopped publishing (``Heard``: silent for
  ``SILENT_AFTER``) does not count at all: where its members were last seen is no evidence;
- the one verdict: the first watch to put its verdict in the store decides for all (``Shared``,
  an atomic compare-and-set); when each watch ends its command on it (``may_end``: the store's
  host last).

Keys under ``PREFIX`` (vLLM's own are ``broadcast_from/``, ``send_to/``, ``arrival_``, ...):

    watches        the watches that publish here, one id a line (``store.append``)
    watch/<id>     a watch's ``Published`` record (compact JSON), set when it changed or its beat is due
    verdict        ``NO_VERDICT`` until a watch decided; then its ``Shared`` verdict (JSON)
    verdict-taken  how many other watches took the verdict (``store.add``)
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields

from .sidecalls import WILDCARDS, SideCall, SideVerdict, group_key

PREFIX = "pytest-nccl/side/"
WATCHES, VERDICT, TAKEN = PREFIX + "watches", PREFIX + "verdict", PREFIX + "verdict-taken"
NO_VERDICT = "-"        # the verdict key's value until a watch decided (it exists from the first join:
                        # a read of every key in one call waits for a missing one)
BEAT = 1.0              # a watch's record is set at least this often (seconds): it lives
# ... and a watch whose record did not change for this long stopped (killed with its command, or its
# host hung): its notes are no evidence (as a node's watch silent that long is, ``WatchTiming``)
SILENT_AFTER = 10.0
ACK_WAIT = 5.0          # how long the deciding watch waits for the others to take its verdict
_DEFAULTS = {f.name: f.default for f in fields(SideCall)}


def watch_key(watch: str) -> str:
    return f"{PREFIX}watch/{watch}"


class Peer(enum.Enum):
    """How another watch of the group stands, as this watch last heard it."""
    LIVE = "live"        # its record's beat moves: its notes are where its members are
    CLOSED = "closed"    # it ended with its command: its last notes stand, its processes ended
    SILENT = "silent"    # no beat for ``SILENT_AFTER``: its notes are no evidence (left out)


@dataclass
class Published:
    """A watch's record in the group's store: its members' notes of this group, whether each one's
    process runs (pid -> bool), its beat (raised every ``BEAT``), and whether it closed."""
    watch: str
    notes: list = field(default_factory=list)
    alive: dict = field(default_factory=dict)
    beat: int = 0
    closed: bool = False

    def encode(self) -> str:
        """Compact JSON: a note's fields at their default left out."""
        notes = [{k: v for k, v in asdict(n).items() if v != _DEFAULTS.get(k)} | {"a": self.alive.get(n.pid, True)}
                 for n in self.notes]
        return json.dumps({"w": self.watch, "b": self.beat, "c": self.closed, "n": notes}, separators=(",", ":"))

    @classmethod
    def decode(cls, raw) -> Published | None:
        """From a stored value; None when it is not one (torn, foreign)."""
        try:
            data = json.loads(raw)
            notes, alive = [], {}
            for d in data["n"]:
                note = SideCall.decode(d)
                if note is not None:
                    notes.append(note)
                    alive[note.pid] = bool(d.get("a", True))
            return cls(str(data["w"]), notes, alive, int(data["b"]), bool(data["c"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@dataclass(frozen=True)
class Shared:
    """The group's one verdict, as the watch that decided it (``watch``) put it in the store."""
    watch: str
    verdict: SideVerdict

    def encode(self) -> str:
        v = self.verdict
        return json.dumps({"w": self.watch, "h": v.headline, "r": v.report, "g": list(v.group)},
                          separators=(",", ":"))

    @classmethod
    def decode(cls, raw) -> Shared | None:
        """None for ``NO_VERDICT``, or a value that is no verdict."""
        try:
            data = json.loads(raw)
            return cls(str(data["w"]), SideVerdict(str(data["h"]), str(data["r"]), tuple(data["g"])))
        except (ValueError, TypeError, KeyError):
            return None


class Heard:
    """When this watch last saw each other watch's beat move (its own monotonic clock: hosts' clocks
    differ, and a beat is a count, not a time)."""

    def __init__(self):
        self._last: dict[str, tuple[int, float]] = {}

    def peer(self, record: Published, now: float) -> Peer:
        if record.closed:
            return Peer.CLOSED
        beat, at = self._last.get(record.watch, (None, now))
        if beat != record.beat:
            self._last[record.watch] = (record.beat, now)
            return Peer.LIVE
        return Peer.SILENT if now - at >= SILENT_AFTER else Peer.LIVE


def merge(own: list, own_alive: dict, others: list) -> tuple[list, dict]:
    """The notes a watch judges (and whether each one's process runs, pid -> bool): its own with
    the other watches' (``others``: (``Published``, ``Peer``)). Per member of a group, the newest
    note (``since``) wins, this watch's own on a tie: a member present on both sides is one process
    seen twice, or a restarted one. A silent watch's notes are left out (its members are then not
    seen, as without the join); a closed watch's members' processes ended with its command."""
    held: dict = {}
    for n in own:
        held[(group_key(n), n.member)] = (n, own_alive.get(n.pid, True))
    for record, peer in others:
        if peer == Peer.SILENT:
            continue
        for n in record.notes:
            key = (group_key(n), n.member)
            if key not in held or n.since > held[key][0].since:
                held[key] = (n, record.alive.get(n.pid, True) and peer != Peer.CLOSED)
    notes = [n for n, _ in held.values()]
    alive = dict(own_alive)
    for n, runs in held.values():
        # pids of other hosts may repeat one here (rare): this host's own process keeps its word
        alive.setdefault(n.pid, runs)
    return notes, alive


def live_others(others: list) -> int:
    """How many other watches live (``others``: (``Published``, ``Peer``)): those the deciding
    watch waits for to take its verdict."""
    return sum(peer == Peer.LIVE for _, peer in others)


def may_end(*, decided_here: bool, hosts_store: bool, taken: int, live: int, waited: float) -> bool:
    """A watch that has the group's verdict (``waited``: seconds since) may end its command. The one
    whose members host the group's store (its member 0) ends last, once no other watch lives: a
    member of another command whose store went first would fail in its call and print the store's
    error before its own watch ends it. Else the deciding watch waits for every live other watch
    to take its verdict (``taken`` of ``live``); one that took it ends at once. ``ACK_WAIT`` bounds
    each wait: a watch that never answers decides on what it sees."""
    if waited >= ACK_WAIT:
        return True
    if hosts_store:
        return live == 0
    return taken >= live or not decided_here


def address(notes: list) -> tuple[str, int] | None:
    """Where a watch reaches a group's store, from its members' notes: the address a member named
    (a client names the server's host), else this host's loopback (a server listening on every
    address: its note is of this host). None: no port."""
    named = [n.store for n in notes if n.store and not n.store.startswith(WILDCARDS)]
    store = (named or [n.store for n in notes if n.store] or [""])[0]
    host, _, port = store.rpartition(":")
    if not port.isdigit():
        return None
    if not named:
        host = "::1" if host == "[::]" else "127.0.0.1"
    return host.strip("[]"), int(port)
