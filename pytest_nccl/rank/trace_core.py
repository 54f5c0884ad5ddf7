"""Rank side: what every tracer of collectives shares.

The c10d functions (``tracer.py``), the functional collectives that DTensor, FSDP2's state dicts
and compiled graphs issue (``trace_functional.py``), the methods of ProcessGroup objects and groups
made without ``new_group`` (``trace_groups.py``), and stores and groups being created
(``trace_rendezvous.py``) all write the same journal (``journal.py``): this module holds the running
call's trace, each process group's numbering and name, and the one way a record is entered; the
call site is trace_sites.py's. Every wrapper costs one global lookup outside a call.
"""

from __future__ import annotations

import itertools
import os
import threading
import zlib
from time import perf_counter, perf_counter_ns
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..core.agreement import signature
from ..core.groups import GroupId, clean_name
from ..core.groups import group_label as label_of
from ..core.journal import JournalWriter, Line


class GroupTrace:
    """One process group as this call's trace numbers it: its label (the same on every member), its
    c10d name, the object (whose own sequence number lines records up with the Flight Recorder), how
    many collectives and point-to-point transfers this rank issued in it, and the crc of what every
    member must agree on."""

    __slots__ = ("label", "p2p_label", "name", "pg", "seq", "p2p_seq", "digest", "splits", "e_line", "c_line",
                 "p2p_e_line", "p2p_c_line", "g_arg", "fr_seq", "label_b", "p2p_label_b", "early")

    def __init__(self, label: str, name: str, pg):
        self.label, self.p2p_label, self.name, self.pg = label, GroupId.parse(label).transfers.label, name, pg
        self.seq = self.p2p_seq = self.digest = 0
        self.splits: list | None = None  # [(seq, "sent/expected")] of its all_to_alls
        # the start of its E and C lines, and its name as an argument: formatted once
        self.e_line, self.c_line = f"E\t{label}\t".encode(), f"C\t{label}\t".encode()
        self.p2p_e_line, self.p2p_c_line = f"E\t{self.p2p_label}\t".encode(), f"C\t{self.p2p_label}\t".encode()
        self.g_arg = f"g={name}" if name else ""
        self.label_b, self.p2p_label_b = label.encode(), self.p2p_label.encode()
        # the group's own sequence number (the Flight Recorder's collective_seq_id), bound once
        self.fr_seq: Callable[[], int] | None = getattr(pg, "_get_sequence_number_for_group", None)
        self.early = -1  # whether its calls may return before their work completed: not known yet
        # (trace_completion.UNKNOWN; learned at its first call)


class CallTrace:
    """The trace of one call (a test body) on this rank."""

    __slots__ = ("writer", "fd", "t0", "t0_ns", "default_pg", "by_id", "by_name", "by_label", "async_pending",
                 "in_flight", "functional", "outside", "side_count", "site_frame", "site_back", "site_lasti",
                 "site_text", "sites", "pending", "flushed", "raise_leaves", "path")

    def __init__(self, journal_path: str):
        self.path = journal_path
        self.writer = JournalWriter(journal_path)
        self.fd = self.writer.fd  # the hot paths write lines themselves (journal.py documents the format)
        # an adopted test creates its default group inside the call: None until then (group=None and
        # GroupMember.WORLD name it "default" either way)
        self.default_pg = c10d._get_default_group() if dist.is_initialized() else None
        if self.default_pg is not None:
            seen_group(self.default_pg)
        self.t0 = perf_counter()
        self.t0_ns = perf_counter_ns()
        default = GroupTrace("default", "", self.default_pg)
        self.by_id: dict[int, GroupTrace] = {id(None): default, id(self.default_pg): default}
        self.by_name: dict[str, GroupTrace] = {}      # c10d group name -> its trace (functional ops)
        self.by_label: dict[str, GroupTrace] = {"default": default}
        # id(Work) -> (work, label, seq, transfer index, whether its Work says when it completed)
        self.async_pending: dict[int, tuple] = {}
        # returned before their work completed (NCCL): id(Work) -> (work, label, seq, transfer index,
        # True); the flusher thread writes each one's C line once Work.is_completed() says so
        self.in_flight: dict[object, tuple] = {}
        self.functional: dict[int, list] = {}       # output's storage -> [label, seq, state] (trace_functional)
        self.outside = itertools.count(1)           # numbers the waits outside collectives (trace_rendezvous.py)
        self.side_count = 0                         # groups named here without a c10d name
        # the last call site: a loop issues collectives from one live frame at one instruction
        self.site_frame = self.site_back = self.site_lasti = None
        self.site_text = b""
        self.sites: dict = {}  # (id(code), instruction) -> (caller's frame, its instruction, its caller, bytes)
        # The C line of the last synchronous collective, written with the next E line or by the
        # flusher thread within FLUSH_EVERY: one write per collective instead of two. ``flushed`` is
        # the last one written (compared by identity: a C line written twice is harmless, one lost
        # is not).
        self.pending: bytes | None = None
        self.flushed: bytes | None = None
        self.raise_leaves = False  # a collective that raised is journaled as completed (tracer.start)


