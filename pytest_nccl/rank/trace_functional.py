"""Rank side: records the functional collectives (``torch.ops._c10d_functional``) a rank issues.

DTensor's redistributions, tensor parallelism, FSDP2's state dicts (``DTensor.full_tensor``) and
compiled graphs do not call ``torch.distributed.all_reduce``: they call the functional ops, either
through ``torch.distributed._functional_collectives`` (``funcol.all_reduce``, ...) or, in a compiled
graph, the op overloads themselves (``torch.ops._c10d_functional.all_reduce.default``). Both end in
the C++ callable an op packet or overload holds (``_op``); that is what is traced here, so every
path gets a journal record with its call site *before* the rank blocks, numbered with the c10d
collectives of the same group.

A functional collective returns at once; the rank blocks in ``wait_tensor`` (called when the
result is first used): its record is async, with a W line when the wait starts and a C line when
it returns. In a compiled graph the call site is the line the graph's node kept from the code that
was compiled (``trace_sites.graph_lines``), else the call of the compiled function.

While a graph is being traced (fake or functional tensors, no communication) nothing is recorded.
"""

from __future__ import annotations

import sys

import torch

from ..core.states import RecordState
from . import trace_core as core
from .trace_args import global_text, split_text
from .trace_core import describe, local
from .trace_sites import site_of


class OpSpec:
    """How to read one functional op's arguments: its name in the journal (c10d's name for the same
    collective, so the two compare as one), where its tensors, group and other arguments are."""

    __slots__ = ("record", "tensors", "group", "reduce", "root", "splits", "p2p")

    def __init__(self, record: str, group: int, tensors: int = 0, reduce: int = -1, root: int = -1,
                 splits: tuple = (), p2p: str = ""):
        self.record, self.group, self.tensors, self.reduce, self.root = record, group, tensors, reduce, root
        self.splits, self.p2p = splits, p2p


# op name -> how to read it (positions in the op's schema; in-place and out= variants are the same
# collective as the plain one)
SPECS = {
    "all_reduce": OpSpec("all_reduce", group=2, reduce=1),
    "all_reduce_": OpSpec("all_reduce", group=2, reduce=1),
    "all_reduce_coalesced": OpSpec("all_reduce_coalesced", group=2, reduce=1),
    "all_reduce_coalesced_": OpSpec("all_reduce_coalesced", group=2, reduce=1),
    "all_gather_into_tensor": OpSpec("all_gather_into_tensor", group=2),
    "all_gather_into_tensor_out": OpSpec("all_gather_into_tensor", group=2),
    "all_gather_into_tensor_coalesced": OpSpec("all_gather_into_tensor_coalesced", group=2),
    "reduce_scatter_tensor": OpSpec("reduce_scatter_tensor", group=3, reduce=1),
    "reduce_scatter_tensor_out": OpSpec("reduce_scatter_tensor", group=3, reduce=1),
    "reduce_scatter_tensor_coalesced": OpSpec("reduce_scatter_tensor_coalesced", group=3, reduce=1),
    "all_to_all_single": OpSpec("all_to_all_single", group=3, splits=(2, 1)),
    "broadcast": OpSpec("broadcast", group=2, root=1),
    "broadcast_": OpSpec("broadcast", group=2, root=1),
    "isend": OpSpec("isend", group=3, p2p="s"),
    "irecv": OpSpec("irecv", group=3, p2p="r"),
    "batch_p2p_ops": OpSpec("batch_isend_irecv", group=4, tensors=3, p2p="batch"),
}
NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def _real(value) -> bool:
    """A tensor that holds data: not a fake or functional tensor of a graph being traced."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return type(value) is torch.Tensor or type(value) is torch.nn.Parameter


def _extra(spec: OpSpec, args, g: core.GroupTrace, tensors) -> str:
    """The journal's <args> (journal.py): what every member must agree on besides op and shapes."""
    if spec.reduce >= 0:
        return "red=" + str(args[spec.reduce]).upper()  # "sum" -> "SUM", c10d's ReduceOp name
    if spec.root >= 0:  # the functional op takes the root as a rank of the group; the journal's is GLOBAL
        return f"root={global_text(g.pg, args[spec.root])}"
    if spec.splits:
        return split_text(args[spec.splits[0]], args[spec.splits[1]], tensors, g.pg.size())
    if spec.p2p == "batch":
        kinds, peers, tags = args[0], args[1], args[2]
        return "p2p=" + ",".join(f"{'s' if k == 'isend' else 'r'}{p}:{t}"
                                 for k, p, t in zip(kinds, peers, tags, strict=False))
    if spec.p2p:
        return f"p2p={spec.p2p}{args[1]}:{args[2]}"
    return ""


