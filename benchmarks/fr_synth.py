"""Synthesized Flight Recorder (FR) dumps, as NCCL's dump-on-timeout writes them, for any number of ranks.

``generate(outdir, ranks=..., scenario=...)`` writes one file per rank, ``<outdir>/<prefix><rank>``, each a
pickled dict in the form torch's ``_dump_fr_trace`` / ``_dump_nccl_trace`` returns (``--format json``: the form of
``_dump_fr_trace_json``), and returns the scenario's ground truth (who is to blame, where every rank waits). The
CLI prints that truth as JSON on stdout; nothing but the dumps is written into OUTDIR::

    python benchmarks/fr_synth.py OUTDIR --ranks 1024 --tp 8 --entries 2000 --scenario tp_skip \
        --format pickle --version 2.10 --prefix nccl_trace_rank_

The dump's schema (keys, value types, profiling names) and how it changed with the FR version string are
described in docs/explain-schema.md; ``--version`` picks which form is written ("2.10" is what torch 2.13 writes).

The job model
-------------
Process groups are created as a Megatron-style job creates them, so their names are torch's global counter:
the default group "0" (desc "default_pg", every rank), then the TP groups "1".."W/tp" (desc ``tp_<i>``, ranks
``i*tp .. i*tp+tp-1``), then the DP groups (desc ``dp_<j>``, the ranks whose TP index is j); the p2p scenario
uses pipeline groups ``pp_<i>`` (``--pp`` consecutive ranks) instead of TP groups. ``pg_id`` is the rank's own
count of the groups it belongs to (0 default, 1 its TP/PP group, 2 its DP group), ``pg_status`` is keyed by it.

Every rank runs the same training loop, one *step* after another; a step is a fixed list of *units*, a unit
being one collective, one point-to-point op, or one coalesced block (its member entries and the closing
``nccl:coalesced`` entry). The units of all steps but the last are completed everywhere. The last step is
simulated: a rank's GPU stream runs its units in order; a collective completes once every member of its group
has reached it, a send/recv once its peer has reached the matching recv/send. A rank whose CPU is stuck (the
culprit) stops issuing units at a given point; a running rank's CPU issues ``lookahead`` units past the one its
stream waits in (0 by default: a rank's last entry is the one it waits in). So every entry's state follows:
units before the one a rank's stream waits in are 'completed' (retired, timestamps, ``duration_ms``), the one it
waits in is 'started' (its peers never came), the units issued after it 'scheduled'. With ``timing=False``
(TORCH_NCCL_ENABLE_TIMING unset) NCCL has no start event: 'started' reads 'scheduled', there is no
``duration_ms`` and ``time_discovered_started_ns`` is None.

Ring buffer: a rank keeps only its last ``entries`` entries; ``record_id`` counts every entry the rank ever
recorded (it is not reset), so the kept window starts above 0 and, as ranks issued different numbers of
entries, at different record_ids on different ranks.

Frames, innermost first as torch writes them: torch's own (``distributed_c10d.py``, ``c10d_logger.py``, for
TP ops also ``torch/nn/modules/module.py`` between user frames), under them the user's ``/workspace/train.py``
(a function per call site, its own line), ``main`` and ``<module>``: the first frame outside torch names the
call site.

Scenarios
---------
``healthy``   Every rank in step: a snapshot taken mid-step (an on-demand dump). Every rank has the same units;
              the last one is 'started' on all ranks (plus ``lookahead`` 'scheduled' ones), all before completed.
              Loop: TP all_reduce, TP all_reduce, DP reduce_scatter (``nccl:_reduce_scatter_base``), DP all_gather
              (``nccl:_all_gather_base``).
``tp_skip``   Same loop. Rank N (``culprit``; default: a rank in the middle TP group, index 1 in it) never enters
              TP all_reduce #k (the first unit of the last step) of its TP group: its last entry is the unit
              before, completed. Its TP peers sit 'started' in that all_reduce; every other rank completes its
              own TP all_reduces and sits 'started' in DP reduce_scatter #m, waiting for the member of the
              culprit's TP group its DP group holds. "W-tp ranks wait in reduce_scatter #m of dp_* for members
              of tp_g, which wait in all_reduce #k for rank N."
``p2p``       Pipeline parallelism: ``pp`` stages per pipeline group ``pp_i``, each step ``pp`` microbatches
              forward (stage s recv from s-1, send to s+1) and backward (recv from s+1, send to s-1), then a DP
              all_reduce of the stage's gradients. Profiling names as NCCL writes them with group ranks:
              ``nccl:send 1->2``, ``nccl:recv 2<-1``; ``is_p2p`` True, ``p2p_seq_id`` counts the group's p2p ops,
              ``collective_seq_id`` stays at the group's collective count. The culprit (a middle stage of the
              middle pipeline) never posts its recv of forward microbatch 1: its upstream neighbour sits
              'started' in the send to it, the stages before in their next send, the stages after in their
              recv, and every other pipeline 'started' in the DP all_reduce.
``coalesced`` Coalesced ops as torch records them. Loop: a TP ``batch_isend_irecv`` ring exchange (per rank
              ``nccl:send``, ``nccl:recv`` and the closing ``nccl:coalesced``, all ``is_p2p`` with one
              ``p2p_seq_id``), TP ``nccl:allreduce_coalesced`` (the fast path: one entry, several tensors), a DP
              ``_coalescing_manager`` block of ``nccl:_reduce_scatter_base`` entries sharing one
              ``collective_seq_id`` (their own ``op_id`` each) closed by ``nccl:REDUCE_SCATTER_coalesced``
              (FR < 2.7 recorded only the closing entry, named ``nccl:coalesced``), DP
              ``nccl:all_gather_into_tensor_coalesced`` (fast path). The culprit never enters the DP block.
``states``    The healthy loop, an on-demand dump that shows every state: completed entries with
              ``duration_ms`` and both ``time_discovered_*``, the last completed unit not yet retired by the
              watchdog (``retired`` False), the unit in flight 'started', ``lookahead`` (default 2) 'scheduled'.
``behind``    A data-parallel job (every unit an all_reduce or broadcast of the default group): rank N stopped
              issuing; every other rank issued ``behind`` (default 3) collectives more, the first 'started' and
              the rest 'scheduled', so rank N's last ``collective_seq_id`` is ``behind`` below everyone's.
``missing``   ``tp_skip`` with one rank's file absent (``missing``, default: the culprit's).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

SCENARIOS = ("healthy", "tp_skip", "p2p", "coalesced", "states", "behind", "missing")
VERSIONS = ("2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")

TORCH = "/usr/local/lib/python3.11/site-packages/torch"
USER = "/workspace/train.py"
T0_NS = 1_796_000_000_000_000_000  # some time in 2026
STEP_NS = 250_000_000             # a training step: 250 ms
TIMEOUT_MS = 600_000              # NCCL's default 10 min
COMM_LIB_VERSION = "2.27.5"
THREAD_NAME = "python"            # what torch 2.13 wrote for the main thread of a spawned rank


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


# --------------------------------------------------------------------------------------------------- frames

def _f(name: str, filename: str, line: int) -> dict:
    return {"name": name, "filename": filename, "line": line}


_C10D = TORCH + "/distributed/distributed_c10d.py"
_LOGGER = TORCH + "/distributed/c10d_logger.py"
_MODULE = TORCH + "/nn/modules/module.py"
_API_LINE = {"all_reduce": 2806, "all_reduce_coalesced": 3000, "reduce_scatter_tensor": 4361,
             "all_gather_into_tensor": 3860, "broadcast": 2715, "send": 2420, "recv": 2470,
             "batch_isend_irecv": 2654, "_coalescing_manager": 2550, "all_gather_coalesced": 3950}
_BOTTOM = [_f("train_step", USER, 141), _f("main", USER, 203), _f("<module>", USER, 210)]


def _frames(api: str, site: str, site_line: int, module: bool = False) -> list[dict]:
    """torch's frames for the call of ``api``, then the user's call site ``site`` in train.py, then
    (``module``) the nn.Module call machinery, then train_step / main / <module>."""
    top = [_f(api, _C10D, _API_LINE[api]), _f("wrapper", _LOGGER, 81)]
    if api in ("send", "recv"):
        top = [_f(api, _C10D, _API_LINE[api])]
    if api == "_coalescing_manager":
        top = [_f("_coalescing_manager", _C10D, _API_LINE[api]),
               _f("__exit__", "/usr/lib/python3.11/contextlib.py", 144)]
    mid = [_f("_call_impl", _MODULE, 1784), _f("_wrapped_call_impl", _MODULE, 1773)] if module else []
    return top + [_f(site, USER, site_line)] + mid + _BOTTOM


# ---------------------------------------------------------------------------------------------- the loop

class Op(NamedTuple):
    """One FR entry of a unit."""
    name: str                  # profiling name, e.g. "nccl:all_reduce", "nccl:send 0->1"
    in_sizes: list
    out_sizes: list
    dtype: str
    is_p2p: bool
    frames: str                # key into the scenario's frame table
    counts: bool = True        # bumps op_id (False for the closing entry of a coalesced block)


class Unit(NamedTuple):
    """What one rank's stream runs as one piece: a collective, a p2p op, or a coalesced block."""
    group: str                 # "default", "tp", "pp" or "dp": which of the rank's groups
    kind: str                  # "coll" | "p2p" | "batch"
    ops: tuple                 # its FR entries, in recording order
    peer: int = -1             # p2p: the peer's global rank
    send: bool = False         # p2p: a send (else a recv)


