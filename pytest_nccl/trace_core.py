"""Rank side: what every tracer of collectives shares.

The c10d functions (``tracer.py``), the functional collectives that DTensor, FSDP2's state dicts
and compiled graphs issue (``trace_functional.py``), the methods of ProcessGroup objects and groups
made without ``new_group`` (``trace_groups.py``), and stores and groups being created
(``trace_rendezvous.py``) all write the same journal (``journal.py``): this module holds the running
call's trace, each process group's numbering and name, the call site, and the one way a record is
entered. Every wrapper costs one global lookup outside a call.
"""

from __future__ import annotations

import itertools
import os
import sysconfig
import threading
import time
import zlib
from time import perf_counter, perf_counter_ns

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .journal import JournalWriter
from .records import rank_ranges

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TESTING_DIR = _PKG_DIR + "testing" + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep  # threading.py, contextlib.py: not who issued it
# Thin communication shims whose frames say nothing about who issued the collective.
_SHIM_MARKERS = (os.sep + "deepspeed" + os.sep + "comm" + os.sep,
                 os.sep + os.path.join("deepspeed", "utils", "nvtx.py"),  # instrument_w_nvtx
                 os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep,  # SPMD mode: above the test body
                 os.sep + "torchinductor_")  # inductor's generated code: the graph, not the user's line
SITE_DEPTH = 4  # distinct files in a call site chain
GRAPH_CODE = "<eval_with_key>"  # the file name torch.fx gives a GraphModule's generated forward


class GroupTrace:
    """One process group as this call's trace numbers it: its label (the same on every member), its
    c10d name, the object (whose own sequence number lines records up with the Flight Recorder), how
    many collectives and point-to-point transfers this rank issued in it, and the crc of what every
    member must agree on."""

    __slots__ = ("label", "p2p_label", "name", "pg", "seq", "p2p_seq", "digest", "splits", "e_line", "c_line",
                 "p2p_e_line", "p2p_c_line", "g_arg", "fr_seq", "label_b")

    def __init__(self, label: str, name: str, pg):
        self.label, self.p2p_label, self.name, self.pg = label, label + ":p2p", name, pg
        self.seq = self.p2p_seq = self.digest = 0
        self.splits: list | None = None  # [(seq, "sent/expected")] of its all_to_alls
        # the start of its E and C lines, and its name as an argument: formatted once
        self.e_line, self.c_line = f"E\t{label}\t".encode(), f"C\t{label}\t".encode()
        self.p2p_e_line, self.p2p_c_line = f"E\t{self.p2p_label}\t".encode(), f"C\t{self.p2p_label}\t".encode()
        self.g_arg = f"g={name}" if name else ""
        self.label_b = label.encode()
        # the group's own sequence number (the Flight Recorder's collective_seq_id), bound once
        self.fr_seq = getattr(pg, "_get_sequence_number_for_group", None)


class CallTrace:
    """The trace of one call (a test body) on this rank."""

    __slots__ = ("writer", "fd", "t0", "t0_ns", "default_pg", "by_id", "by_name", "by_label", "async_pending",
                 "functional", "outside", "side_count", "site_frame", "site_back", "site_lasti", "site_text", "sites",
                 "pending", "flushed")

    def __init__(self, journal_path: str):
        self.writer = JournalWriter(journal_path)
        self.fd = self.writer.fd  # the hot paths write lines themselves (journal.py documents the format)
        self.default_pg = c10d._get_default_group()
        self.t0 = perf_counter()
        self.t0_ns = perf_counter_ns()
        default = GroupTrace("default", "", self.default_pg)
        self.by_id: dict[int, GroupTrace] = {id(None): default, id(self.default_pg): default}
        self.by_name: dict[str, GroupTrace] = {}      # c10d group name -> its trace (functional ops)
        self.by_label: dict[str, GroupTrace] = {"default": default}
        self.async_pending: dict[int, tuple] = {}   # id(Work) -> (work, label, seq, transfer index)
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


