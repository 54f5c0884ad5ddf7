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

from ..core.journal import JournalWriter
from ..core.sites import is_ours
from ..core.groups import rank_ranges
from ..core.ops import P2P_OPS, REDUCING_OPS, ROOT_ARG, SHAPE_MATCHED_OPS, SPLIT_OPS

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
# Thin communication shims whose frames say nothing about who issued the collective.
_SHIM_MARKERS = (os.sep + "deepspeed" + os.sep + "comm" + os.sep,
                 os.sep + os.path.join("deepspeed", "utils", "nvtx.py"),  # instrument_w_nvtx
                 os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep)  # SPMD mode: above the test body
SITE_DEPTH = 4  # distinct files in a call site chain

_internal_code: dict = {}
_site_text: dict = {}  # (code, instruction offset) chain -> "file:line <- file:line"
_pg_labels: dict = {}
_label_owners: dict = {}  # label -> the group that has it in this call: the first one used keeps the name


class _CallTrace:
    """The trace of one call on this rank."""

    __slots__ = ("writer", "fd", "t0", "seq", "digest", "splits", "depth", "async_pending", "default_pg")

    def __init__(self, journal_path: str):
        self.writer = JournalWriter(journal_path)
        self.fd = self.writer.fd  # the hot path writes lines itself (journal.py documents the format)
        self.default_pg = c10d._get_default_group()
        self.t0 = time.perf_counter()
        self.seq: dict[str, int] = {}
        self.digest: dict[str, int] = {}
        self.splits: dict[str, list] = {}   # pg -> [(seq, "sent/expected")] of its all_to_alls
        self.depth = 0
        self.async_pending: dict[int, tuple] = {}


_active: _CallTrace | None = None


def _is_internal(code) -> bool:
    internal = _internal_code.get(code)
    if internal is None:
        fn = code.co_filename
        internal = (fn.startswith(_TORCH_DIR) or is_ours(fn) or fn.startswith("<")
                    or any(m in fn for m in _SHIM_MARKERS))
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


def pg_label(group) -> tuple[str, str]:
    """(label, c10d group name) of a process group, the same on every member rank. The label is the
    user's name for the group with its ranks: a DeviceMesh dimension ("tp[2,3]"), the description
    given to ``new_group(..., group_desc=...)``, else the c10d name ("pg4[2,3]")."""
    if group is None or group is c10d.GroupMember.WORLD:
        return "default", ""
    found = _pg_labels.get(id(group))
    if found is None:
        name = str(getattr(group, "group_name", "?"))
        try:
            desc = str(getattr(group, "group_desc", "") or "")
        except Exception:
            desc = ""
        if desc.startswith("mesh_") and desc != "mesh_default":
            desc = desc[5:]
        desc = "".join(c for c in desc if c.isalnum() or c in "_.-:")
        base = f"pg{name}" if desc in _NAMELESS or desc == "default" else desc
        try:
            label = f"{base}[{_label_ranks(dist.get_process_group_ranks(group))}]"
        except Exception:
            label = base
        if label in _label_owners:  # another group of this call has that name and ranks (a second mesh)
            label = f"{base}.pg{name}{label[len(base):]}"
        _label_owners[label] = id(group)
        found = _pg_labels[id(group)] = (label, name)
    return found


_red_names: dict = {}


def _red_name(op) -> str:
    if op is None:
        return "SUM"
    try:
        name = _red_names.get(op)
    except TypeError:  # an unhashable custom op
        name = None
    if name is None:
        name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
        try:
            _red_names[op] = name
        except TypeError:
            pass
    return name


def _arg(args, kwargs, pos, name):
    return args[pos] if 0 <= pos < len(args) else kwargs.get(name)


def _global(group, rank, group_rank):
    """A root or peer as a GLOBAL rank, from ``src``/``dst`` or ``group_src``/``group_dst``."""
    if rank is None and group_rank is not None:
        try:
            return c10d.get_global_rank(group if group is not None else c10d._get_default_group(), group_rank)
        except Exception:
            return None
    return rank


def _sizes(value, n: int) -> str:
    if isinstance(value, torch.Tensor):  # a tensor of split sizes
        value = value.tolist()
    return ",".join(map(str, value)) if value is not None else ""