@dataclass
class Layout:
    ranks: int
    size: int                  # TP (or PP) group size
    second: str = "tp"         # "tp" or "pp"

    def group_of(self, rank: int, group: str) -> tuple[str, int]:
        if group == "default":
            return ("default", 0)
        if group == self.second:
            return (self.second, rank // self.size)
        return ("dp", rank % self.size)

    def members(self, g: tuple[str, int]) -> list[int]:
        kind, i = g
        if kind == "default":
            return list(range(self.ranks))
        if kind == self.second:
            return list(range(i * self.size, (i + 1) * self.size))
        return list(range(i, self.ranks, self.size))

    def name_desc(self, g: tuple[str, int]) -> tuple[str, str]:
        kind, i = g
        if kind == "default":
            return ("0", "default_pg")
        if kind == self.second:
            return (str(1 + i), f"{kind}_{i}")
        return (str(1 + self.ranks // self.size + i), f"dp_{i}")

    def rank_groups(self, rank: int) -> list[tuple[str, int]]:
        """The rank's groups in creation order: its pg_id is the index."""
        return [("default", 0), self.group_of(rank, self.second), self.group_of(rank, "dp")]


def _tp_dp_loop(layout: Layout, rank: int) -> list[Unit]:
    dp = layout.ranks // layout.size
    n = 1 << 20
    ar = Op("nccl:all_reduce", [[4096, 8192]], [[4096, 8192]], "BFloat16", False, "tp_ar_attn")
    ar2 = ar._replace(frames="tp_ar_mlp")
    rs = Op("nccl:_reduce_scatter_base", [[dp * n]], [[n]], "Float", False, "dp_rs")
    ag = Op("nccl:_all_gather_base", [[n]], [[dp * n]], "BFloat16", False, "dp_ag")
    return [Unit("tp", "coll", (ar,)), Unit("tp", "coll", (ar2,)), Unit("dp", "coll", (rs,)),
            Unit("dp", "coll", (ag,))]


_TP_DP_FRAMES = {
    "tp_ar_attn": _frames("all_reduce", "attention_forward", 57, module=True),
    "tp_ar_mlp": _frames("all_reduce", "mlp_forward", 74, module=True),
    "dp_rs": _frames("reduce_scatter_tensor", "reduce_gradients", 112),
    "dp_ag": _frames("all_gather_into_tensor", "gather_parameters", 126),
}


def _ddp_loop(layout: Layout, rank: int) -> list[Unit]:
    bucket = [[25 << 18]]
    units = [Unit("default", "coll", (Op("nccl:all_reduce", bucket, bucket, "Float", False, f"ddp_ar{i}"),))
             for i in range(3)]
    units.append(Unit("default", "coll", (Op("nccl:broadcast", [[1024]], [[1024]], "Float", False, "ddp_bc"),)))
    return units


_DDP_FRAMES = {
    **{f"ddp_ar{i}": _frames("all_reduce", "allreduce_bucket", 90 + i) for i in range(3)},
    "ddp_bc": _frames("broadcast", "sync_buffers", 101),
}


def _pp_loop(layout: Layout, rank: int) -> list[Unit]:
    pp = layout.size
    stage = rank % pp
    first = rank - stage
    act = [[8, 4096, 8192]]
    units: list[Unit] = []

    def send(to: int, key: str) -> Unit:
        return Unit("pp", "p2p", (Op(f"nccl:send {stage}->{to}", act, act, "BFloat16", True, key),),
                    peer=first + to, send=True)

    def recv(frm: int, key: str) -> Unit:
        return Unit("pp", "p2p", (Op(f"nccl:recv {stage}<-{frm}", act, act, "BFloat16", True, key),),
                    peer=first + frm, send=False)

    for _mb in range(pp):                      # forward
        if stage > 0:
            units.append(recv(stage - 1, "pp_recv_fwd"))
        if stage < pp - 1:
            units.append(send(stage + 1, "pp_send_fwd"))
    for _mb in range(pp):                      # backward
        if stage < pp - 1:
            units.append(recv(stage + 1, "pp_recv_bwd"))
        if stage > 0:
            units.append(send(stage - 1, "pp_send_bwd"))
    grads = [[1 << 22]]
    units.append(Unit("dp", "coll", (Op("nccl:all_reduce", grads, grads, "Float", False, "pp_dp_ar"),)))
    return units


_PP_FRAMES = {
    "pp_recv_fwd": _frames("recv", "recv_activations", 162),
    "pp_send_fwd": _frames("send", "send_activations", 170),
    "pp_recv_bwd": _frames("recv", "recv_gradients", 178),
    "pp_send_bwd": _frames("send", "send_gradients", 186),
    "pp_dp_ar": _frames("all_reduce", "allreduce_gradients", 194),
}


def _coalesced_loop(layout: Layout, rank: int, version: tuple[int, int]) -> list[Unit]:
    tp, dp = layout.size, layout.ranks // layout.size
    local = rank % tp
    nxt, prv = (local + 1) % tp, (local - 1) % tp
    halo = [[2, 4096]]
    batch = (Op(f"nccl:send {local}->{nxt}", halo, halo, "BFloat16", True, "co_batch"),
             Op(f"nccl:recv {local}<-{prv}", halo, halo, "BFloat16", True, "co_batch"),
             Op("nccl:coalesced", [], [], "BFloat16", True, "co_batch", counts=False))
    three = [[4096], [8192], [1024]]
    arc = (Op("nccl:allreduce_coalesced", three, three, "BFloat16", False, "co_arc"),)
    n = 1 << 18
    parts = [Op("nccl:_reduce_scatter_base", [[dp * n * (i + 1)]], [[n * (i + 1)]], "Float", False, "co_rs")
             for i in range(3)]
    if version >= (2, 7):
        rs_block = tuple(parts) + (Op("nccl:REDUCE_SCATTER_coalesced", [], [], "Float", False, "co_rs",
                                      counts=False),)
    else:  # before FR 2.7 the members of a collective coalescing block were not recorded
        rs_block = (Op("nccl:coalesced", [], [], "Float", False, "co_rs", counts=False),)
    agc = (Op("nccl:all_gather_into_tensor_coalesced", [[n], [2 * n]], [[dp * n], [2 * dp * n]], "BFloat16",
              False, "co_agc"),)
    return [Unit("tp", "batch", batch), Unit("tp", "coll", arc), Unit("dp", "coll", rs_block),
            Unit("dp", "coll", agc)]


_CO_FRAMES = {
    "co_batch": _frames("batch_isend_irecv", "exchange_halo", 48),
    "co_arc": _frames("all_reduce_coalesced", "allreduce_norms", 66, module=True),
    "co_rs": _frames("_coalescing_manager", "reduce_gradients", 112),
    "co_agc": _frames("all_gather_coalesced", "gather_parameters", 126),
}


# ------------------------------------------------------------------------------------------ the scenario

@dataclass
class Spec:
    ranks: int = 64
    tp: int = 8
    pp: int = 4
    entries: int = 2000
    scenario: str = "tp_skip"
    culprit: int | None = None
    missing: int | None = None
    version: str = "2.10"
    fmt: str = "pickle"
    prefix: str = "nccl_trace_rank_"
    timing: bool = True
    lookahead: int | None = None
    behind: int = 3


@dataclass
class Plan:
    """Everything a worker needs to write a rank's file (inherited through fork)."""
    spec: Spec
    layout: Layout
    loops: dict = field(default_factory=dict)          # rank -> list[Unit] (shared lists by role)
    frames: dict = field(default_factory=dict)
    last_step: int = 0
    pos: dict = field(default_factory=dict)            # rank -> unit index its stream is at (global)
    issued: dict = field(default_factory=dict)         # rank -> units issued (global)
    unretired_completed: bool = False


def _loop_for(spec: Spec, layout: Layout, rank: int) -> list[Unit]:
    if spec.scenario == "p2p":
        return _pp_loop(layout, rank)
    if spec.scenario == "coalesced":
        return _coalesced_loop(layout, rank, _version_tuple(spec.version))
    if spec.scenario == "behind":
        return _ddp_loop(layout, rank)
    return _tp_dp_loop(layout, rank)


def _entries_per_step(loop: list[Unit]) -> int:
    return sum(len(u.ops) for u in loop)


def _default_culprit(spec: Spec, layout: Layout) -> int:
    groups = spec.ranks // layout.size
    return (groups // 2) * layout.size + min(1, layout.size - 1)


class _Keys:
    """Cross-rank identity of a rank's unit: equal keys on two ranks = the same collective / message."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self._cache: dict[int, list] = {}
        self._members: dict[tuple[str, int], tuple[int, ...]] = {}

    def _step_keys(self, rank: int) -> list:
        """Per unit of one step: (group, kind-tag, index within the step) and the member ranks."""
        if rank in self._cache:
            return self._cache[rank]
        layout = self.plan.layout
        out = []
        counters: dict = defaultdict(int)
        for unit in self.plan.loops[rank]:
            g = layout.group_of(rank, unit.group)
            if unit.kind == "p2p":
                src, dst = (rank, unit.peer) if unit.send else (unit.peer, rank)
                tag = (g, "p2p", src, dst)
                members = (src, dst)
            else:
                tag = (g, unit.kind)
                if g not in self._members:
                    self._members[g] = tuple(layout.members(g))
                members = self._members[g]
            out.append((tag, counters[tag], members))
            counters[tag] += 1
        per_step = dict(counters)
        out = [(tag, idx, members, per_step[tag]) for tag, idx, members in out]
        self._cache[rank] = out
        return out

    def key(self, rank: int, unit_index: int):
        loop_len = len(self.plan.loops[rank])
        step, j = divmod(unit_index, loop_len)
        tag, idx, members, per_step = self._step_keys(rank)[j]
        return (tag, step * per_step + idx), members


def _simulate(plan: Plan, stop: dict[int, int], lookahead: int) -> None:
    """Run the last steps: every rank's stream from the start of the last step until nothing moves."""
    keys = _Keys(plan)
    ranks = range(plan.spec.ranks)
    pos = {r: plan.last_step * len(plan.loops[r]) for r in ranks}
    arrived: dict = defaultdict(set)
    todo = list(ranks)
    while todo:
        r = todo.pop()
        if pos[r] >= stop[r]:
            continue
        key, members = keys.key(r, pos[r])
        got = arrived[key]
        if r in got:
            continue
        got.add(r)
        if len(got) == len(members):
            del arrived[key]
            for m in members:
                pos[m] += 1
                todo.append(m)
    plan.pos = pos
    plan.issued = {r: min(stop[r], pos[r] + 1 + lookahead) for r in ranks}


def plan_scenario(spec: Spec) -> Plan:
    if spec.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {spec.scenario!r}; one of {', '.join(SCENARIOS)}")
    if spec.version not in VERSIONS:
        raise ValueError(f"unknown FR version {spec.version!r}; one of {', '.join(VERSIONS)}")
    second, size = ("pp", spec.pp) if spec.scenario == "p2p" else ("tp", spec.tp)
    if size < 2 or spec.ranks % size or spec.ranks < 2 * size:
        raise ValueError(f"--ranks ({spec.ranks}) must be a multiple of --{second} ({size}), at least twice it, "
                         f"and --{second} at least 2")
    layout = Layout(spec.ranks, size, second)
    plan = Plan(spec, layout)
    frames = {"p2p": _PP_FRAMES, "coalesced": _CO_FRAMES, "behind": _DDP_FRAMES}.get(spec.scenario, _TP_DP_FRAMES)
    plan.frames = frames
    by_role: dict = {}
    for r in range(spec.ranks):
        # a p2p loop names its peers' global ranks: one per rank; a coalesced loop names group-local ranks
        role = r if spec.scenario == "p2p" else (r % size if spec.scenario == "coalesced" else 0)
        if role not in by_role:
            by_role[role] = _loop_for(spec, layout, r)
        plan.loops[r] = by_role[role]
    min_step_entries = min(_entries_per_step(loop) for loop in by_role.values())
    steps = -(-(spec.entries + spec.entries // 4) // min_step_entries) + 2
    plan.last_step = steps - 1

    culprit = spec.culprit
    if culprit is None and spec.scenario not in ("healthy", "states"):
        culprit = _default_culprit(spec, layout)
        if spec.scenario == "p2p":
            culprit = (spec.ranks // size // 2) * size + max(1, size // 2)
    if culprit is not None and not 0 <= culprit < spec.ranks:
        raise ValueError(f"--culprit {culprit} is not a rank of {spec.ranks}")
    spec.culprit = culprit
    if spec.scenario == "missing" and spec.missing is None:
        spec.missing = culprit

    infinite = 1 << 60
    if spec.scenario in ("healthy", "states"):
        lookahead = spec.lookahead if spec.lookahead is not None else (2 if spec.scenario == "states" else 0)
        j = 2  # the snapshot: every stream in the DP reduce_scatter of the last step
        plan.pos = {r: plan.last_step * len(plan.loops[r]) + j for r in range(spec.ranks)}
        plan.issued = {r: p + 1 + lookahead for r, p in plan.pos.items()}
        plan.unretired_completed = spec.scenario == "states"
        return plan

    lookahead = spec.lookahead if spec.lookahead is not None else 0
    stop = {r: infinite for r in range(spec.ranks)}
    base = plan.last_step * len(plan.loops[culprit])
    if spec.scenario in ("tp_skip", "missing"):
        stop[culprit] = base                      # never enters the first TP all_reduce of the last step
    elif spec.scenario == "coalesced":
        stop[culprit] = base + 2                  # never enters the DP reduce_scatter block
    elif spec.scenario == "p2p":
        loop = plan.loops[culprit]
        recvs = [j for j, u in enumerate(loop) if u.kind == "p2p" and not u.send]
        stop[culprit] = base + recvs[1]           # never posts its recv of forward microbatch 1
    elif spec.scenario == "behind":
        stop[culprit] = base + 1
        lookahead = spec.behind - 1
    # a running rank issues at most through the step after the last one (the cascade may need it)
    for r in range(spec.ranks):
        stop[r] = min(stop[r], (plan.last_step + 2) * len(plan.loops[r]))
    _simulate(plan, stop, lookahead)
    return plan


# ------------------------------------------------------------------------------------------- the entries

def _seq_tables(plan: Plan, rank: int):
    """Per unit of the rank's loop: per its group, the (collective, p2p, op) counts before the unit within a
    step, and the per-step totals per group."""
    loop = plan.loops[rank]
    counts: dict = defaultdict(lambda: [0, 0, 0])
    before = []
    for unit in loop:
        c = counts[unit.group]
        before.append(tuple(c))
        if unit.kind == "coll":
            c[0] += 1
        else:
            c[1] += 1
        c[2] += sum(1 for op in unit.ops if op.counts)
    return before, {g: tuple(v) for g, v in counts.items()}


def rank_dump(plan: Plan, rank: int) -> dict:
    """The dict the rank's FR dump holds (for --format json the caller converts it)."""
    spec, layout = plan.spec, plan.layout
    version = _version_tuple(spec.version)
    loop = plan.loops[rank]
    loop_len = len(loop)
    per_step_entries = _entries_per_step(loop)
    before, totals = _seq_tables(plan, rank)
    groups = layout.rank_groups(rank)
    pg_id = {g[0]: i for i, g in enumerate(groups)}
    pg_name = {g[0]: layout.name_desc(g) for g in groups}
    pos, issued = plan.pos[rank], plan.issued[rank]
    jitter = (rank * 7919) % 50_000  # ns: ranks do not record at the same instant
    frames_cache = plan.frames
    thread_keys = version >= (2, 10)
    thread_id = str(139_800_000_000_000 + rank * 4096)

    # which units to emit: enough from the end to fill the ring
    first_unit = issued
    count = 0
    while first_unit > 0 and count < spec.entries:
        first_unit -= 1
        count += len(loop[first_unit % loop_len].ops)
    step0, j0 = divmod(first_unit, loop_len)
    record_id = step0 * per_step_entries + sum(len(u.ops) for u in loop[:j0])

    entries = []
    last_completed_unit = pos - 1
    seq_done: dict = {}
    for u in range(first_unit, issued):
        step, j = divmod(u, loop_len)
        unit = loop[j]
        coll0, p2p0, op0 = before[j]
        tc, tp2, to = totals[unit.group]
        coll = step * tc + coll0 + (1 if unit.kind == "coll" else 0)
        p2p = step * tp2 + p2p0 + (0 if unit.kind == "coll" else 1)
        op_id = step * to + op0
        created = T0_NS + step * STEP_NS + j * (STEP_NS // loop_len) + jitter
        if u < pos:
            state = "completed"
        elif u == pos:
            state = "started" if spec.timing else "scheduled"
        else:
            state = "scheduled"
        name, desc = pg_name[unit.group]
        for k, op in enumerate(unit.ops):
            if op.counts:
                op_id += 1
            e: dict[str, Any] = {"frames": list(frames_cache[op.frames]), "record_id": record_id,
                                 "pg_id": pg_id[unit.group], "process_group": (name, desc)}
            if thread_keys:
                e["thread_name"] = THREAD_NAME
                e["thread_id"] = thread_id
            e["collective_seq_id"] = coll
            e["p2p_seq_id"] = p2p
            e["op_id"] = op_id
            e["profiling_name"] = op.name
            t = created + k * 20_000
            e["time_created_ns"] = t
            started_ns = completed_ns = None
            if state == "completed":
                dur_ns = 1_500_000 + (hash((j, k)) % 1000) * 1_000
                if spec.timing:
                    started_ns = t + 40_000
                    e["duration_ms"] = dur_ns / 1e6
                completed_ns = t + 40_000 + dur_ns + 200_000
            elif state == "started":
                started_ns = t + 40_000
            e["input_sizes"] = op.in_sizes
            e["input_dtypes"] = [op.dtype] * len(op.in_sizes)
            e["output_sizes"] = op.out_sizes
            e["output_dtypes"] = [op.dtype] * len(op.out_sizes)
            e["state"] = state
            e["time_discovered_started_ns"] = started_ns
            e["time_discovered_completed_ns"] = completed_ns
            e["retired"] = state == "completed" and not (plan.unretired_completed and u == last_completed_unit)
            e["timeout_ms"] = TIMEOUT_MS
            e["is_p2p"] = op.is_p2p
            entries.append(e)
            record_id += 1
        if unit.kind == "coll":
            st = seq_done.setdefault(unit.group, [0, -1, 0])
            st[0] = coll
            if state == "completed":
                st[2] = coll
            elif state == "started":
                st[1] = coll
    entries = entries[-spec.entries:]

    pg_config = {}
    for g in groups:
        name, desc = layout.name_desc(g)
        pg_config[name] = {"name": name, "desc": desc, "ranks": "[" + ", ".join(map(str, layout.members(g))) + "]"}
    pg_status = {}
    for i, g in enumerate(groups):
        enq, started, done = seq_done.get(g[0], [0, -1, 0])
        if g[0] not in seq_done:  # no collective of this group in the window: count the whole loop's
            enq = done = 0
        if spec.timing and started == -1:
            started = done
        pg_status[str(i)] = {"last_enqueued_collective": enq, "last_started_collective": started,
                             "last_completed_collective": done}
    dump: dict[str, Any] = {"version": spec.version, "pg_config": pg_config}
    if version >= (2, 10):
        dump["comm_lib_version"] = COMM_LIB_VERSION
    elif version >= (2, 6):
        dump["nccl_version"] = COMM_LIB_VERSION
    dump["pg_status"] = pg_status
    dump["entries"] = entries
    return dump


def to_json(dump: dict) -> str:
    """The dump in the form ``_dump_fr_trace_json`` writes: no frames, absent times as 0, pg_status values as
    strings, ``nccl_comm_state`` {} and no ``entries`` key when there are none."""
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in dump["pg_status"].items()}
    entries = []
    for e in dump["entries"]:
        j = {k: v for k, v in e.items() if k != "frames"}
        j["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            if j[k] is None:
                j[k] = 0
        entries.append(j)
    if entries:
        out["entries"] = entries
    out["nccl_comm_state"] = {}
    return json.dumps(out, sort_keys=True)


_PLAN: Plan | None = None


def _write_rank(args: tuple[str, int]) -> int:
    outdir, rank = args
    plan = _PLAN
    assert plan is not None
    dump = rank_dump(plan, rank)
    path = os.path.join(outdir, f"{plan.spec.prefix}{rank}")
    if plan.spec.fmt == "json":
        data = to_json(dump).encode()
    else:
        data = pickle.dumps(dump, protocol=2)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def truth(plan: Plan) -> dict:
    """What happened: the culprit, the rank whose file is missing, and per rank the unit its stream waits in
    (group desc, profiling name, collective_seq_id / p2p_seq_id) or None when it waits in none."""
    spec, layout = plan.spec, plan.layout
    waits: dict[str, Any] = {}
    for r in range(spec.ranks):
        p, issued = plan.pos[r], plan.issued[r]
        if p >= issued:
            waits[str(r)] = None
            continue
        loop = plan.loops[r]
        step, j = divmod(p, len(loop))
        unit = loop[j]
        before, totals = _seq_tables(plan, r)
        tc, tp2, _ = totals[unit.group]
        seq = (step * tc + before[j][0] + 1) if unit.kind == "coll" else (step * tp2 + before[j][1] + 1)
        _, desc = layout.name_desc(layout.group_of(r, unit.group))
        waits[str(r)] = {"group": desc, "op": unit.ops[0].name,
                         "seq_kind": "collective_seq_id" if unit.kind == "coll" else "p2p_seq_id", "seq": seq}
    return {"scenario": spec.scenario, "ranks": spec.ranks, "group_size": layout.size, "version": spec.version,
            "culprit": spec.culprit, "missing": spec.missing if spec.scenario == "missing" else None,
            "waits": waits}


def generate(outdir: str, *, jobs: int | None = None, **kwargs: Any) -> dict:
    """Write ``<outdir>/<prefix><rank>`` for every rank of the scenario (see the module's docstring) and return
    its ``truth()`` plus ``bytes`` (all files together) and ``files``. ``kwargs`` are ``Spec``'s fields:
    ranks, tp, pp, entries, scenario, culprit, missing, version, fmt ("pickle" | "json"), prefix, timing,
    lookahead, behind. ``jobs`` worker processes write the files (default: the CPUs; 1 writes in-process)."""
    global _PLAN
    spec = Spec(**kwargs)
    plan = plan_scenario(spec)
    os.makedirs(outdir, exist_ok=True)
    ranks = [r for r in range(spec.ranks) if not (spec.scenario == "missing" and r == spec.missing)]
    _PLAN = plan
    try:
        jobs = jobs or os.cpu_count() or 1
        if jobs == 1 or len(ranks) < 16:
            sizes = [_write_rank((outdir, r)) for r in ranks]
        else:
            import multiprocessing
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                sizes = pool.map(_write_rank, [(outdir, r) for r in ranks], chunksize=8)
    finally:
        _PLAN = None
    out = truth(plan)
    out["bytes"] = sum(sizes)
    out["files"] = len(ranks)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--tp", type=int, default=8, help="TP group size (consecutive ranks)")
    ap.add_argument("--pp", type=int, default=4, help="pipeline group size, scenario p2p")
    ap.add_argument("--entries", type=int, default=2000, help="ring buffer: entries kept per rank")
    ap.add_argument("--scenario", choices=SCENARIOS, default="tp_skip")
    ap.add_argument("--culprit", type=int, default=None, help="the rank to blame (default: a middle rank)")
    ap.add_argument("--missing", type=int, default=None, help="scenario missing: the rank without a file")
    ap.add_argument("--format", dest="fmt", choices=("pickle", "json"), default="pickle")
    ap.add_argument("--version", choices=VERSIONS, default="2.10", help="FR version string to write")
    ap.add_argument("--prefix", default="nccl_trace_rank_")
    ap.add_argument("--no-timing", dest="timing", action="store_false",
                    help="as without TORCH_NCCL_ENABLE_TIMING: no 'started', no duration_ms")
    ap.add_argument("--lookahead", type=int, default=None,
                    help="units a running rank issues past the one it waits in")
    ap.add_argument("--behind", type=int, default=3, help="scenario behind: how many collectives behind")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--waits", action="store_true", help="print every rank's wait, not only a summary")
    a = ap.parse_args(argv)
    kwargs = {k: v for k, v in vars(a).items() if k not in ("outdir", "jobs", "waits")}
    try:
        result = generate(a.outdir, jobs=a.jobs, **kwargs)
    except ValueError as e:
        ap.error(str(e))
    if not a.waits:
        summary: dict = defaultdict(int)
        for w in result["waits"].values():
            summary["none" if w is None else f"{w['op']} #{w['seq']} of {w['group'].split('_')[0]}_*"] += 1
        result["waits"] = dict(summary)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
