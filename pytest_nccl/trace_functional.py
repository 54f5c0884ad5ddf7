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
was compiled (``trace_core.graph_lines``), else the call of the compiled function.

While a graph is being traced (fake or functional tensors, no communication) nothing is recorded.
"""

from __future__ import annotations

import sys

import torch

from . import trace_core as core
from .records import SHAPE_MATCHED_OPS
from .trace_core import call_site, describe, local

ENTERED, WAITING = "entered", "waiting"


class OpSpec:
    """How to read one functional op's arguments: its name in the journal (c10d's name for the same
    collective, so the two compare as one), where its tensors, group and other arguments are."""

    __slots__ = ("record", "tensors", "group", "reduce", "root", "splits", "p2p", "shape_matched")

    def __init__(self, record: str, group: int, tensors: int = 0, reduce: int = -1, root: int = -1,
                 splits: tuple = (), p2p: str = ""):
        self.record, self.group, self.tensors, self.reduce, self.root = record, group, tensors, reduce, root
        self.splits, self.p2p = splits, p2p
        self.shape_matched = record in SHAPE_MATCHED_OPS


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
    if spec.root >= 0:
        try:  # the functional op takes the root as a rank of the group; the journal's is GLOBAL
            return f"root={torch.distributed.get_global_rank(g.pg, args[spec.root])}"
        except Exception:
            return f"root={args[spec.root]}"
    if spec.splits:
        sent, expected = args[spec.splits[0]], args[spec.splits[1]]
        n = g.pg.size()
        rows = tensors.shape[0] if tensors.dim() else 1
        even = ",".join([str(rows // n)] * n)
        return (f"split={','.join(map(str, sent)) if len(sent) else even}/"
                f"{','.join(map(str, expected)) if len(expected) else even}")
    if spec.p2p == "batch":
        kinds, peers, tags = args[0], args[1], args[2]
        return "p2p=" + ",".join(f"{'s' if k == 'isend' else 'r'}{p}:{t}" for k, p, t in zip(kinds, peers, tags))
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
    except Exception:
        return None


def _collective(spec: OpSpec):
    def call(op, args, kwargs):
        trace = core.active
        if trace is None or local.inside or not args or not _real(args[spec.tensors]):
            return op(*args, **kwargs)
        try:
            g = core.group_named(trace, args[spec.group] if len(args) > spec.group else kwargs.get("group_name"))
            tensors = args[spec.tensors]
            shapes, dtype = describe(tensors)
            extra = _extra(spec, args, g, tensors)
        except Exception:  # the op will say what is wrong with its arguments
            return op(*args, **kwargs)
        split = bool(spec.splits)
        signature = None if spec.p2p or split else (
            f"{spec.record} {shapes} {dtype} {extra}" if spec.shape_matched else f"{spec.record} {extra}")
        label, seq = core.enter(trace, g, spec.record, True, shapes, dtype, extra, signature, bool(spec.p2p),
                                call_site(sys._getframe(1)))
        if split:
            if g.splits is None:
                g.splits = []
            g.splits.append((seq, extra[6:]))
        local.inside = True
        try:
            result = op(*args, **kwargs)
        finally:
            local.inside = False
        entry = [label, seq, ENTERED]  # shared by a coalesced op's outputs: the first wait completes it
        for out in result if isinstance(result, (list, tuple)) else (result,):
            key = _storage(out)
            if key is not None:
                trace.functional[key] = entry
        return result
    return call


def _wait(op, args, kwargs):
    """wait_tensor: the rank blocks here until the collective that made ``args[0]`` completed."""
    trace = core.active
    if trace is None or local.inside or not args:
        return op(*args, **kwargs)
    entry = trace.functional.pop(_storage(args[0]), None)
    if entry is None or entry[2] is None:
        return op(*args, **kwargs)  # not ours, or another output of the same op was waited on
    label, seq = entry[0], entry[1]
    trace.writer.waiting(label, seq, core.perf_counter() - trace.t0)
    entry[2] = WAITING
    local.inside = True
    try:
        result = op(*args, **kwargs)
    finally:
        local.inside = False
    trace.writer.completed(label, seq, core.perf_counter() - trace.t0)
    entry[2] = None
    return result


class TracedOp:
    """Stands in for the C++ callable of a functional op (``OpOverload._op``, ``OpOverloadPacket._op``):
    calls are traced; the hash is the op's, because torch keys tables by the overload, whose hash is
    its callable's (torch.fx's set of side-effecting ops holds wait_tensor: a graph must keep it)."""

    __slots__ = ("op", "call")

    def __init__(self, op, call):
        self.op, self.call = op, call

    def __call__(self, *args, **kwargs):
        return self.call(self.op, args, kwargs)

    def __hash__(self):
        return hash(self.op)

    def __eq__(self, other):
        return other is self or other is self.op

    def __getattr__(self, name):
        return getattr(self.op, name)


def _patch(holder, call) -> bool:
    op = getattr(holder, "_op", None)
    if op is None or isinstance(op, TracedOp):
        return False
    holder._op = TracedOp(op, call)
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
            call = _wait if name == "wait_tensor" else _collective(SPECS[name])
            patched = _patch(packet, call)
            for overload in packet.overloads():
                patched = _patch(getattr(packet, overload), call) or patched
            if patched:
                traced.append(f"{namespace}.{name}")
    return traced