active: CallTrace | None = None
FLUSH_EVERY = 0.02  # seconds a completed collective's C line waits at most for the next write
_fd_lock = threading.Lock()  # the flusher never writes to a descriptor stop() closed (and reused)
_flusher_pid = None


class _Local(threading.local):
    # True while this thread is inside a traced collective: what it calls underneath (c10d's own
    # ProcessGroup methods, all_gather_object's all_gather, a functional op's autograd re-dispatch)
    # is part of that one record. Per thread: a weight-sync thread's broadcast must not hide the main
    # thread's collectives.
    inside = False


local = _Local()


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
    return pending


def flush(trace: CallTrace) -> None:
    """Write the deferred C line, unless it was written."""
    line = take_pending(trace)
    if line:
        with _fd_lock:
            if trace.fd >= 0:
                os.write(trace.fd, line)


def close(trace: CallTrace) -> None:
    flush(trace)
    with _fd_lock:
        trace.writer.close()
        trace.fd = -1


def _flush_loop() -> None:
    """A completed collective followed by a long computation is shown completed within FLUSH_EVERY."""
    while True:
        time.sleep(FLUSH_EVERY)
        trace = active
        if trace is not None:
            try:
                flush(trace)
            except OSError:
                pass


def start_flusher() -> None:
    """The flusher thread of this process (a forked rank has none of its parent's threads)."""
    global _flusher_pid
    if _flusher_pid != os.getpid():
        _flusher_pid = os.getpid()
        threading.Thread(target=_flush_loop, name="pytest-nccl-journal", daemon=True).start()


# -- the call site ------------------------------------------------------------------------------

_USER, _INTERNAL, _GRAPH, _BOUNDARY = 0, 1, 2, 3
_kind_of: dict[int, int] = {}   # id(code) -> kind; ids stay valid: _codes keeps each code alive
_codes: list = []
_site_text: dict = {}           # (id(code), instruction offset, ...) of the chain -> "file:line <- file:line"


def is_internal_file(filename: str) -> bool:
    return (filename.startswith(_TORCH_DIR) or (filename.startswith(_PKG_DIR) and not filename.startswith(_TESTING_DIR))
            or filename.startswith("<") or any(m in filename for m in _SHIM_MARKERS)
            or (filename.startswith(_STDLIB_DIR) and "-packages" + os.sep not in filename))


def _classify(code) -> int:
    filename = code.co_filename
    kind = _GRAPH if filename.startswith(GRAPH_CODE) else _INTERNAL if is_internal_file(filename) else _USER
    _kind_of[id(code)] = kind
    _codes.append(code)
    return kind


def mark_boundary(code) -> None:
    """Frames from this code down are the harness (the rank loop that runs the test): a call site
    walk stops there instead of reading every frame below the test body. Only harness code is
    marked (a script that starts a trace itself keeps its frames)."""
    if code is None or not is_internal_file(code.co_filename):
        return
    if _kind_of.get(id(code)) is None:
        _codes.append(code)
    _kind_of[id(code)] = _BOUNDARY


def call_site(frame) -> str:
    """First frames outside torch and pytest_nccl, one per distinct file, innermost first; in a
    compiled graph, the lines its node kept from the code that was compiled.

    The walk reads only code ids and instruction offsets; the text (which needs line numbers, and
    for a graph its node's stack trace) is built once per distinct chain and cached: a training loop
    issues the same few call sites thousands of times."""
    key = []
    frames = []
    last = None
    files = 0
    while frame is not None:
        code = frame.f_code
        kind = _kind_of.get(id(code))
        if kind is None:
            kind = _classify(code)
        if kind == _USER:
            filename = code.co_filename
            if filename != last:
                last = filename
                key.append(id(code))
                key.append(frame.f_lasti)
                frames.append(frame)
                files += 1
                if files == SITE_DEPTH:
                    break
        elif kind == _GRAPH:
            key.append(id(code))
            key.append(frame.f_lasti)
            frames.append(frame)
        elif kind == _BOUNDARY:
            break
        frame = frame.f_back
    cache_key = tuple(key)
    text = _site_text.get(cache_key)
    if text is None:
        text = _chain_text(frames)
        if len(_site_text) < 100_000:
            _site_text[cache_key] = text
    return text


