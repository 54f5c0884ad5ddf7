"""Rank side of ``pytest-nccl watch``: a process creating a side group, a group made outside
``init_process_group`` over a rendezvous of its own (OpenRLHF's weight-sync group between the
trainer's rank 0 and the inference engines, which never create a default group), is noted as a
member joining that group while its creation waits, as ``init_process_group`` is (``inject.py``):
``joining-PID.json`` with ``what`` "group", the group's name, its store's host:port, this member's
rank, the group's size and the line that creates it. Once the group exists the note goes and the
process is marked a member (``member-PID``). The watch (``outcome.waited_for_peers``) takes the
members of one store for one group: members that waited ``--timeout`` while fewer than its size
joined are a verdict naming the ones that never connected.

Three ways in, each noted only when called from outside torch (torch's own ``init_process_group``
and ``new_group`` use them too, and are followed as themselves):

- ``rendezvous(url, rank, world_size)`` (torch.distributed's; OpenRLHF calls it): the store is
  made when its iterator is advanced; a ``tcp://`` server waits there for every member
  (TCPStore's ``wait_for_workers``). Its group name is the caller's ``group_name`` where it has one
  (OpenRLHF's and torch's copies of ``init_process_group`` do): the store has none yet.
- ``_new_process_group_helper(size, rank, [], backend, store, group_name)`` with no global ranks: a
  group outside the world (OpenRLHF's next step: gloo waits there for every member's address).
- ``ProcessGroupGloo(store, rank, size)`` and the other backends' constructors.

Nothing here may break the user's job: a note that cannot be written is left out.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from ...core import jobdir

WHAT = "group"  # JoiningNote.what of a side group's member (outcome.Waits.GROUP)
WRAPPED = "_pytest_nccl_watch"  # inject.WRAPPED: never wrapped twice
# inject.py's, given to ``install`` (this module is inject's: it does not import it back)
_note_joining: Callable[..., str | None] = lambda **kwargs: None  # noqa: E731
_unlink: Callable[[str | None], None] = lambda path: None  # noqa: E731


def install(note_joining: Callable[..., str | None], unlink: Callable[[str | None], None]) -> None:
    """Wrap the three ways in; ``note_joining``/``unlink`` write and remove a ``joining-PID.json``."""
    global _note_joining, _unlink
    _note_joining, _unlink = note_joining, unlink
    import torch._C._distributed_c10d as C
    import torch.distributed.distributed_c10d as c10d

    for module_name in ("torch.distributed.rendezvous", "torch.distributed.distributed_c10d", "torch.distributed"):
        module = sys.modules.get(module_name)
        real = getattr(module, "rendezvous", None)
        if real is not None and not getattr(real, WRAPPED, False):
            setattr(module, "rendezvous", _noted_rendezvous(real))  # noqa: B010  (re-exported by name)
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is not None and not getattr(helper, WRAPPED, False):
        c10d._new_process_group_helper = _noted(helper, _helper_args)
    for name in ("ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupXCCL"):
        backend = getattr(C, name, None)
        init = getattr(backend, "__init__", None) if backend is not None else None
        if init is not None and not getattr(init, WRAPPED, False):
            setattr(backend, "__init__", _noted(init, _backend_args))  # noqa: B010  (found by name)


def _from_outside_torch() -> bool:
    from ...rank.trace_groups import caller_file
    from ...rank.trace_sites import _TORCH_DIR

    return not caller_file(3).startswith(_TORCH_DIR)


def _site(frame) -> str:
    from ...rank import tracer

    return tracer.call_site(frame)


def _joined(note: str | None) -> None:
    """The group exists: this process is a member of a side group (the watch's quiet end)."""
    _unlink(note)
    try:
        jobdir.touch(jobdir.member(jobdir.attempt_dir(os.environ[jobdir.ENV_DIR], jobdir.attempt_of(os.environ)),
                                   os.getpid()))
    except (OSError, KeyError):  # a note for the watch, never an error of the user's call
        pass


def _noted(real, describe):
    """``real`` noted as a side group's creation when called from outside torch; ``describe(args,
    kwargs)`` -> (group name, store, rank, size), or None for a group of the default world."""
    import functools

    @functools.wraps(real)
    def noted(*args, **kwargs):
        if not _from_outside_torch():
            return real(*args, **kwargs)
        note = None
        try:
            described = describe(args, kwargs)
            if described is not None:
                group, store, rank, size = described
                note = _note_joining(rank=rank, world=size, site=_site(sys._getframe(1)), what=WHAT,
                                     group=group, store=store)
        except Exception:  # the user's arguments: the real call says what is wrong
            note = None
        try:
            result = real(*args, **kwargs)
        except BaseException:
            _unlink(note)  # not waiting any more: the exception is the user's to see
            raise
        if note is not None:
            _joined(note)
        return result

    vars(noted)[WRAPPED] = True
    return noted


def _arg(args, kwargs, pos: int, name: str, default=None):
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _store_address(store) -> str:
    from ...rank.trace_rendezvous import _address

    return _address(store)


def _helper_args(args, kwargs):
    # _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, ...)
    if _arg(args, kwargs, 2, "global_ranks_in_group"):
        return None  # members placed among the world's ranks: new_group's, followed as a collective
    name = _arg(args, kwargs, 5, "group_name")
    return (str(name or ""), _store_address(_arg(args, kwargs, 4, "store")),
            _arg(args, kwargs, 1, "group_rank"), _arg(args, kwargs, 0, "group_size"))


def _backend_args(args, kwargs):
    # ProcessGroupGloo(self, store, rank, size, timeout) / ProcessGroupNCCL(self, store, rank, size, options)
    return ("", _store_address(_arg(args, kwargs, 1, "store")), _arg(args, kwargs, 2, "rank"),
            _arg(args, kwargs, 3, "size"))


def _url_address(url: str) -> str:
    """The store a rendezvous URL names: host:port for tcp:// and env:// (MASTER_ADDR/PORT)."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme == "tcp":
        return f"{parsed.hostname}:{parsed.port}"
    if parsed.scheme == "env":
        return f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return url


def _url_number(url: str, key: str):
    from urllib.parse import parse_qs, urlparse

    values = parse_qs(urlparse(url).query).get(key)
    return jobdir.int_or(values[0]) if values else None


def _noted_rendezvous(real):
    """torch's ``rendezvous`` returns an iterator; the store is made (and a server waits for its
    clients) when it is advanced: noted around each ``next``."""
    import functools

    @functools.wraps(real)
    def rendezvous(url, rank=-1, world_size=-1, **kwargs):
        iterator = real(url, rank, world_size, **kwargs)
        if not _from_outside_torch():
            return iterator
        try:
            frame = sys._getframe(1)
            group = frame.f_locals.get("group_name")
            text = str(url)
            described = (group if isinstance(group, str) else "", _url_address(text),
                         rank if rank not in (-1, None) else _url_number(text, "rank"),
                         world_size if world_size not in (-1, None) else _url_number(text, "world_size"))
            site = _site(frame)
        except Exception:  # a note for the watch, never an error of the user's call
            return iterator
        return _noted_iterator(iterator, described, site)

    vars(rendezvous)[WRAPPED] = True
    return rendezvous


def _noted_iterator(iterator, described, site: str):
    group, store, rank, size = described
    while True:
        note = _note_joining(rank=rank, world=size, site=site, what=WHAT, group=group, store=store)
        try:
            item = next(iterator)
        except StopIteration:
            _unlink(note)
            return
        except BaseException:
            _unlink(note)
            raise
        _joined(note)
        yield item