def _even(tensor, group) -> str:
    """Split sizes of an all_to_all_single without any: dim 0 in equal parts."""
    try:
        n = (group or c10d._get_default_group()).size()
        rows = tensor.shape[0] if tensor.dim() else 1
        return ",".join([str(rows // n)] * n)
    except Exception:
        return ""


def _arguments(name: str, params: list):
    """For op ``name``: a function (args, kwargs, group) -> the journal's <args> text without the
    group (see journal.py), or None when the op has none. Positions come from the real signature."""
    pos = {p: i for i, p in enumerate(params)}

    def at(p):
        return pos.get(p, -1)

    if name in REDUCING_OPS:
        op_pos = at("op")
        if name == "reduce":
            dst_pos, gdst_pos = at("dst"), at("group_dst")
            return lambda a, k, g: (f"red={_red_name(_arg(a, k, op_pos, 'op'))} root="
                                    f"{_global(g, _arg(a, k, dst_pos, 'dst'), _arg(a, k, gdst_pos, 'group_dst'))}")
        return lambda a, k, g: "red=" + _red_name(_arg(a, k, op_pos, "op"))
    if name in ROOT_ARG:
        arg = ROOT_ARG[name]
        r_pos, g_pos = at(arg), at("group_" + arg)
        return lambda a, k, g: f"root={_global(g, _arg(a, k, r_pos, arg), _arg(a, k, g_pos, 'group_' + arg))}"
    if name == "all_to_all_single":
        o_pos, i_pos, os_pos, is_pos = at("output"), at("input"), at("output_split_sizes"), at("input_split_sizes")

        def splits(a, k, g):
            sent, expected = _arg(a, k, is_pos, "input_split_sizes"), _arg(a, k, os_pos, "output_split_sizes")
            sent = _sizes(sent, 0) if sent is not None and len(sent) else _even(_arg(a, k, i_pos, "input"), g)
            expected = (_sizes(expected, 0) if expected is not None and len(expected)
                        else _even(_arg(a, k, o_pos, "output"), g))
            return f"split={sent}/{expected}"
        return splits
    if name == "all_to_all":
        o_pos, i_pos = at("output_tensor_list"), at("input_tensor_list")
        return lambda a, k, g: (f"split={','.join(str(t.numel()) for t in _arg(a, k, i_pos, 'input_tensor_list'))}/"
                                f"{','.join(str(t.numel()) for t in _arg(a, k, o_pos, 'output_tensor_list'))}")
    if name in ("send", "isend", "recv", "irecv", "send_object_list", "recv_object_list"):
        send = name in ("send", "isend", "send_object_list")
        kind = ("S" if send else "R") if "object" in name else ("s" if send else "r")
        arg = "dst" if send else "src"
        p_pos, gp_pos, t_pos = at(arg), at("group_" + arg), at("tag")

        def transfer(a, k, g):
            peer = _global(g, _arg(a, k, p_pos, arg), _arg(a, k, gp_pos, "group_" + arg))
            tag = _arg(a, k, t_pos, "tag") or 0
            return f"p2p={kind}{'*' if peer is None else peer}:{tag}"
        return transfer
    if name == "batch_isend_irecv":
        def batch(a, k, g):
            ops = _arg(a, k, 0, "p2p_op_list") or ()
            return "p2p=" + ",".join(
                f"{'s' if getattr(op.op, '__name__', '') == 'isend' else 'r'}{op.peer}:{op.tag}" for op in ops)
        return batch
    return None


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
    split = name in SPLIT_OPS
    arguments = _arguments(name, params)

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
        pg, gname = pg_label(group)
        extra = ""
        if arguments is not None:
            try:
                extra = arguments(args, kwargs, group)
            except Exception:  # the op itself will say what is wrong with its arguments
                extra = ""
        if p2p:
            pg += ":p2p"  # point-to-point: numbered apart, matched as pairs (diagnose.py)
        seq = trace.seq.get(pg, 0) + 1
        trace.seq[pg] = seq
        if split:
            trace.splits.setdefault(pg, []).append((seq, extra[6:]))  # consistency, not equality
        elif not p2p:
            sig = f"{name} {shapes} {dtype} {extra}" if shape_matched else f"{name} {extra}"
            trace.digest[pg] = zlib.crc32(sig.encode(), trace.digest.get(pg, 0))
        if gname:
            extra = f"{extra} g={gname}" if extra else "g=" + gname
        try:
            fr_seq = (trace.default_pg if group is None else group)._get_sequence_number_for_group() + 1
        except Exception:
            fr_seq = ""
        # one write, before entering: what survives a SIGABRT inside the collective
        os.write(trace.fd, (f"E\t{pg}\t{seq}\t{name}\t{1 if async_op else 0}\t"
                            f"{perf_counter() - trace.t0:.6f}\t{shapes}\t{dtype}\t{fr_seq}\t"
                            f"{call_site(sys._getframe(1))}\t{extra}\n").encode())
        trace.depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            trace.depth -= 1
        if async_op and result is not None:
            if isinstance(result, list):  # batch_isend_irecv: one Work per transfer, or one for all
                n = len(args[0]) if args else 0
                for i, work in enumerate(result):
                    trace.async_pending[id(work)] = (work, pg, seq, i if len(result) == n > 1 else -1)
            else:
                trace.async_pending[id(result)] = (result, pg, seq, -1)
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
    _, pg, seq, index = entry
    trace.writer.waiting(pg, seq, time.perf_counter() - trace.t0, index)
    result = _orig_wait(self, *args, **kwargs)
    trace.writer.completed(pg, seq, time.perf_counter() - trace.t0, index)
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
    _label_owners.clear()
    _active = _CallTrace(journal_path)


def stop() -> tuple[dict[str, tuple], int]:
    """End the call's trace; return per process group (count, crc of what every rank must agree on:
    op, shapes, dtype, reduce op, root), plus the split sizes of its all_to_alls where it ran any
    (``(seq, "sent/expected")`` each), which the controller compares across ranks without reading
    the journals (``diagnose.digests_agree``); and how many async collectives are still in flight."""
    global _active
    trace = _active
    if trace is None:
        return {}, 0
    _active = None
    now = time.perf_counter() - trace.t0
    dangling = 0
    for work, pg, seq, index in trace.async_pending.values():
        try:
            if work.is_completed():
                trace.writer.completed(pg, seq, now, index)
            else:
                dangling += 1
        except Exception:
            pass
    trace.writer.close()
    counts = {pg: n for pg, n in trace.seq.items() if not pg.endswith(":p2p")}
    digests = {}
    for pg, n in counts.items():
        splits = trace.splits.get(pg)
        digests[pg] = (n, trace.digest.get(pg, 0), tuple(splits)) if splits else (n, trace.digest.get(pg, 0))
    return digests, dangling


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
