"""Rank side: records collectives called on ProcessGroup objects, and names groups that c10d
cannot place in the test's world.

Libraries call a group's methods directly (``pg.allreduce([t])``, ``pg.broadcast(t, root)``, a
``ProcessGroupGloo`` built over a store of its own, as RL libraries do to stream weights to an
inference server). Those methods are traced here, under the name of the c10d function that wraps
the same collective, so both compare as one; when a c10d function calls them itself, its own record
is the one (``trace_core.local.inside``).

A group made without ``new_group`` (a backend over its own store, or torch's process-group helper
called with members outside the world) has no ranks of this world c10d could name: its label says
this rank and how many more members it has (``weights[0,+1]``), so the diagnosis compares it across
no other rank and names it as such (``core.groups.GroupId.members``).
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType

import torch.distributed.distributed_c10d as c10d

from ..core.groups import clean_name
from ..core.sites import is_ours
from . import trace_completion as completion
from . import trace_core as core
from .trace_args import global_text, split_text
from .trace_core import describe, local
from .trace_sites import _TORCH_DIR, call_site, thread_mark

_ABSENT = object()


def _opt(value, attr: str):
    """An options object's field (``AllreduceOptions.reduceOp``), or the value itself when the
    overload took it positionally (``allreduce(t, op)``)."""
    found = getattr(value, attr, _ABSENT)
    return value if found is _ABSENT else found


def _red(value) -> str:
    value = _opt(value, "reduceOp")
    if value is None or value is _ABSENT:
        return "SUM"
    name = getattr(value, "name", None) or str(value).rsplit(".", 1)[-1]
    return getattr(name, "name", name)  # ReduceOp wraps a RedOpType


def _root(arg: int):
    def read(args, g):
        value = args[arg] if len(args) > arg else None
        return f"root={global_text(g.pg, _opt(value, 'rootRank'))}" if value is not None else ""
    return read


def _reduce(arg: int):
    return lambda args, g: "red=" + _red(args[arg] if len(args) > arg else None)


def _transfer(kind: str):
    def read(args, g):
        peer = "*" if kind == "r*" else global_text(g.pg, args[1])
        tag = args[-1] if len(args) > (1 if kind == "r*" else 2) else 0
        return f"p2p={kind[0]}{peer}:{tag}"
    return read


def _splits(args, g):
    out_splits, in_splits = (args[2], args[3]) if len(args) > 3 else ([], [])
    return split_text(in_splits, out_splits, args[1], g.pg.size())


# method -> (the c10d function's name for the same collective, the argument this rank contributes,
# a reader of what every member must agree on, point-to-point)
METHODS = {
    "allreduce": ("all_reduce", 0, _reduce(1), False),
    "allreduce_coalesced": ("all_reduce_coalesced", 0, _reduce(1), False),
    "broadcast": ("broadcast", 0, _root(1), False),
    "reduce": ("reduce", 0, lambda a, g: f"{_reduce(1)(a, g)} {_root(1)(a, g)}", False),
    "allgather": ("all_gather", 1, None, False),
    "_allgather_base": ("all_gather_into_tensor", 1, None, False),
    "allgather_coalesced": ("all_gather_coalesced", 1, None, False),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", 1, None, False),
    "all_gather_single": ("all_gather_single", 1, None, False),
    "reduce_scatter": ("reduce_scatter", 0, _reduce(2), False),
    "_reduce_scatter_base": ("reduce_scatter_tensor", 1, _reduce(2), False),
    "reduce_scatter_single": ("reduce_scatter_single", 1, _reduce(2), False),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", 1, _reduce(2), False),
    "alltoall_base": ("all_to_all_single", 1, _splits, False),
    "all_to_all_single": ("all_to_all_single", 1, _splits, False),
    "alltoall": ("all_to_all", 1, None, False),
    "gather": ("gather", 1, _root(2), False),
    "scatter": ("scatter", 0, _root(2), False),
    "barrier": ("barrier", -1, None, False),
    "monitored_barrier": ("monitored_barrier", -1, None, False),
    "send": ("send", 0, _transfer("s"), True),
    "recv": ("recv", 0, _transfer("r"), True),
    "recv_anysource": ("recv", 0, _transfer("r*"), True),
}
# Where (the c10d ProcessGroup, and Backend: ProcessGroupGloo/NCCL made over a store are Backends)
CLASSES = ("ProcessGroup", "Backend")


def _method(method: str, real, record: str, contributed: int, arguments, p2p: bool):

    def traced(self, *args, **kwargs):
        trace = core.active
        if trace is None:
            return real(self, *args, **kwargs)
        if local.inside:  # a c10d function's own call, its record: its Work says when the work completes
            work = real(self, *args, **kwargs)
            local.work = work
            return work
        try:
            g = core.group_trace(trace, self)
            shapes, dtype = describe(args[contributed]) if 0 <= contributed < len(args) else ("", "")
            extra = arguments(args, g) if arguments is not None else ""
        except Exception:  # the method will say what is wrong with its arguments
            return real(self, *args, **kwargs)
        split = record == "all_to_all_single"
        fields = core.call_fields(g, record, shapes, dtype, extra, agreed=not (p2p or split))
        label, seq = core.enter(trace, g, record, True, fields, p2p,
                                call_site(sys._getframe(1)) + thread_mark())
        if split:
            if g.splits is None:
                g.splits = []
            g.splits.append((seq, extra[6:]))
        local.inside = True
        try:
            work = real(self, *args, **kwargs)
        finally:
            local.inside = False
        value = args[contributed] if 0 <= contributed < len(args) else None
        if work is not None:  # it completes in Work.wait (trace_completion.traced_wait)
            trace.async_pending[id(work)] = (work, label, seq, -1, completion.watched(g, value))
            completion.adopt_work(type(work))
        else:  # no Work (NCCL on torch 2.11, options that say synchronous): done, or held on the stream
            held = completion.incomplete(g, value, None)
            if held is None:
                core.completed(trace, label, seq)
            else:
                completion.returned_incomplete(trace, held, label, seq)
        return work

    traced.__name__ = method
    core.mark_traced(traced, real)
    return traced


# -- groups made without new_group ------------------------------------------------------------------

_side_count = 0


def caller_file(depth: int = 2) -> str:
    """The file of the first frame above ``depth`` that is not pytest_nccl's (its wrappers)."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None and is_ours(frame.f_code.co_filename):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def register_side(group, name: str, size: int) -> None:
    """Name a group whose members this rank cannot place among the world's ranks."""
    try:
        key = id(group)
        ref = weakref.ref(group, lambda _: core.side_groups.pop(key, None))
    except TypeError:
        ref = None
    core.side_groups[id(group)] = (clean_name(name) or "side", int(size), ref)