def site_of(trace: CallTrace, frame) -> bytes:
    """``call_site(frame)`` as the journal's bytes, remembered for the frame the last one came from:
    while a frame is live its callers are fixed (for a generator's frame, its resumer is compared
    too), so a loop that issues collectives from one line walks the stack once."""
    # torch's frames between (an op's __call__, a functional collective's Python function) are new
    # objects on every call and say nothing: remember from the first frame that is the user's
    kind = _kind_of.get(id(frame.f_code))
    while kind != _USER and frame is not None:
        if kind is None:
            kind = _classify(frame.f_code)
            continue
        if kind != _INTERNAL:  # a compiled graph's frame: its line is the node's; the harness: no site
            break
        frame = frame.f_back
        kind = _kind_of.get(id(frame.f_code)) if frame is not None else None
    if frame is None:
        return b""
    back = frame.f_back
    if frame is trace.site_frame and frame.f_lasti == trace.site_lasti and back is trace.site_back:
        return trace.site_text
    # a function called once per step issues from a fresh frame whose caller is the same live frame,
    # at the same instruction (that caller's own callers are then fixed, unless it is a generator's)
    key = (id(frame.f_code), frame.f_lasti)
    found = trace.sites.get(key)
    if found is not None and found[0] is back and back is not None and found[1] == back.f_lasti \
            and found[2] is back.f_back:
        text = found[3]
    else:
        chain = call_site(frame)
        text = _site_bytes.get(chain)
        if text is None:
            text = chain.encode()
            if len(_site_bytes) < 100_000:
                _site_bytes[chain] = text
        if back is not None and (key in trace.sites or len(trace.sites) < SITES_KEPT):  # keeps a frame alive
            trace.sites[key] = (back, back.f_lasti, back.f_back, text)
    trace.site_frame, trace.site_back, trace.site_lasti, trace.site_text = frame, back, frame.f_lasti, text
    return text


_site_bytes: dict = {}
SITES_KEPT = 64


def _chain_text(frames: list) -> str:
    parts: list[str] = []
    last = None
    for frame in frames:
        found = graph_lines(frame) if frame.f_code.co_filename.startswith(GRAPH_CODE) else \
            [(frame.f_code.co_filename, frame.f_lineno)]
        for filename, line in found:
            if filename != last:
                last = filename
                parts.append(f"{filename}:{line}")
    return " <- ".join(parts[:SITE_DEPTH])


def graph_lines(frame) -> list[tuple[str, int]]:
    """(file, line) of the user's frames that issued the node a compiled graph's frame is running,
    innermost first, from the stack trace torch.fx keeps in the node's meta; [] where the graph
    kept none (the call of the compiled function then stands for it)."""
    try:
        gm = frame.f_locals.get("self")
        index = gm._lineno_map.get(frame.f_lineno - frame.f_code.co_firstlineno)
        node = list(gm.graph.nodes)[index]
        stack = node.meta.get("stack_trace") or ""
    except Exception:
        return []
    found = []
    for line in stack.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            try:
                filename, rest = line[6:].split('", line ', 1)
                found.append((filename, int(rest.split(",", 1)[0])))
            except ValueError:
                continue
    return [f for f in reversed(found) if not is_internal_file(f[0])]


# -- group labels ------------------------------------------------------------------------------

MAX_LABEL_RANKS = 48  # characters of the ranks shown in a label; longer: "..." (members unknown)
_NAMELESS = ("", "undefined", "default_pg")


