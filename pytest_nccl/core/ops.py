"""What each collective op needs the ranks to agree on: the tables the tracer writes by and the
analysis checks by. Standard library only: every rank imports it."""

from __future__ import annotations

# Ops whose tensors must agree across ranks at the same sequence number (what NCCL and gloo need
# for the collective to complete). Others (gather/scatter lists, all_to_all, object collectives)
# legitimately carry per-rank shapes: only the op name is compared for them.
SHAPE_MATCHED_OPS = frozenset({
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_reduce_coalesced", "gather", "scatter", "all_gather_single", "reduce_scatter_single",
})
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list",
                     "batch_isend_irecv"})

# Ops with a root, and the name of the argument that sets it (always shown as a GLOBAL rank).
ROOT_ARG = {"broadcast": "src", "scatter": "src", "broadcast_object_list": "src", "scatter_object_list": "src",
            "reduce": "dst", "gather": "dst", "gather_object": "dst"}
# Ops with a reduce op (ReduceOp): every rank must pass the same one.
REDUCING_OPS = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
                          "all_reduce_coalesced", "reduce_scatter_single"})
# Ops whose per-peer sizes ("splits") must be consistent across ranks: what rank i sends to rank j is
# what rank j expects from rank i.
SPLIT_OPS = frozenset({"all_to_all_single", "all_to_all"})