active: CallTrace | None = None


def default_group():
    """The default process group, or None before init_process_group."""
    return c10d._get_default_group() if dist.is_initialized() else None
_fd_lock = threading.Lock()  # the flusher's and other threads' writes in order with close()'s last one


class _Local(threading.local):
    # True while this thread is inside a traced collective: what it calls underneath (c10d's own
    # ProcessGroup methods, all_gather_object's all_gather, a functional op's autograd re-dispatch)
    # is part of that one record. Per thread: a weight-sync thread's broadcast must not hide the main
    # thread's collectives.
    inside = False
    # the Work of the collective this thread is inside, as the group's method returned it
    # (trace_groups.py): after a synchronous call, whether its work completed (NCCL: maybe not)
    work = None


local = _Local()


def hide_thread() -> None:
    """The calling thread's collectives are a backend's own work, not the job's: never journaled (the
    NCCL model's streams run gloo underneath, as NCCL's kernels run unseen)."""
    local.inside = True

# Called with every group a trace meets first (trace_groups.py: a ProcessGroup subclass written in
# Python, a backend's model or a library's own, gets its methods traced as torch's are).
seen_group: Callable = lambda group: None  # noqa: E731


def _forget_in_child() -> None:
    """A process forked from a rank (a data loader worker, a stand-in server) writes no journal:
    the journal and its numbering are the rank's."""
    global active
    active = None


os.register_at_fork(after_in_child=_forget_in_child)


C_LINE = b"%b%d\t%de-9\n"  # a C line from its start, seq and time (journal.py: <t> may be "<ns>e-9")
W_LINE = b"W\t%b\t%d\t%de-9\n"  # a W line from the label, seq and time
# An E line (journal.py) from its start ("E\t<label>\t"), seq, "\t<op>\t<async>\t", time in ns,
# "<shapes>\t<dtype>", fr_seq, site and <args>: bytes formatting, the cheapest per collective.
E_LINE = b"%b%d%b%de-9\t%b\t%d\t%b\t%b\n"
E_LINE_NO_FR = E_LINE.replace(b"%d\t%b\t%b\n", b"\t%b\t%b\n")  # a group without sequence numbers


def take_pending(trace: CallTrace) -> bytes:
    """The deferred C line, unless it was written: to go first in the next write."""
    pending = trace.pending
    if pending is trace.flushed:
        return b""
    trace.flushed = pending
    return pending or b""


def flush(trace: CallTrace) -> None:
    """Write the deferred C line, unless it was written."""
    line = take_pending(trace)
    if line:
        with _fd_lock:
            os.write(trace.fd, line)


def write_open(trace: CallTrace, line: bytes) -> None:
    """Journal ``line`` from a thread that may race the trace's end (a store wait of a thread beside
    the test's), in order with the flusher's and ``close``'s writes. Once the trace is closed it goes
    to /dev/null (JournalWriter.close): a descriptor of -1 raised EBADF in such a thread (SPMD
    mode's decider, a soak's round)."""
    with _fd_lock:
        os.write(trace.fd, take_pending(trace) + line)