def named_helper(real):
    """torch's process-group helper: RL libraries call it with no global ranks and a store of their
    own to make a group with an inference server (OpenRLHF, verl): a side group, named by the group
    name it was given."""
    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name,
                                  *args, **kwargs):
        result = real(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs)
        try:
            pg = result[0] if isinstance(result, tuple) else result
            if not global_ranks_in_group and c10d.GroupMember.WORLD is not None and \
                    pg is not c10d.GroupMember.NON_GROUP_MEMBER:
                register_side(pg, str(kwargs.get("group_desc") or group_name), group_size)
        except Exception:  # the user's group stands, whatever our bookkeeping raised
            pass
        return result
    core.mark_traced(_new_process_group_helper, real)
    return _new_process_group_helper


def named_backend_init(cls, real):
    """A backend built directly over a store (``ProcessGroupGloo(store, rank, size)``) outside
    torch.distributed: a side group, named after the backend and numbered in creation order (the
    same order on every rank of SPMD code)."""
    backend = cls.__name__.removeprefix("ProcessGroup").lower() or "pg"

    def __init__(self, *args, **kwargs):
        real(self, *args, **kwargs)
        global _side_count
        try:
            if not caller_file().startswith(_TORCH_DIR):
                _side_count += 1
                register_side(self, f"{backend}{_side_count}", self.size())
        except Exception:  # the user's group stands, whatever our bookkeeping raised
            pass
    core.mark_traced(__init__, real)
    return __init__


def _trace_methods(cls, defined_only: bool = False) -> None:
    """Put the traced method in place of each of METHODS ``cls`` has (``defined_only``: defines itself)."""
    for method, (record, contributed, arguments, p2p) in METHODS.items():
        real = (vars(cls).get(method) if defined_only else getattr(cls, method, None)) if cls is not None else None
        if real is None or getattr(real, "_pytest_nccl_traced", False):
            continue
        try:
            setattr(cls, method, _method(method, real, record, contributed, arguments, p2p))
        except (AttributeError, TypeError):
            continue


_adopted: set = set()


def adopt_group(group) -> None:
    """A process group whose class is written in Python (a backend registered with
    ``Backend.register_backend`` that returns a ProcessGroup subclass, as the NCCL model does): its
    own methods are traced as torch's are, once per class."""
    cls = type(group)
    if cls in _adopted or cls.__module__.startswith("torch."):
        return
    _adopted.add(cls)
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch") or klass is object:
            break
        _trace_methods(klass, defined_only=True)


def install() -> None:
    """Trace the collectives of ProcessGroup and Backend objects (the constructions that name side
    groups are wrapped by trace_rendezvous.py, which also journals their rendezvous), and of the
    Python subclasses a trace meets (``adopt_group``)."""
    import torch._C._distributed_c10d as C
    for cls_name in CLASSES:
        _trace_methods(getattr(C, cls_name, None))
    core.seen_group = adopt_group
