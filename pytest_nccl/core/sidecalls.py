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
# command of a trainer and a server each under its own watch); said, never taken as absent
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
    """A side group's verdict: its one line, and the report (where each member is)."""
    headline: str
    report: str


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
    return SideVerdict(headline, "\n".join(lines))


def judge(notes: list, now: float, timeout: float, alive: dict | None = None) -> SideVerdict | None:
    """The first verdict of any group in ``notes`` (``now``: wall clock; ``alive``: pid -> its process
    still runs). Per group, in order: a member's call raised (its store barrier timed out: once it
    made no other call for ``FAILED_GRACE``, or its process ended);
    members that never connected; a call some member never entered, or that no member completed,
    once nothing moved in the group for ``timeout`` seconds. None: keep waiting."""
    alive = alive or {}
    groups: dict = {}
    for n in notes:  # one host's notes: a port names one store (its members may name its host apart)
        if n.store and n.world > 0:
            groups.setdefault((n.store.rsplit(":", 1)[-1], n.world), {})[n.member] = n
    for _, by_member in sorted(groups.items()):
        members = [by_member[m] for m in sorted(by_member)]
        named = [n.store for n in members if not n.store.startswith(WILDCARDS)]
        found = _judge_group(f"{LIBRARY} at {(named or [members[0].store])[0]}", members[0].world, members,
                             now, timeout, alive)
        if found is not None:
            return found
    return None


def _judge_group(group: str, world: int, notes: list, now: float, timeout: float, alive: dict):
    failed = next((n for n in notes if n.where == CallState.FAILED
                   and (now - n.since >= FAILED_GRACE or not alive.get(n.pid, True))), None)
    if failed is not None:
        missing = [n for n in notes if n is not failed and not _entered(n, failed)]
        absent = [m for m in range(world) if m not in {n.member for n in notes}]
        outside = f"; {_members([n.member for n in missing] + absent)} never entered it (" + "; ".join(
            [f"{n.member}: {_place(n, alive.get(n.pid, True))}" for n in missing] +
            [f"{m}: {UNSEEN}" for m in absent]) + ")" if missing or absent else ""
        head = (f"{_call(failed)} of {group} failed on member {failed.member}: {failed.error}"
                f"{f' (from {failed.site})' if failed.site else ''}{outside}")
        return _report(head, group, notes, alive)
    quiet = now - max(n.since for n in notes)
    waiting = [n for n in notes if n.where in (CallState.CREATING, CallState.IN_CALL)]
    if not waiting or quiet < timeout:
        return None
    present = {n.member for n in notes}
    absent = [m for m in range(world) if m not in present]
    if absent and any(n.where == CallState.CREATING for n in notes):
        never = [m for m in range(world) if m not in present]
        created = next((n.created_at for n in notes if n.created_at), "")
        pids = ", ".join(f"{n.member}: pid {n.pid}" for n in notes[:8])
        head = (f"{len(present)} of {world} members joined {group}; {_members(never)} never connected "
                f"(the others waited {timeout:g} s, --timeout: {pids}){f'; created at {created}' if created else ''}")
        return _report(head, group, notes, alive)
    first = min((n for n in waiting if n.where == CallState.IN_CALL), key=lambda n: (n.seq, n.member), default=None)
    if first is None:
        return None  # every member present, some still creating: the store is only slow
    inside = [n for n in notes if n.where == CallState.IN_CALL and (n.seq, n.op) == (first.seq, first.op)]
    missing = [n for n in notes if not _entered(n, first)]
    unseen = f"; {_members(absent)} {'are' if len(absent) > 1 else 'is'} {UNSEEN}" if absent else ""
    wait = (f"{_members([n.member for n in inside])} waited {timeout:g} s (--timeout) with no progress in "
            f"{_call(first)}{' ' + first.detail if first.detail else ''}{f' from {first.site}' if first.site else ''}")
    if missing:
        places = "; ".join(f"member {n.member} is {_place(n, alive.get(n.pid, True))}" for n in missing)
        head = f"{_members([n.member for n in missing])} never entered {_call(first)} of {group}: {places}; {wait}"
    elif absent:  # the others are followed elsewhere: where they are is not known here
        head = f"{wait.replace(_call(first), f'{_call(first)} of {group}', 1)}{unseen}"
        unseen = ""
    else:
        head = f"no member completed {_call(first)} of {group}: {wait}"
    head += unseen
    return _report(head, group, notes, alive)


def _entered(n: SideCall, call: SideCall) -> bool:
    """``n`` reached ``call``'s position: it is in the same call, or past it (a root's broadcast
    returns before its receivers got the data)."""
    if n.seq > call.seq:
        return True
    return n.seq == call.seq and n.op == call.op and n.where != CallState.CREATING