def _label_ranks(ranks: list) -> str:
    if ranks == sorted(ranks):
        shown = rank_ranges(ranks)
        if len(shown) > MAX_LABEL_RANKS and len(ranks) > 2:
            step = ranks[1] - ranks[0]
            if step > 0 and all(b - a == step for a, b in zip(ranks, ranks[1:])):
                shown = f"{ranks[0]}-{ranks[-1]}:{step}"
    else:
        shown = ",".join(map(str, ranks))  # new_group(sort_ranks=False): group rank order
    return shown if len(shown) <= MAX_LABEL_RANKS else shown[:MAX_LABEL_RANKS].rsplit(",", 1)[0] + ",..."


def _clean(text: str) -> str:
    return "".join(c for c in text if c.isalnum() or c in "_.-:")


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
    name = getattr(group, "group_name", None)
    if side is not None or name is None:
        if side is None:  # a Backend used directly, made before the tracer could see it
            if trace is not None:
                trace.side_count += 1
            side = (f"{_clean(str(getattr(group, 'name', lambda: 'pg')()))}{trace.side_count if trace else ''}",
                    group.size(), group)
        return side_label(side[0], side[1]), str(name or "")
    name = str(name)
    try:
        desc = str(getattr(group, "group_desc", "") or "")
    except Exception:
        desc = ""
    if desc.startswith("mesh_") and desc != "mesh_default":
        desc = desc[5:]
    desc = _clean(desc)
    base = f"pg{name}" if desc in _NAMELESS or desc == "default" else desc
    try:
        return f"{base}[{_label_ranks(dist.get_process_group_ranks(group))}]", name
    except Exception:
        return base, name


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
            base, _, ranks = label.partition("[")
            label = f"{base}.pg{name or len(trace.by_label)}[{ranks}" if ranks else f"{base}.{len(trace.by_label)}"
        found = GroupTrace(label, name, group)
        trace.by_label[label] = found
    trace.by_id[id(group)] = found
    return found


def group_named(trace: CallTrace, name) -> GroupTrace:
    """The trace of the group a functional collective names: its c10d name, or (newer torch) the
    group object itself."""
    if not isinstance(name, str):
        return group_trace(trace, name)
    found = trace.by_name.get(name)
    if found is None:
        default = name == str(getattr(trace.default_pg, "group_name", "0"))
        found = trace.by_name[name] = group_trace(trace, None if default else c10d._resolve_process_group(name))
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


_signatures: dict = {}  # the text every member must agree on -> its bytes


def enter(trace: CallTrace, g: GroupTrace, name: str, async_op: bool, shapes: str, dtype: str, extra: str,
          signature: str | None, p2p: bool, site: str) -> tuple[str, int]:
    """Journal that this rank enters collective ``name`` of group ``g``: one write, before entering,
    what survives a SIGABRT inside it. ``signature``: what every member must agree on (folded into
    the group's digest; None for transfers and split-checked ops). Returns (label, seq)."""
    if p2p:
        g.p2p_seq += 1
        label, seq = g.p2p_label, g.p2p_seq
    else:
        g.seq += 1
        label, seq = g.label, g.seq
        if signature is not None:
            data = _signatures.get(signature)
            if data is None:
                data = signature.encode()
                if len(_signatures) < 10_000:
                    _signatures[signature] = data
            g.digest = zlib.crc32(data, g.digest)
    if g.g_arg:
        extra = f"{extra} {g.g_arg}" if extra else g.g_arg
    try:
        fr_seq = g.pg._get_sequence_number_for_group() + 1
    except Exception:
        fr_seq = ""
    line = (f"E\t{label}\t{seq}\t{name}\t{1 if async_op else 0}\t{perf_counter_ns() - trace.t0_ns}e-9\t"
            f"{shapes}\t{dtype}\t{fr_seq}\t{site}\t{extra}\n")
    os.write(trace.fd, take_pending(trace) + line.encode())
    return label, seq


def completed(trace: CallTrace, label: str, seq: int) -> None:
    os.write(trace.fd, take_pending(trace) + f"C\t{label}\t{seq}\t{perf_counter_ns() - trace.t0_ns}e-9\n".encode())
