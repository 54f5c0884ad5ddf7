"""Groups outside c10d traced at their Python surface (vLLM's ``StatelessProcessGroup`` and the
``PyNcclCommunicator`` over it: TRL's GRPO server mode syncs weights through them): the note each
member keeps of where it is in the group (``SideCall``, a ``sidecall-PID-N.json`` file of the watch,
written by ``rank/trace_vllm.py``), and the one rule that turns the notes of a group into a verdict
(``judge``). Pure: tested on data (tests/test_watch_vllm.py).

A member's calls on one group are numbered in its own order (1, 2, ...): healthy members make the
same calls in the same order, as ranks make collectives, so "#n" compares across members.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields


class CallState(enum.Enum):
    """Where a member of a side group is."""
    CREATING = "creating"    # in the group's creation (its store's rendezvous)
    IN_CALL = "in-call"      # inside call ``seq`` of the group
    IN_FLIGHT = "in-flight"  # call ``seq`` returned, its work not complete on the CUDA stream yet
    IDLE = "idle"            # outside the group, after call ``seq`` (0: none yet)
    FAILED = "failed"        # call ``seq`` raised ``error`` (a store barrier's own timeout)


# seconds a member's raised call stays its last word before it is a verdict: code that catches the
# error and calls the group again (a retry) is no failure (the referee's grace for a rank that raised)
FAILED_GRACE = 1.0
LIBRARY = "vLLM's weight-sync group"  # how a headline names the group (with its store)
# a member this watch has no note of, once the group was made: it connected, elsewhere (the other
# command of a trainer and a server each under its own watch, when their watches could not share
# their notes through the group's store: ``core.sidejoin``); said, never taken as absent
UNSEEN = "not seen by this watch (a process of another command or node)"
WILDCARDS = ("0.0.0.0:", "[::]:", ":")  # a server's listening address (TRL's workers): not the group's name


@dataclass
class SideCall:
    """One member's note of one side group: ``state`` since ``since`` (wall clock), in or after
    call ``seq`` (``op`` with ``detail``: shapes, dtype, root or peer) from ``site``."""
    pid: int = 0
    start: int | None = None     # ``jobdir.process_start(pid)``: a note of a pid reused is not its
    host: str = ""
    store: str = ""              # the group's store, host:port: the group's name
    world: int = 0
    member: int = 0              # this member's rank in the group
    state: str = CallState.IDLE.value
    since: float = 0.0
    seq: int = 0
    op: str = ""
    detail: str = ""
    site: str = ""
    created_at: str = ""         # the line that created the group
    error: str = ""

    @property
    def where(self) -> CallState:
        return next((s for s in CallState if s.value == self.state), CallState.IDLE)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def decode(cls, data) -> SideCall | None:
        """From the note's JSON object; None when it is not one."""
        if not isinstance(data, dict):
            return None
        known = {f.name: f.type for f in fields(cls)}
        try:
            note = cls(**{k: v for k, v in data.items() if k in known})
            note.world, note.member, note.seq = int(note.world), int(note.member), int(note.seq)
            note.since = float(note.since)
        except (TypeError, ValueError):
            return None
        return note


@dataclass(frozen=True)
class SideVerdict:
    """A side group's verdict: its one line, the report (where each member is), and the group's key
    (``group_key``: the verdict a watch shares with the other watches of the group)."""
    headline: str
    report: str
    group: tuple = ()


def _call(n: SideCall) -> str:
    return f"{n.op} #{n.seq}"


def _place(n: SideCall, alive: bool) -> str:
    """Where a member is, in words."""
    where = n.where
    site = f" from {n.site}" if n.site else ""
    if where == CallState.CREATING:
        return f"still in the group's creation{f' at {n.created_at}' if n.created_at else ''}"
    if where == CallState.IN_CALL:
        return f"in {_call(n)}{' ' + n.detail if n.detail else ''}{site}"
    if where == CallState.IN_FLIGHT:
        return f"behind {_call(n)} on its CUDA stream (returned, not complete){site}"
    if where == CallState.FAILED:
        return f"raised in {_call(n)}{site}: {n.error}"
    after = f"after {_call(n)}{site}" if n.seq else "before its first call"
    return f"{'outside the group' if alive else 'gone (its process ended)'} {after}"


def _shown(ranks) -> str:
    ranks = sorted(ranks)
    return ",".join(map(str, ranks[:8])) + (",..." if len(ranks) > 8 else "")


def _members(ranks) -> str:
    return f"member{'s' if len(ranks) > 1 else ''} {_shown(ranks)}"


