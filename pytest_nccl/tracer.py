"""Rank side: records every torch.distributed collective a rank issues from Python.

Installed once in the fork server, before any library is imported, so that libraries binding
``from torch.distributed import all_gather`` at import time get the traced function too. Each call
(one test body on a rank) gets a fresh journal; outside a call the wrappers cost one global lookup.

What Python-level interception cannot see (DDP's C++ reducer, functional collectives under FSDP2 and
DTensor) the Flight Recorder records; the controller merges both (see ``group.py``).
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import zlib
from time import perf_counter

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .journal import JournalWriter
from .records import P2P_OPS, SHAPE_MATCHED_OPS

# For each op: the parameter holding the tensor(s) this rank contributes (what must agree across
# ranks). Group and async_op positions are read from the real signature at install time, so the
# wrappers follow whatever this torch release declares.
CONTRIBUTED = {
    "all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
    "all_gather": "tensor", "all_gather_into_tensor": "input_tensor", "_all_gather_base": "input_tensor",
    "all_gather_single": "input_tensor", "reduce_scatter_single": "input",  # FSDP2 in torch 2.13
    "all_gather_coalesced": "input_tensor_list", "all_reduce_coalesced": "tensors",
    "reduce_scatter": "output", "reduce_scatter_tensor": "input", "_reduce_scatter_base": "input",
    "gather": "tensor", "scatter": "tensor", "all_to_all": "input_tensor_list",
    "all_to_all_single": "input", "send": "tensor", "recv": "tensor", "isend": "tensor",
    "irecv": "tensor", "barrier": None, "monitored_barrier": None, "all_gather_object": None,
    "broadcast_object_list": None, "gather_object": None, "scatter_object_list": None,
    "send_object_list": None, "recv_object_list": None, "batch_isend_irecv": None,
}
ALWAYS_ASYNC = frozenset({"isend", "irecv", "batch_isend_irecv"})
# Ops that run several collectives of the group underneath: the journal notes the last sequence id
# they used, so that the Flight Recorder's entries for the inner ones are not shown twice.
COMPOSITE = frozenset({"all_gather_object", "broadcast_object_list", "gather_object",
                       "scatter_object_list", "send_object_list", "recv_object_list",
                       "all_gather_coalesced", "all_reduce_coalesced", "monitored_barrier"})

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TESTING_DIR = _PKG_DIR + "testing" + os.sep
# Thin communication shims whose frames say nothing about who issued the collective.
_SHIM_MARKERS = (os.sep + "deepspeed" + os.sep + "comm" + os.sep,
                 os.sep + os.path.join("deepspeed", "utils", "nvtx.py"),  # instrument_w_nvtx
                 os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep)  # SPMD mode: above the test body
SITE_DEPTH = 4  # distinct files in a call site chain

_internal_code: dict = {}
_site_text: dict = {}  # (code, instruction offset) chain -> "file:line <- file:line"
_pg_labels: dict = {}


class _CallTrace:
    """The trace of one call on this rank."""

    __slots__ = ("writer", "fd", "t0", "seq", "digest", "depth", "async_pending", "default_pg")

    def __init__(self, journal_path: str):
        self.writer = JournalWriter(journal_path)
        self.fd = self.writer.fd  # the hot path writes lines itself (journal.py documents the format)
        self.default_pg = c10d._get_default_group()
        self.t0 = time.perf_counter()
        self.seq: dict[str, int] = {}
        self.digest: dict[str, int] = {}
        self.depth = 0
        self.async_pending: dict[int, tuple] = {}


_active: _CallTrace | None = None


def _is_internal(code) -> bool:
    internal = _internal_code.get(code)
    if internal is None:
        fn = code.co_filename
        internal = (fn.startswith(_TORCH_DIR) or (fn.startswith(_PKG_DIR) and not fn.startswith(_TESTING_DIR))
                    or fn.startswith("<") or any(m in fn for m in _SHIM_MARKERS))
        _internal_code[code] = internal
    return internal


def call_site(frame) -> str:
    """First frames outside torch and pytest_nccl, one per distinct file, innermost first.

    The walk only reads code objects and instruction offsets; the text (which needs each frame's
    line number, decoded from the code's line table) is built once per distinct chain and cached:
    a training loop issues the same few call sites thousands of times."""
    key = []
    last_file = None
    while frame is not None and len(key) < SITE_DEPTH:
        code = frame.f_code
        internal = _internal_code.get(code)
        if internal is None:
            internal = _is_internal(code)
        if not internal and code.co_filename != last_file:
            last_file = code.co_filename
            key.append((code, frame.f_lasti, frame))
        frame = frame.f_back
    cache_key = tuple((c, i) for c, i, _ in key)
    text = _site_text.get(cache_key)
    if text is None:
        text = " <- ".join(f"{c.co_filename}:{f.f_lineno}" for c, _, f in key)
        if len(_site_text) < 100_000:
            _site_text[cache_key] = text
    return text


def pg_label(group) -> str:
    """A name for a process group that is the same on every member rank."""
    if group is None or group is c10d.GroupMember.WORLD:
        return "default"
    label = _pg_labels.get(id(group))
    if label is None:
        try:
            ranks = dist.get_process_group_ranks(group)
            shown = ",".join(map(str, ranks[:8])) + (",..." if len(ranks) > 8 else "")
            label = f"pg{group.group_name}[{shown}]"
        except Exception:
            label = f"pg{getattr(group, 'group_name', '?')}"
        _pg_labels[id(group)] = label
    return label


def _describe(value) -> tuple[str, str]:
    """(shapes, dtype) of a tensor or a list of tensors, compact."""
    if isinstance(value, torch.Tensor):
        return str(list(value.shape)), str(value.dtype)[6:]
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        shapes = [list(t.shape) for t in value]
        dtype = str(value[0].dtype)[6:]
        if all(s == shapes[0] for s in shapes):
            return f"{shapes[0]}x{len(shapes)}", dtype
        return ";".join(map(str, shapes[:4])) + (";..." if len(shapes) > 4 else ""), dtype
    return "", ""


def _wrap(name: str, fn):
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return fn
    tensor_name = CONTRIBUTED.get(name)
    tensor_pos = params.index(tensor_name) if tensor_name in params else -1
    group_pos = params.index("group") if "group" in params else -1
    async_pos = params.index("async_op") if "async_op" in params else -1
    p2p = name in P2P_OPS
    shape_matched = name in SHAPE_MATCHED_OPS
    always_async = name in ALWAYS_ASYNC
    composite = name in COMPOSITE

    def traced(*args, **kwargs):
        trace = _active
        if trace is None or trace.depth:
            return fn(*args, **kwargs)
        if name == "batch_isend_irecv":
            group = getattr(args[0][0], "group", None) if args and args[0] else None
        else:
            group = args[group_pos] if 0 <= group_pos < len(args) else kwargs.get("group")
        if always_async:
            async_op = True
        else:
            async_op = bool(args[async_pos] if 0 <= async_pos < len(args) else kwargs.get("async_op", False))
        if tensor_pos >= 0:
            shapes, dtype = _describe(args[tensor_pos] if tensor_pos < len(args) else kwargs.get(tensor_name))
        else:
            shapes, dtype = "", ""
        pg = pg_label(group)
        if p2p:
            pg += ":p2p"  # point-to-point: numbered apart, not aligned across ranks
        seq = trace.seq.get(pg, 0) + 1
        trace.seq[pg] = seq
        if not p2p:
            sig = f"{name} {shapes} {dtype}" if shape_matched else name
            trace.digest[pg] = zlib.crc32(sig.encode(), trace.digest.get(pg, 0))
        try:
            fr_seq = (trace.default_pg if group is None else group)._get_sequence_number_for_group() + 1
        except Exception:
            fr_seq = ""
        # one write, before entering: what survives a SIGABRT inside the collective
        os.write(trace.fd, (f"E\t{pg}\t{seq}\t{name}\t{1 if async_op else 0}\t"
                            f"{perf_counter() - trace.t0:.6f}\t{shapes}\t{dtype}\t{fr_seq}\t"
                            f"{call_site(sys._getframe(1))}\n").encode())
        trace.depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            trace.depth -= 1
        if async_op and result is not None:
            works = result if isinstance(result, list) else [result]
            for work in works:
                trace.async_pending[id(work)] = (work, pg, seq)
        else:
            os.write(trace.fd, f"C\t{pg}\t{seq}\t{perf_counter() - trace.t0:.6f}\n".encode())
        if composite:
            try:
                end = (trace.default_pg if group is None else group)._get_sequence_number_for_group()
                os.write(trace.fd, f"R\t{pg}\t{seq}\t{end}\n".encode())
            except Exception:
                pass
        return result

    traced.__wrapped__ = fn
    traced.__name__ = getattr(fn, "__name__", name)
    traced.__qualname__ = getattr(fn, "__qualname__", name)
    traced.__doc__ = fn.__doc__
    traced._pytest_nccl_traced = True
    return traced


_installed = False
_orig_wait = None


def _traced_wait(self, *args, **kwargs):
    trace = _active
    entry = trace.async_pending.pop(id(self), None) if trace is not None else None
    if entry is None:
        return _orig_wait(self, *args, **kwargs)
    _, pg, seq = entry
    trace.writer.waiting(pg, seq, time.perf_counter() - trace.t0)
    result = _orig_wait(self, *args, **kwargs)
    trace.writer.completed(pg, seq, time.perf_counter() - trace.t0)
    return result


def install() -> None:
    """Patch the collectives in ``torch.distributed`` and ``distributed_c10d`` (where internal calls
    such as all_gather_object -> all_gather resolve), and ``Work.wait`` for async completion."""
    global _installed, _orig_wait
    if _installed:
        return
    for name in CONTRIBUTED:
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "_pytest_nccl_traced", False):
            continue
        traced = _wrap(name, fn)
        setattr(c10d, name, traced)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, traced)
    _orig_wait = dist.Work.wait
    dist.Work.wait = _traced_wait
    _installed = True


def start(journal_path: str) -> None:
    global _active
    _pg_labels.clear()
    _active = _CallTrace(journal_path)


def stop() -> tuple[dict[str, tuple[int, int]], int]:
    """End the call's trace; return per process group (count, crc of signatures), which the
    controller compares across ranks without reading the journals, and how many async collectives
    are still in flight."""
    global _active
    trace = _active
    if trace is None:
        return {}, 0
    _active = None
    now = time.perf_counter() - trace.t0
    dangling = 0
    for work, pg, seq in trace.async_pending.values():
        try:
            if work.is_completed():
                trace.writer.completed(pg, seq, now)
            else:
                dangling += 1
        except Exception:
            pass
    trace.writer.close()
    counts = {pg: n for pg, n in trace.seq.items() if not pg.endswith(":p2p")}
    return {pg: (counts.get(pg, 0), trace.digest.get(pg, 0)) for pg in counts}, dangling


def journal_fd() -> int:
    """The descriptor the running trace writes its journal to, or -1: ``pytest-nccl watch`` bounds a
    long job's journal by pointing it at a fresh file (``os.dup2``), keeping the last segment."""
    return _active.fd if _active is not None else -1


def flight_recorder_json() -> str | None:
    try:
        return torch._C._distributed_c10d._dump_fr_trace_json().decode()
    except Exception:
        return None


def _pg_config() -> dict:
    """What torch's fr_trace analyzer needs to match entries across ranks; gloo's Flight Recorder
    leaves it empty, so it is rebuilt from c10d's own registry."""
    config = {}
    for pg, ranks in list(getattr(c10d._world, "pg_group_ranks", {}).items()):
        try:
            name = pg.group_name
            desc = getattr(pg, "group_desc", "") or ("default_pg" if pg is c10d.GroupMember.WORLD else "undefined")
        except Exception:
            continue
        config[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
    return config


def flight_recorder_pickle() -> bytes | None:
    try:
        import pickle
        # without stack traces: symbolizing them imports torch._dynamo (about 4 s) in a stuck rank
        dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False))
        config = _pg_config()
        if config:
            dump["pg_config"] = config
        for entry in dump.get("entries", []):
            entry.setdefault("frames", [])
        return pickle.dumps(dump)
    except Exception:
        return None
