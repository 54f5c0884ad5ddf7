"""Rank side: records every torch.distributed collective a rank issues from Python.

Installed once in the fork server, before any library is imported, so that libraries binding
``from torch.distributed import all_gather`` at import time get the traced function too. Each call
(one test body on a rank) gets a fresh journal; outside a call the wrappers cost one global lookup.

This module wraps the c10d functions (``dist.all_reduce``, ...) and ``Work.wait``; ``install`` also
installs the tracers of functional collectives (DTensor, FSDP2's state dicts, compiled graphs:
``trace_functional.py``), of ProcessGroup objects and side groups (``trace_groups.py``), and of
stores and groups being created (``trace_rendezvous.py``). What none of them sees (DDP's C++
reducer) the Flight Recorder records; the controller merges both (see ``flight.py``).
"""

from __future__ import annotations

import inspect
import os
import sys
import zlib
from time import perf_counter, perf_counter_ns

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..core.ops import P2P_OPS, SPLIT_OPS
from . import flight_api, trace_sites
from . import trace_completion as completion
from . import trace_core as core
from .trace_args import ALWAYS_ASYNC, COMPOSITE, CONTRIBUTED, _arguments, _memo_params
from .trace_core import describe, local, pg_label  # noqa: F401 (the tracer's API)
from .trace_sites import call_site  # noqa: F401

E_LINE, E_LINE_NO_FR = core.E_LINE, core.E_LINE_NO_FR


# The body of every traced c10d function, specialized per op at install time: the wrapper takes the
# real function's parameters (no *args/**kwargs to pack and search: the hot path reads locals).
# {params}, {call}: the signature and the call; {group}, {async_op}, {value}, {key}: expressions
# for the group, the async flag, the tensor this rank contributes and the memo key; {pos}/{kw}: the
# positional and keyword arguments, for the argument readers (_arguments) on a memo miss.
_TEMPLATE = """
def {name}({params}):
    trace = core.active
    if trace is None or local.inside:
        return fn({call})
    group = {group}
    if group is non_member:  # this rank is not in the group: c10d returns at once, nothing to journal
        return fn({call})
    g = trace.by_id.get(id(group))
    if g is None:
        g = core.group_trace(trace, group)
    async_op_ = {async_op}
    value = {value}
    found = key = None
    if keyed and (value is None or type(value) is Tensor):
        key = {key}
        try:
            found = memo.get(key)
        except TypeError:  # an argument that cannot key a memo (a custom ReduceOp)
            key = None
    if found is None:
        found = describe_call(g, value, ({pos}), {{{kw}}}, group)
        if key is not None and len(memo) < 10_000:
            memo[key] = found
    described, extra, data, plain = found
    if p2p:  # point-to-point: numbered apart, matched as pairs (core/waits.py)
        g.p2p_seq = seq = g.p2p_seq + 1
        label, e_line, c_start = g.p2p_label, g.p2p_e_line, g.p2p_c_line
    else:
        g.seq = seq = g.seq + 1
        label, e_line, c_start = g.label, g.e_line, g.c_line
        if data is not None:
            g.digest = crc32(data, g.digest)
        else:  # split sizes: consistency across ranks, not equality (core/agreement.py's digests_agree)
            if g.splits is None:
                g.splits = []
            g.splits.append((seq, plain[6:]))
    try:
        fr_seq = g.fr_seq() + 1
    except Exception:  # a group without sequence numbers: the field stays empty
        fr_seq = None
    now = perf_counter_ns() - trace.t0_ns
    frame = getframe(1)  # the last call site again (a loop), else trace_sites.site_of
    if frame is trace.site_frame and frame.f_lasti == trace.site_lasti and frame.f_back is trace.site_back:
        site = trace.site_text
    else:
        site = site_of(trace, frame)
    if fr_seq is None:
        line = E_LINE_NO_FR % (e_line, seq, mid_async if async_op_ else mid_sync, now, described, site, extra)
    else:
        line = E_LINE % (e_line, seq, mid_async if async_op_ else mid_sync, now, described, fr_seq, site, extra)
    pending = trace.pending
    if pending is not trace.flushed:  # the previous collective's C line goes first, in the same write
        trace.flushed = pending
        line = pending + line
    # one write, before entering: what survives a SIGABRT inside the collective
    write(trace.fd, line)
    local.inside = True
    local.work = None
    try:
        result = fn({call})
    except BaseException:
        if trace.raise_leaves:  # the rank is out of it: a test that expects the error goes on
            write(trace.fd, c_line % (c_start, seq, perf_counter_ns() - trace.t0_ns))
        raise
    finally:
        local.inside = False
    work = local.work  # what the group's method returned (trace_groups.py), if it went through one
    if work is not None:
        local.work = None  # not held: its tensors are the job's
    if async_op_ and result is not None:
        pend(trace, g, value, result, label, seq, ({pos}))
    elif g.early != ON_RETURN and (held := incomplete(g, value, work)) is not None:  # NCCL: enqueued, not run
        returned_incomplete(trace, held, label, seq)
    else:  # written with the next line, or by the flusher thread (trace_completion.FLUSH_EVERY)
        trace.pending = c_line % (c_start, seq, perf_counter_ns() - trace.t0_ns)
    if composite:
        try:
            write(trace.fd, f"R\\t{{label}}\\t{{seq}}\\t{{g.pg._get_sequence_number_for_group()}}\\n".encode())
        except Exception:  # a C++ method, or a closed journal: no R line
            pass
    return result
"""