def _report(headline: str, group: str, notes: list, alive: dict) -> SideVerdict:
    lines = [headline, "", f"-- where each member of {group} is --"]
    lines += [f"  member {n.member} (pid {n.pid}): {_place(n, alive.get(n.pid, True))}" for n in notes]
    return SideVerdict(headline, "\n".join(lines), group_key(notes[0]))


class Stall(enum.Enum):
    """How a side group in which nothing moved for a while stands (``_stalled``)."""
    NEVER_CONNECTED = "never connected"   # members with no note while others wait in the creation
    NEVER_ENTERED = "never entered"       # a call some member never entered
    UNSEEN = "unseen"                     # the others are followed elsewhere: where they are is not known here
    NONE_COMPLETED = "none completed"     # every member in (or past) the call, none came out


@dataclass(frozen=True)
class _Stalled:
    """A stall's facts: ``first`` the call waited in (None: the creation), the members inside it,
    those that never entered it (their notes), and the members this watch has no note of."""
    how: Stall
    first: SideCall | None
    inside: list
    missing: list
    absent: list


def group_key(n: SideCall) -> tuple:
    """The group a note belongs to: its store's port and its size. Not the whole address: a server
    listening on every address (``0.0.0.0:P``) and its clients (``HOST:P``) name one store apart."""
    return n.store.rsplit(":", 1)[-1], n.world


def _groups(notes: list):
    """(the group's name, its size, its members' notes by member), per group."""
    groups: dict = {}
    for n in notes:  # one host's notes, or one store's watches': a port names one store
        if n.store and n.world > 0:
            groups.setdefault(group_key(n), {})[n.member] = n
    for _, by_member in sorted(groups.items()):
        members = [by_member[m] for m in sorted(by_member)]
        named = [n.store for n in members if not n.store.startswith(WILDCARDS)]
        yield f"{LIBRARY} at {(named or [members[0].store])[0]}", members[0].world, members


def judge(notes: list, now: float, timeout: float, alive: dict | None = None) -> SideVerdict | None:
    """The first verdict of any group in ``notes`` (``now``: wall clock; ``alive``: pid -> its process
    still runs). Per group, in order: a member's call raised (its store barrier timed out: once it
    made no other call for ``FAILED_GRACE``, or its process ended);
    members that never connected; a call some member never entered, or that no member completed,
    once nothing moved in the group for ``timeout`` seconds. None: keep waiting."""
    alive = alive or {}
    for group, world, members in _groups(notes):
        found = _failed(group, world, members, now, alive)
        if found is None and (stalled := _stalled(world, members, now, timeout)) is not None:
            found = _report(_verdict_line(group, world, members, stalled, timeout, alive), group, members, alive)
        if found is not None:
            return found
    return None


def notice(notes: list, now: float, after: float, timeout: float, said: set, alive: dict | None = None) -> str | None:
    """The line, once per group (``said``: the groups said, updated), for a group in which nothing
    moved for ``after`` seconds while a member waits (what ``judge`` calls a verdict at ``timeout``):
    not a verdict, since a member may only be slow (an engine loading a model, a long generation)."""
    alive = alive or {}
    for group, world, members in _groups(notes):
        if group in said or _failed(group, world, members, now, alive) is not None:
            continue
        if (stalled := _stalled(world, members, now, after)) is not None:
            said.add(group)
            return _notice_line(group, world, members, stalled, after, timeout, alive)
    return None


def _failed(group: str, world: int, notes: list, now: float, alive: dict) -> SideVerdict | None:
    failed = next((n for n in notes if n.where == CallState.FAILED
                   and (now - n.since >= FAILED_GRACE or not alive.get(n.pid, True))), None)
    if failed is None:
        return None
    missing = [n for n in notes if n is not failed and not _entered(n, failed)]
    absent = [m for m in range(world) if m not in {n.member for n in notes}]
    outside = f"; {_members([n.member for n in missing] + absent)} never entered it (" + "; ".join(
        [f"{n.member}: {_place(n, alive.get(n.pid, True))}" for n in missing] +
        [f"{m}: {UNSEEN}" for m in absent]) + ")" if missing or absent else ""
    head = (f"{_call(failed)} of {group} failed on member {failed.member}: {failed.error}"
            f"{f' (from {failed.site})' if failed.site else ''}{outside}")
    return _report(head, group, notes, alive)


