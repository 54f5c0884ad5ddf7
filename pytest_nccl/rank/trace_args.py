"""Rank side: what the journal says of a c10d collective's arguments (journal.py's <args>).

For each op, what every rank must agree on and where the tracer finds it in the real function's
parameters: the tensor it contributes, the reduce op, the root or peer as a GLOBAL rank, split
sizes; and which of them can key the wrapper's memo of a call's description (``tracer._wrap``).
"""

from __future__ import annotations

import torch
import torch.distributed.distributed_c10d as c10d

from ..core.journal import transfer_text
from ..core.ops import REDUCING_OPS, ROOT_ARG, SPLIT_OPS

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
        except Exception:  # c10d's error differs by torch version; the tracer never fails a call
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
    except Exception:  # whatever the user passed: the op itself says what is wrong
        return ""


def global_text(pg, group_rank) -> str:
    """A rank of group ``pg`` as the journal writes roots and peers: its GLOBAL rank (else as given)."""
    try:
        return str(c10d.get_global_rank(pg, int(group_rank)))
    except Exception:  # c10d's error differs by torch version: the rank as given
        return str(group_rank)


def split_text(sent, expected, tensor, n: int) -> str:
    """The journal's ``split=<sent>/<expected>`` of an all_to_all_single given as a tensor and its
    split sizes; empty sizes: dim 0 of ``tensor`` in ``n`` equal parts."""
    rows = tensor.shape[0] if tensor.dim() else 1
    even = ",".join([str(rows // n)] * n)
    return (f"split={','.join(map(str, sent)) if len(sent) else even}/"
            f"{','.join(map(str, expected)) if len(expected) else even}")


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
            # each transfer with its tensor: two to one peer pair in the order enqueued, whatever they carry
            return "p2p=" + ",".join(
                transfer_text(getattr(op.op, "__name__", "") == "isend", op.peer, op.tag or 0,
                              tuple(op.tensor.shape), str(op.tensor.dtype)[6:]) for op in ops)
        return batch
    return None


def _memo_params(name: str) -> list | None:
    """The parameters whose values decide an op's <args> text, when they can key a memo (hashable
    scalars: a reduce op, a root, a peer, a tag); None for ops whose <args> come from lists."""
    if name in SPLIT_OPS or name == "batch_isend_irecv":
        return None
    if name == "reduce":
        return ["op", "dst", "group_dst"]
    if name in REDUCING_OPS:
        return ["op"]
    if name in ROOT_ARG:
        return [ROOT_ARG[name], "group_" + ROOT_ARG[name]]
    if name in ("send", "isend", "send_object_list"):
        return ["dst", "group_dst", "tag"]
    if name in ("recv", "irecv", "recv_object_list"):
        return ["src", "group_src", "tag"]
    return []