def _storage(tensor):
    """Where a functional collective's output lives: its storage, as torch's own registry of
    in-flight collectives keys it (``wait_tensor`` may get a view of the output: DTensor narrows
    an unevenly sharded gather before it waits). A storage reused by a later output is that
    output's: the later registration wins."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # fake, sparse or subclassed tensors raise differently: no key
        return None


def _describe_call(spec: OpSpec, g: core.GroupTrace, tensors, args) -> tuple:
    """(b"shapes\\tdtype", b"<args> g=name", digest bytes or None, <args>) of one call."""
    shapes, dtype = describe(tensors)
    return core.call_fields(g, spec.record, shapes, dtype, _extra(spec, args, g, tensors),
                            agreed=not (spec.p2p or spec.splits))


def _collective(spec: OpSpec, op):
    """The traced ``__call__`` of one functional op: its E line (async) before the op returns."""
    memo: dict = {}  # (group, shape, dtype, reduce op or root) -> _describe_call's answer
    keyed = spec.reduce if spec.reduce >= 0 else spec.root if spec.root >= 0 else -1
    memoized = not spec.splits and not spec.p2p
    mid = f"\t{spec.record}\t1\t".encode()
    p2p = bool(spec.p2p)
    Tensor, Parameter = torch.Tensor, torch.nn.Parameter

    def __call__(self, *args, **kwargs):
        trace = core.active
        if trace is None or local.inside or not args:
            return op(*args, **kwargs)
        tensors = args[spec.tensors]
        one = type(tensors) is Tensor or type(tensors) is Parameter
        if not one and not _real(tensors):  # a graph being traced: fake or functional tensors
            return op(*args, **kwargs)
        try:
            g = core.group_named(trace, args[spec.group] if len(args) > spec.group else kwargs.get("group_name"))
            found = key = None
            if one and memoized:
                key = (g, tensors.shape, tensors.dtype, args[keyed] if keyed >= 0 else None)
                found = memo.get(key)
            if found is None:
                found = _describe_call(spec, g, tensors, args)
                if key is not None and len(memo) < 10_000:
                    memo[key] = found
        except Exception:  # the op will say what is wrong with its arguments
            return op(*args, **kwargs)
        described, extra, data, plain = found
        if p2p:
            g.p2p_seq = seq = g.p2p_seq + 1
            e_line, c_line, label_b = g.p2p_e_line, g.p2p_c_line, g.p2p_label_b
        else:
            g.seq = seq = g.seq + 1
            e_line, c_line, label_b = g.e_line, g.c_line, g.label_b
            if data is not None:
                g.digest = core.zlib.crc32(data, g.digest)
            else:  # split sizes: consistency across ranks, not equality
                if g.splits is None:
                    g.splits = []
                g.splits.append((seq, plain[6:]))
        try:  # the group's own number for it (the Flight Recorder's), when it has one
            fr_seq = g.fr_seq() + 1 if g.fr_seq is not None else None
        except Exception:  # a C++ method, whatever it raises: the field stays empty
            fr_seq = None
        now = core.perf_counter_ns() - trace.t0_ns
        site = site_of(trace, sys._getframe(1))
        line = core.E_LINE_NO_FR % (e_line, seq, mid, now, described, site, extra) if fr_seq is None else \
            core.E_LINE % (e_line, seq, mid, now, described, fr_seq, site, extra)
        core.os.write(trace.fd, core.take_pending(trace) + line)
        local.inside = True
        try:
            result = op(*args, **kwargs)
        finally:
            local.inside = False
        # shared by a coalesced op's outputs: the first wait completes it
        entry = [label_b, seq, RecordState.ENTERED, c_line]
        if type(result) is Tensor:
            trace.functional[_storage(result)] = entry
        else:
            for out in result if isinstance(result, (list, tuple)) else (result,):
                key = _storage(out)
                if key is not None:
                    trace.functional[key] = entry
        return result
    return __call__


def _wait(op):
    """The traced ``__call__`` of wait_tensor: the rank blocks there until the collective that made
    its argument completed (a W line before, the C line deferred like a synchronous collective's)."""
    def __call__(self, *args, **kwargs):
        trace = core.active
        if trace is None or local.inside or not args:
            return op(*args, **kwargs)
        entry = trace.functional.pop(_storage(args[0]), None)
        if entry is None or entry[2] is None:
            return op(*args, **kwargs)  # not ours, or another output of the same op was waited on
        label_b, seq = entry[0], entry[1]
        core.os.write(trace.fd, core.take_pending(trace) +
                      core.W_LINE % (label_b, seq, core.perf_counter_ns() - trace.t0_ns))
        entry[2] = RecordState.WAITING
        local.inside = True
        try:
            result = op(*args, **kwargs)
        finally:
            local.inside = False
        # written with the next line, or by the flusher thread (trace_completion.FLUSH_EVERY)
        trace.pending = core.C_LINE % (entry[3], seq, core.perf_counter_ns() - trace.t0_ns)
        entry[2] = None
        return result
    return __call__


class TracedOp:
    """Stands in for the C++ callable of a functional op (``OpOverload._op``, ``OpOverloadPacket._op``):
    calls are traced (``traced_op`` gives each op a subclass whose ``__call__`` is its tracing); the
    hash is the op's, because torch keys tables by the overload, whose hash is its callable's
    (torch.fx's set of side-effecting ops holds wait_tensor: a graph must keep it)."""

    __slots__ = ("op",)

    def __init__(self, op):
        self.op = op

    def __hash__(self):
        return hash(self.op)

    def __eq__(self, other):
        return other is self or other is self.op

    def __getattr__(self, name):
        return getattr(self.op, name)


def traced_op(name: str, op) -> TracedOp:
    """``op`` (a C++ callable) traced as the functional op ``name`` (a key of SPECS, or wait_tensor)."""
    call = _wait(op) if name == "wait_tensor" else _collective(SPECS[name], op)
    return type(f"Traced_{name}", (TracedOp,), {"__slots__": (), "__call__": call})(op)


def _patch(holder, name: str) -> bool:
    op = getattr(holder, "_op", None)
    if op is None or isinstance(op, TracedOp):
        return False
    holder._op = traced_op(name, op)
    return True


def install() -> list[str]:
    """Trace every functional collective op and ``wait_tensor`` this torch has; returns their
    qualified names."""
    import torch.distributed._functional_collectives  # noqa: F401 (registers the Python meta kernels)
    traced = []
    for namespace in NAMESPACES:
        try:
            ops = getattr(torch.ops, namespace)
        except (AttributeError, RuntimeError):
            continue
        for name in [*SPECS, "wait_tensor"]:
            try:
                packet = getattr(ops, name)
            except (AttributeError, RuntimeError):
                continue
            patched = _patch(packet, name)
            for overload in packet.overloads():
                patched = _patch(getattr(packet, overload), name) or patched
            if patched:
                traced.append(f"{namespace}.{name}")
    return traced