def _pend(trace, g, value, result, label: str, seq: int, args: tuple) -> None:
    """An async collective: it completes in Work.wait (trace_completion.traced_wait), or later (NCCL)."""
    watch = completion.watched(g, value)
    if isinstance(result, list):  # batch_isend_irecv: one Work per transfer, or one for all
        count = len(args[0]) if args and args[0] is not None else 0
        for i, work in enumerate(result):
            trace.async_pending[id(work)] = (work, label, seq, i if len(result) == count > 1 else -1, watch)
            completion.adopt_work(type(work))
    else:
        trace.async_pending[id(result)] = (result, label, seq, -1, watch)
        completion.adopt_work(type(result))


# what new_group returns on a rank outside the group; c10d functions given it return at once
_NON_MEMBER = getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object())


def _wrap(name: str, fn):
    """``fn`` traced: a function with its parameters and defaults that journals the call (the E
    line) before entering it."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    params = list(signature.parameters.values())
    kinds = {p.kind for p in params}
    if kinds - {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY} or \
            any(not p.name.isidentifier() or p.name in _RESERVED for p in params):
        return fn  # *args, **kwargs or a name the body uses: left untraced rather than traced wrong
    names = [p.name for p in params]
    positional = [p.name for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword = [p.name for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
    tensor_name = CONTRIBUTED.get(name)
    keyed = _memo_params(name)
    raw = [k if k in names else "None" for k in keyed or ()]
    if name == "batch_isend_irecv":
        group = f"getattr({positional[0]}[0], 'group', None) if {positional[0]} else None"
    else:
        group = "group" if "group" in names else "None"
    source = _TEMPLATE.format(
        name=name, params=", ".join(positional) + (", *, " + ", ".join(keyword) if keyword else ""),
        call=", ".join(positional + [f"{k}={k}" for k in keyword]), group=group,
        async_op="True" if name in ALWAYS_ASYNC else "bool(async_op)" if "async_op" in names else "False",
        value=tensor_name if tensor_name in names else "None",
        key=(f"(g, value.shape, value.dtype, {', '.join(raw)})" if tensor_name in names else
             f"(g, {', '.join(raw)})") if raw else
            ("(g, value.shape, value.dtype)" if tensor_name in names else "(g,)"),
        pos=", ".join(positional) + ("," if len(positional) == 1 else ""), kw=", ".join(f"'{k}': {k}" for k in keyword))
    split, p2p = name in SPLIT_OPS, name in P2P_OPS
    arguments = _arguments(name, positional + keyword)

    def describe_call(g, value, args, kwargs, group):
        """What the E line says of this call besides its position, and what goes into the digest."""
        shapes, dtype = describe(value)
        extra = ""
        if arguments is not None:
            try:
                extra = arguments(args, kwargs, group)
            except Exception:  # the op itself will say what is wrong with its arguments
                extra = ""
        return core.call_fields(g, name, shapes, dtype, extra, agreed=not p2p and not split)

    namespace = {
        "core": core, "local": local, "fn": fn, "non_member": _NON_MEMBER, "Tensor": torch.Tensor, "memo": {},
        "keyed": keyed is not None,
        "describe_call": describe_call, "p2p": p2p, "crc32": zlib.crc32, "perf_counter_ns": perf_counter_ns,
        "site_of": trace_sites.site_of, "getframe": sys._getframe, "E_LINE": E_LINE, "E_LINE_NO_FR": E_LINE_NO_FR,
        "mid_sync": f"\t{name}\t0\t".encode(), "mid_async": f"\t{name}\t1\t".encode(), "write": os.write,
        "c_line": core.C_LINE, "pend": _pend, "composite": name in COMPOSITE,
        "incomplete": completion.incomplete, "returned_incomplete": completion.returned_incomplete,
        "ON_RETURN": completion.ON_RETURN,
    }
    exec(compile(source, __file__, "exec"), namespace)  # frames in this file: no call site, no stack line
    traced = namespace[name]
    traced.__defaults__ = tuple(p.default for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
                                and p.default is not inspect.Parameter.empty) or None
    traced.__kwdefaults__ = {p.name: p.default for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY
                             and p.default is not inspect.Parameter.empty} or None
    traced.__qualname__ = getattr(fn, "__qualname__", name)
    traced.__doc__ = fn.__doc__
    core.mark_traced(traced, fn)
    return traced


# names the generated body uses for itself: a parameter with one of them cannot be traced this way
# (``group`` is not one: the body reads the function's own ``group`` parameter)
_RESERVED = frozenset({"trace", "g", "async_op_", "value", "found", "key", "described", "extra", "data",
                       "plain", "seq", "label", "e_line", "c_start", "fr_seq", "now", "frame", "site", "line",
                       "pending",
                       "result", "work", "held", "incomplete", "returned_incomplete", "ON_RETURN",
                       "core", "local", "fn", "Tensor", "memo", "keyed", "describe_call", "p2p", "crc32",
                       "perf_counter_ns", "site_of", "getframe", "E_LINE", "E_LINE_NO_FR", "mid_sync", "mid_async",
                       "write", "c_line", "pend", "composite"})


_installed = False


def install() -> None:
    """Patch the collectives in ``torch.distributed`` and ``distributed_c10d`` (where internal calls
    such as all_gather_object -> all_gather resolve), ``Work.wait`` for async completion, and install
    the tracers of functional collectives, ProcessGroup objects and rendezvous."""
    global _installed
    if _installed:
        return
    core.replace_c10d(CONTRIBUTED, _wrap)
    if not getattr(dist.Work.wait, "_pytest_nccl_traced", False):
        setattr(dist.Work, "wait", completion.traced_wait(dist.Work.wait))  # noqa: B010  (torch's C++ class)
    from . import trace_functional, trace_groups, trace_rendezvous
    trace_functional.install()
    trace_groups.install()
    trace_rendezvous.install()
    _installed = True


def start(journal_path: str, raise_leaves: bool = False) -> None:
    """A fresh journal for one call. Frames from the caller down (the rank loop) are the harness:
    call sites stop there. ``raise_leaves``: a collective that raised is journaled as left (an
    adopted test of torch's suites catches the errors it provokes, as a monitored_barrier's timeout,
    and goes on); otherwise it stays entered, where the rank raised."""
    trace_sites.mark_boundary(sys._getframe(1).f_code)
    completion.start_flusher()
    core.active = core.CallTrace(journal_path)
    core.active.raise_leaves = raise_leaves


def stop() -> tuple[dict[str, tuple], int]:
    """End the call's trace; return per process group (count, crc of what every rank must agree on:
    op, shapes, dtype, reduce op, root), plus the split sizes of its all_to_alls where it ran any
    (``(seq, "sent/expected")`` each), which the controller compares across ranks without reading
    the journals (``diagnose.digests_agree``); and how many collectives are still in flight (async
    ones never waited for, and NCCL's whose work did not complete)."""
    trace = core.active
    if trace is None:
        return {}, 0
    core.active = None
    now = perf_counter() - trace.t0
    dangling = 0
    for work, label, seq, index, _ in [*trace.async_pending.values(), *trace.in_flight.values()]:
        try:
            if work.is_completed():
                trace.writer.completed(label, seq, now, index)
            else:
                dangling += 1
        except Exception:  # a Work of a backend that is gone, whatever it raises: not counted
            pass
    # functional collectives nobody waited on: the backend ran them; the rank is out of the test
    for entry in trace.functional.values():
        if entry[2] is not None:
            trace.writer.completed(entry[0].decode(), entry[1], now)
            entry[2] = None
    core.close(trace)
    digests = {}
    for g in trace.by_label.values():
        if g.seq:
            digests[g.label] = (g.seq, g.digest, tuple(g.splits)) if g.splits else (g.seq, g.digest)
        if g.p2p_seq:  # how many transfers: their pairing is checked on the journals (core/diagnosis/pairing.py)
            digests[g.p2p_label] = (g.p2p_seq, 0)
    return digests, dangling


def journal_fd(path: str) -> int:
    """The descriptor the running trace writes its journal ``path`` to, or -1 (no trace, or another
    one: an SPMD session's or the rank loop's own per-test trace in a watched process, which the
    watch's rotation must not point at its file): ``pytest-nccl watch`` bounds a long job's journal
    by pointing it at a fresh file (``os.dup2``), keeping the last segment."""
    trace = core.active
    return trace.fd if trace is not None and trace.path == path else -1


def flight_recorder_json() -> str | None:
    try:
        return flight_api.dump_json().decode()
    except Exception:  # no Flight Recorder in this build or version, whatever it raises
        return None


def _pg_config() -> dict:
    """What torch's fr_trace analyzer needs to match entries across ranks; gloo's Flight Recorder
    leaves it empty, so it is rebuilt from c10d's own registry."""
    config = {}
    for pg, ranks in list(getattr(c10d._world, "pg_group_ranks", {}).items()):
        try:
            name = pg.group_name
            desc = getattr(pg, "group_desc", "") or ("default_pg" if pg is c10d.GroupMember.WORLD else "undefined")
        except Exception:  # a group being destroyed: its C++ properties raise
            continue
        config[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
    return config


def flight_recorder_pickle() -> bytes | None:
    try:
        import pickle
        # without stack traces: symbolizing them imports torch._dynamo (about 4 s) in a stuck rank
        dump = pickle.loads(flight_api.dump_pickle(True, False, False))
        config = _pg_config()
        if config:
            dump["pg_config"] = config
        for entry in dump.get("entries", []):
            entry.setdefault("frames", [])
        return pickle.dumps(dump)
    except Exception:  # the dump is optional: whatever torch raises, none
        return None