def close(trace: CallTrace) -> None:
    flush(trace)
    with _fd_lock:
        trace.fd = trace.writer.close()  # /dev/null: a thread of the job racing the end writes nowhere
    # The trace holds the job's frames (call sites) and Work objects, hence its tensors. Let them go
    # here, on the job's thread: dropped last by the flusher at interpreter exit, a tensor's
    # destructor releases the GIL, the finalizing interpreter ends the daemon thread inside C++
    # code, and the process aborts ("terminate called without an active exception").
    trace.site_frame = trace.site_back = None
    trace.sites.clear()
    trace.async_pending.clear()
    trace.in_flight.clear()
    trace.functional.clear()
    # Its process groups too: a job that destroyed its group before exiting (mp.spawn's ranks) left
    # the trace the last reference, and the flusher thread, which holds the trace for a moment 50
    # times a second, could drop it: the group's C++ destructor ran in that daemon thread while the
    # interpreter finalized, and a healthy rank aborted ("terminate called without an active
    # exception", SIGABRT: the soak, 1 healthy run in 80). The numbering and digests stay (``tracer.stop``
    # reads them; a thread of the job racing the end still finds its group's entry).
    trace.default_pg = None
    for g in {*trace.by_id.values(), *trace.by_name.values(), *trace.by_label.values()}:
        g.pg = g.fr_seq = None


def replace_c10d(names, wrap: Callable) -> None:
    """Put ``wrap(name, fn)`` in place of each c10d function named (once: a traced one stays), and in
    ``torch.distributed`` where that exports the same function."""
    for name in names:
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "_pytest_nccl_traced", False):
            continue
        traced = wrap(name, fn)
        setattr(c10d, name, traced)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, traced)


# -- group labels ------------------------------------------------------------------------------

# Groups whose members c10d cannot name as ranks of this world: made over a store of their own
# (ProcessGroupGloo(store, ...)), or by torch's process-group helper with members outside the world
# (an inference server). id(group) -> (name, size, the group object); filled by trace_groups.py.
side_groups: dict[int, tuple] = {}


def side_label(name: str, size: int) -> str:
    """'weights[0,+1]': this rank (a GLOBAL rank) and how many more members the group has that this
    rank cannot place (outside the test's world, or numbered by the group alone)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    return f"{name}[{rank},+{size - 1}]" if size > 1 else f"{name}[{rank}]"


def pg_label(group) -> tuple[str, str]:
    """(label, c10d group name) of a process group as the running call's trace names it (two groups
    of one call never share a label), else as ``group_label`` does."""
    trace = active
    if trace is None:
        return group_label(group)
    g = group_trace(trace, group)
    return g.label, g.name


def group_label(group, trace: CallTrace | None = None) -> tuple[str, str]:
    """(label, c10d group name) of a process group, the same on every member rank. The label is the
    user's name for the group with its ranks: a DeviceMesh dimension ("tp[2,3]"), the description
    given to ``new_group(..., group_desc=...)``, else the c10d name ("pg4[2,3]"); a group with
    members outside this world says how many ("weights[0,+1]")."""
    if group is None or group is c10d.GroupMember.WORLD:
        return "default", ""
    side = side_groups.get(id(group))
    if side is not None and side[2] is not None and side[2]() is not group:
        side = None  # a group that died had this id
    try:
        name = getattr(group, "group_name", None)
    except RuntimeError:  # a ProcessGroup subclass written in Python has none: c10d's registry does
        name = getattr(c10d._world, "pg_names", {}).get(group)
    if side is not None or name is None:
        if side is None:  # a Backend used directly, made before the tracer could see it
            if trace is not None:
                trace.side_count += 1
            side = (f"{clean_name(str(getattr(group, 'name', lambda: 'pg')()))}{trace.side_count if trace else ''}",
                    group.size(), group)
        return side_label(side[0], side[1]), str(name or "")
    name = str(name)
    try:
        desc = str(getattr(group, "group_desc", "") or "")
    except Exception:  # a C++ property, whatever it raises: the label takes the c10d name
        desc = ""
    try:
        ranks = dist.get_process_group_ranks(group)
    except Exception:  # c10d's error differs by torch version: a label without ranks
        ranks = None
    return label_of(name, desc, ranks), name


def group_trace(trace: CallTrace, group) -> GroupTrace:
    """The trace's numbering of ``group`` (None: the default group)."""
    found = trace.by_id.get(id(group))
    if found is None:
        found = _add_group(trace, group)
    return found


def _add_group(trace: CallTrace, group) -> GroupTrace:
    if group is c10d.GroupMember.WORLD:
        found = trace.by_id[id(None)]
    else:
        label, name = group_label(group, trace)
        if label in trace.by_label:  # another group of this call has that name and ranks (a second mesh)
            gid = GroupId.parse(label)
            label = (GroupId(f"{gid.name}.pg{name or len(trace.by_label)}", gid.ranks).label if gid.ranks is not None
                     else f"{gid.name}.{len(trace.by_label)}")
        found = GroupTrace(label, name, group)
        trace.by_label[label] = found
    trace.by_id[id(group)] = found
    seen_group(group)
    return found