def _stalled(world: int, notes: list, now: float, bound: float) -> _Stalled | None:
    """The group's stall once nothing moved in it for ``bound`` seconds while a member waits; None:
    it moves, nobody waits, or its members are all there and only the store is slow."""
    quiet = now - max(n.since for n in notes)
    waiting = [n for n in notes if n.where in (CallState.CREATING, CallState.IN_CALL)]
    if not waiting or quiet < bound:
        return None
    absent = [m for m in range(world) if m not in {n.member for n in notes}]
    if absent and any(n.where == CallState.CREATING for n in notes):
        return _Stalled(Stall.NEVER_CONNECTED, None, [], [], absent)
    first = min((n for n in waiting if n.where == CallState.IN_CALL), key=lambda n: (n.seq, n.member), default=None)
    if first is None:
        return None  # every member present, some still creating: the store is only slow
    inside = [n for n in notes if n.where == CallState.IN_CALL and (n.seq, n.op) == (first.seq, first.op)]
    missing = [n for n in notes if not _entered(n, first)]
    how = Stall.NEVER_ENTERED if missing else Stall.UNSEEN if absent else Stall.NONE_COMPLETED
    return _Stalled(how, first, inside, missing, absent)


def _in_call(s: _Stalled, waited: str, group: str = "") -> str:
    """'members 0,1 waited 8 s (--timeout) with no progress in broadcast #4 [of GROUP] [4] float32 src=2
    from SITE'."""
    first = s.first
    assert first is not None
    return (f"{_members([n.member for n in s.inside])} waited {waited} with no progress in {_call(first)}"
            f"{f' of {group}' if group else ''}{' ' + first.detail if first.detail else ''}"
            f"{f' from {first.site}' if first.site else ''}")


def _unseen(s: _Stalled) -> str:
    return f"; {_members(s.absent)} {'are' if len(s.absent) > 1 else 'is'} {UNSEEN}" if s.absent else ""


def _places(s: _Stalled, alive: dict) -> str:
    return "; ".join(f"member {n.member} is {_place(n, alive.get(n.pid, True))}" for n in s.missing)


def _verdict_line(group: str, world: int, notes: list, s: _Stalled, timeout: float, alive: dict) -> str:
    if s.how == Stall.NEVER_CONNECTED:
        created = next((n.created_at for n in notes if n.created_at), "")
        pids = ", ".join(f"{n.member}: pid {n.pid}" for n in notes[:8])
        return (f"{len(notes)} of {world} members joined {group}; {_members(s.absent)} never connected "
                f"(the others waited {timeout:g} s, --timeout: {pids}){f'; created at {created}' if created else ''}")
    assert s.first is not None
    waited = f"{timeout:g} s (--timeout)"
    if s.how == Stall.NEVER_ENTERED:
        return (f"{_members([n.member for n in s.missing])} never entered {_call(s.first)} of {group}: "
                f"{_places(s, alive)}; {_in_call(s, waited)}{_unseen(s)}")
    if s.how == Stall.UNSEEN:
        return f"{_in_call(s, waited, group)}{_unseen(s)}"
    return f"no member completed {_call(s.first)} of {group}: {_in_call(s, waited)}"


def _notice_line(group: str, world: int, notes: list, s: _Stalled, after: float, timeout: float,
                 alive: dict) -> str:
    """As the verdict will read, said at ``after`` seconds, with when the verdict comes (c10d side
    groups' notice: ``watch.engine.outcome.side_group_notice``)."""
    many = len(s.absent) > 1 if s.how == Stall.NEVER_CONNECTED else len(s.missing) > 1
    if s.how == Stall.NEVER_CONNECTED:
        created = next((n.created_at for n in notes if n.created_at), "")
        return (f"{len(notes)} of {world} members joined {group}; {_members(s.absent)} not connected after "
                f"{after:g} s{f'; created at {created}' if created else ''}; a verdict at --timeout "
                f"({timeout:g} s) unless {'they connect' if many else 'it connects'}")
    assert s.first is not None
    waited, unless = f"{after:g} s", f"; a verdict at --timeout ({timeout:g} s) unless the group moves on"
    if s.how == Stall.NEVER_ENTERED:
        return (f"{_members([n.member for n in s.missing])} {'have' if many else 'has'} not entered "
                f"{_call(s.first)} of {group}: {_places(s, alive)}; {_in_call(s, waited)}{_unseen(s)}{unless}")
    if s.how == Stall.UNSEEN:
        return f"{_in_call(s, waited, group)}{_unseen(s)}{unless}"
    return f"no member has completed {_call(s.first)} of {group}: {_in_call(s, waited)}{unless}"


def _entered(n: SideCall, call: SideCall) -> bool:
    """``n`` reached ``call``'s position: it is in the same call, or past it (a root's broadcast
    returns before its receivers got the data)."""
    if n.seq > call.seq:
        return True
    return n.seq == call.seq and n.op == call.op and n.where != CallState.CREATING
