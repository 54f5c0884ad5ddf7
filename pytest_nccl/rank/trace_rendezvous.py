"""Rank side: where a rank waits for other members outside any collective.

- ``new_group`` (and ``new_subgroups``): every rank of the default group must call it, in the same
  order, like a collective of the default group: it is journaled as one (op ``new_group``), so a rank
  that skips it is named like a rank that skips an all_reduce.
- a store or a group being created by the user's code (``TCPStore(...)``, ``ProcessGroupGloo(store,
  rank, size)``, torch's process-group helper with a store of its own) and a store read that waits
  for a key (``store.get``, ``store.wait``): journaled as a wait outside any collective (an ``O``
  line, journal.py) with the store's address, the number of members and this member's rank; while
  a group's creation waits, a thread reads which members have published their address in the
  store (gloo's keys) and journals them (``U`` lines): the diagnosis names the members that never
  joined.

Only calls from outside torch are journaled: torch's own use of stores (the default group's
rendezvous, barriers) is part of what called it.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..core.groups import clean_name
from ..core.journal import Line
from . import trace_core as core
from . import trace_groups
from .stacks import THREAD_PREFIX
from .trace_core import local
from .trace_sites import _TORCH_DIR, call_site

LABEL = "outside"             # the journal's pseudo-group of waits outside any collective
THREAD_NAME = "pytest-nccl-rendezvous"  # stacks.THREAD_PREFIX: never shown in a rank's stack
POLL = 0.25                   # seconds between two looks at who has joined
GROUP_OPS = ("new_group", "new_subgroups")




def innermost_store(store):
    """The store under any PrefixStores (a TCPStore's host and port are there)."""
    inner = store
    for _ in range(8):
        nxt = getattr(inner, "underlying_store", None)
        if nxt is None:
            break
        inner = nxt
    return inner


def _address(store) -> str:
    """host:port of a TCPStore (under any PrefixStore), else the store's type."""
    inner = innermost_store(store)
    host, port = getattr(inner, "host", None), getattr(inner, "port", None)
    return f"{host}:{port}" if host is not None and port is not None else type(inner).__name__


def enter_outside(trace: core.CallTrace, what: str, args: str, frame) -> int:
    """Journal that this rank starts waiting in ``what`` outside any collective; returns its seq."""
    seq = next(trace.outside)  # atomic: a thread of the rank (a weight-sync server) may wait too
    core.write_open(trace, (
        f"O\t{LABEL}\t{seq}\t{what}\t0\t{core.perf_counter() - trace.t0:.6f}\t\t\t\t{call_site(frame)}\t{args}\n"
    ).encode())
    return seq


def _update(trace: core.CallTrace, seq: int, args: str) -> None:
    core.write_open(trace, f"U\t{LABEL}\t{seq}\t{args}\n".encode())


class _Joined(threading.Thread):
    """While a group's creation waits: which of its ranks have published their address (gloo's
    connectFullMesh sets ``0/<group rank>`` in the group's store, for device 0). ``prefixes``: the
    key prefixes of the group's store over ``store``, one tuple per device that may hold the keys."""

    def __init__(self, trace: core.CallTrace, seq: int, store, prefixes: list, size: int):
        super().__init__(name=THREAD_NAME, daemon=True)
        self.trace, self.seq, self.store, self.prefixes, self.size = trace, seq, store, prefixes, size
        self.done = threading.Event()

    def run(self) -> None:
        local.inside = True  # the connection made here is not the user's store
        try:  # a connection of our own: the creating thread holds the store's
            base = own_connection(self.store)
            stores = []
            for prefixes in self.prefixes:
                store = base
                for prefix in reversed(prefixes):
                    store = c10d.PrefixStore(prefix, store)
                stores.append(store)
        except Exception:  # any store type (a user's too), without a connection of our own or gone: not shown
            return
        shown = None
        while not self.done.wait(POLL):
            try:
                joined = [r for r in range(self.size) if any(store.check([f"0/{r}"]) for store in stores)]
            except Exception:  # our thread: a store gone raises by its type; it ends quietly
                return
            if joined != shown and core.active is self.trace:
                shown = joined
                _update(self.trace, self.seq, f"joined={','.join(map(str, joined)) or '-'}")


def own_connection(store):
    """``store`` through a connection of this thread's own: ``Store.clone`` where torch has it; before
    it (torch 2.6), a TCPStore gets a client of its own and a HashStore (in this process) is shared;
    any other store raises (sharing its connection with a thread that waits in it is not safe)."""
    clone = getattr(store, "clone", None)
    if clone is not None:
        return clone()
    if isinstance(store, dist.TCPStore):
        return dist.TCPStore(store.host, store.port, is_master=False, timeout=datetime.timedelta(seconds=30))
    if isinstance(store, dist.HashStore):
        return store
    raise TypeError(f"no connection of our own to a {type(store).__name__} in torch {torch.__version__}")


def _waits_outside(what: str, describe):
    """A wrapper journaling a call from the user's code that may wait for other members;
    ``describe(args, kwargs)`` -> (its <args> text, the store and size to watch, or None)."""
    def wrap(real):
        def traced(*args, **kwargs):
            trace = core.active
            # the store reads of pytest-nccl's own threads (SPMD mode's decider and watchdog) are not the test's
            if (trace is None or local.inside or threading.current_thread().name.startswith(THREAD_PREFIX)
                    or trace_groups.caller_file().startswith(_TORCH_DIR)):
                return real(*args, **kwargs)
            try:
                text, watch = describe(args, kwargs)
            except Exception:  # the user's arguments: the real call says what is wrong
                return real(*args, **kwargs)
            seq = enter_outside(trace, what, text, sys._getframe(1))
            watcher = None
            if watch is not None:
                watcher = _Joined(trace, seq, *watch)
                watcher.start()
            local.inside = True
            try:
                return real(*args, **kwargs)
            finally:
                local.inside = False
                if watcher is not None:
                    watcher.done.set()
                core.write_open(trace, core.record_line(Line.COMPLETED, trace, LABEL, seq))  # the test may have ended
        core.mark_traced(traced, real)
        traced.__name__ = getattr(real, "__name__", what)
        return traced
    return wrap


def _arg(args, kwargs, pos: int, name: str, default=None):
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _tcpstore(args, kwargs):
    # TCPStore(self, host_name, port, world_size=None, is_master=False, timeout, wait_for_workers=True, ...)
    host, port = _arg(args, kwargs, 1, "host_name"), _arg(args, kwargs, 2, "port")
    size, master = _arg(args, kwargs, 3, "world_size"), _arg(args, kwargs, 4, "is_master", False)
    role = "server" if master else "client"
    return f"store={host}:{port} n={size if size is not None else '?'} role={role}", None


def _backend(args, kwargs):
    # ProcessGroupGloo(self, store, rank, size, timeout) / ProcessGroupNCCL(self, store, rank, size, options)
    store, rank, size = _arg(args, kwargs, 1, "store"), _arg(args, kwargs, 2, "rank"), _arg(args, kwargs, 3, "size")
    return f"store={_address(store)} n={size} r={rank}", (store, [()], int(size))


def _helper(args, kwargs):
    # _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, ...)
    size, rank, ranks = _arg(args, kwargs, 0, "group_size"), _arg(args, kwargs, 1, "group_rank"), \
        _arg(args, kwargs, 2, "global_ranks_in_group")
    store, name = _arg(args, kwargs, 4, "store"), _arg(args, kwargs, 5, "group_name")
    text = f"store={_address(store)} n={size} r={rank} name={clean_name(str(name))}"
    # c10d prefixes the group's store with its name, then the device; gloo with the device index
    return text, (store, [(f"{name}/", f"{device}/") for device in ("cpu", "cuda")], int(size)) \
        if not ranks else None


def _store_key(args, kwargs):
    keys = args[1] if len(args) > 1 else ""  # Store.get(self, key), Store.wait(self, keys[, timeout])
    if isinstance(keys, (list, tuple)):
        keys = ",".join(map(str, keys[:4])) + (",..." if len(keys) > 4 else "")
    key = "".join(c if c.isprintable() and c not in " \t\n" else "_" for c in str(keys))[:80]
    return f"store={_address(args[0])} key={key}", None


def _group_op(name: str, real):
    """new_group: a collective of the default group, for the referee and the diagnosis."""
    def traced(*args, **kwargs):
        trace = core.active
        if trace is None or local.inside or kwargs.get("use_local_synchronization"):
            return real(*args, **kwargs)
        g = trace.by_id[id(None)]
        # no sequence number of its own in the process group (a store barrier): fr_seq stays empty
        g.seq = seq = g.seq + 1
        g.digest = core.zlib.crc32(name.encode(), g.digest)
        os.write(trace.fd, (f"E\tdefault\t{seq}\t{name}\t0\t{core.perf_counter() - trace.t0:.6f}\t\t\t\t"
                            f"{call_site(sys._getframe(1))}\t\n").encode())
        local.inside = True
        try:
            return real(*args, **kwargs)
        finally:
            local.inside = False
            core.completed(trace, "default", seq)
    core.mark_traced(traced, real)
    traced.__name__ = name
    return traced


def install() -> None:
    import torch._C._distributed_c10d as C
    core.replace_c10d(GROUP_OPS, _group_op)
    for cls, method, what, describe in ((C.TCPStore, "__init__", "TCPStore", _tcpstore),
                                        (C.Store, "get", "store.get", _store_key),
                                        (C.Store, "wait", "store.wait", _store_key)):
        real = getattr(cls, method, None)
        if real is not None and not getattr(real, "_pytest_nccl_traced", False):
            setattr(cls, method, _waits_outside(what, describe)(real))
    for cls_name in ("ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupXCCL"):
        backend = getattr(C, cls_name, None)
        real = getattr(backend, "__init__", None) if backend is not None else None
        if real is not None and not getattr(real, "_pytest_nccl_traced", False):
            setattr(backend, "__init__",  # noqa: B010  (a backend class found by name)
                    trace_groups.named_backend_init(backend, _waits_outside(f"{cls_name}", _backend)(real)))
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is not None and not getattr(helper, "_pytest_nccl_traced", False):
        c10d._new_process_group_helper = trace_groups.named_helper(
            _waits_outside("_new_process_group_helper", _helper)(helper))