def group_named(trace: CallTrace, name) -> GroupTrace:
    """The trace of the group a functional collective names: its c10d name, or (newer torch) the
    group object itself."""
    if not isinstance(name, str):
        return group_trace(trace, name)
    found = trace.by_name.get(name)
    if found is None:
        default = name == str(getattr(trace.default_pg, "group_name", "0"))
        # a c10d group name (torch's GroupName is a str)
        resolved = None if default else c10d._resolve_process_group(name)  # type: ignore[arg-type]
        found = trace.by_name[name] = group_trace(trace, resolved)
    return found


# -- what a record says --------------------------------------------------------------------------

_described: dict = {}  # (shape, dtype) -> ("[2, 7]", "float32")


def describe(value) -> tuple[str, str]:
    """(shapes, dtype) of a tensor or a list of tensors, compact."""
    if isinstance(value, torch.Tensor):
        key = (value.shape, value.dtype)
        found = _described.get(key)
        if found is None:
            found = (str(list(value.shape)), str(value.dtype)[6:])
            if len(_described) < 10_000:
                _described[key] = found
        return found
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        shapes = [list(t.shape) for t in value]
        dtype = str(value[0].dtype)[6:]
        if all(s == shapes[0] for s in shapes):
            return f"{shapes[0]}x{len(shapes)}", dtype
        return ";".join(map(str, shapes[:4])) + (";..." if len(shapes) > 4 else ""), dtype
    return "", ""


def call_fields(g: GroupTrace, op: str, shapes: str, dtype: str, extra: str, agreed: bool) -> tuple:
    """(b"shapes\\tdtype", b"<args> g=name", the signature's bytes or None, <args>) of one call of
    ``op`` in group ``g``: what its E line says besides its position, and what goes into the digest
    (``agreed``: every member must agree on it; not transfers nor split-checked ops)."""
    data = signature(op, shapes, dtype, extra).encode() if agreed else None
    with_group = f"{extra} {g.g_arg}" if extra and g.g_arg else extra or g.g_arg
    return f"{shapes}\t{dtype}".encode(), with_group.encode(), data, extra


def enter(trace: CallTrace, g: GroupTrace, name: str, async_op: bool, fields: tuple, p2p: bool,
          site: str) -> tuple[str, int]:
    """Journal that this rank enters collective ``name`` of group ``g``: one write, before entering,
    what survives a SIGABRT inside it. ``fields``: the call's ``call_fields`` (its signature is
    folded into the group's digest). Returns (label, seq)."""
    described, extra, agreed, _ = fields
    if p2p:
        g.p2p_seq += 1
        label, seq = g.p2p_label, g.p2p_seq
    else:
        g.seq += 1
        label, seq = g.label, g.seq
        if agreed is not None:
            g.digest = zlib.crc32(agreed, g.digest)
    try:
        fr_seq = g.fr_seq() + 1 if g.fr_seq is not None else ""
    except Exception:  # a C++ method, whatever it raises: the field stays empty
        fr_seq = ""
    line = (f"E\t{label}\t{seq}\t{name}\t{1 if async_op else 0}\t{perf_counter_ns() - trace.t0_ns}e-9\t"
            .encode() + described + f"\t{fr_seq}\t{site}\t".encode() + extra + b"\n")
    os.write(trace.fd, take_pending(trace) + line)
    return label, seq


def record_line(kind: Line, trace: CallTrace, label: str, seq: int, index: int = -1) -> bytes:
    """A line about record (``label``, ``seq``) now: its W, Q or C line, for one transfer of a batch
    (``index``) or for the whole record."""
    suffix = "" if index < 0 else f"\t{index}"
    return f"{kind.value}\t{label}\t{seq}\t{perf_counter_ns() - trace.t0_ns}e-9{suffix}\n".encode()


def completed(trace: CallTrace, label: str, seq: int) -> None:
    os.write(trace.fd, take_pending(trace) + record_line(Line.COMPLETED, trace, label, seq))


def mark_traced(wrapper, real) -> None:
    """``wrapper`` stands for ``real``: never wrapped again (``_pytest_nccl_traced``), and unwrapped
    by ``inspect`` and ``functools`` as ``real``."""
    vars(wrapper).update(__wrapped__=real, _pytest_nccl_traced=True)
