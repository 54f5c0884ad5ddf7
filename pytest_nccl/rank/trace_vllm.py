"""Rank side of ``pytest-nccl watch``: vLLM's own groups, which never pass through c10d. TRL's GRPO
server mode (``trl/extras/vllm_client.py``) and the clients that copied it make a weight-sync group
with ``StatelessProcessGroup.create(host, port, rank, world_size)`` (a TCPStore) and a
``PyNcclCommunicator`` over it; each update is ``broadcast(weights, src=rank)`` then
``group.barrier()``. Their methods are wrapped once vLLM's modules have run (``watch/inrank/inject``
arms it) and each member keeps one note per group (``core.sidecalls.SideCall``,
``sidecall-PID-N.json`` in the attempt's directory): where it is (creating, in call #n, after it,
raised), with the op, shapes, dtype, root or peer and the line. The watch judges the notes
(``core.sidecalls.judge``).

A call made inside a traced call (``all_gather_obj``'s broadcasts, the communicator's own
``broadcast_obj`` of its unique id) is part of it. On CUDA a communicator's call returns once its
work is enqueued: it is in flight until an event recorded on its stream after it completes (polled
by one thread, as ``trace_completion`` does for NCCL). Nothing here may break the user's job: a note
that cannot be written is left out.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import sys
import threading
import time

from ..core import jobdir
from ..core.sidecalls import CallState, SideCall
from .trace_sites import call_site

GROUP_MODULE = "vllm.distributed.utils"
COMM_MODULE = "vllm.distributed.device_communicators.pynccl"
MODULES = (GROUP_MODULE, COMM_MODULE)
# StatelessProcessGroup's calls: which argument says the root or peer (None: none)
GROUP_OPS = {"broadcast_obj": "src", "all_gather_obj": None, "send_obj": "dst", "recv_obj": "src",
             "barrier": None, "broadcast": "src", "send": "dst", "recv": "src", "all_reduce": None}
# PyNcclCommunicator's: (the argument of this member's tensor, the root or peer argument)
COMM_OPS = {"broadcast": (0, "src"), "all_reduce": (0, None), "all_gather": (1, None),
            "reduce_scatter": (1, None), "send": (0, "dst"), "recv": (0, "src")}
WRAPPED = "_pytest_nccl_vllm"
ATTR = "_pytest_nccl_side_call"
POLL = 0.2  # seconds between two looks at in-flight CUDA work

_local = threading.local()
_numbers = itertools.count()


class _Member:
    """This process as one member of one group: its note, rewritten at every change."""

    def __init__(self, store: str, world: int, member: int, created_at: str):
        env = os.environ
        directory = jobdir.attempt_dir(env[jobdir.ENV_DIR], jobdir.attempt_of(env))
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"sidecall-{os.getpid()}-{next(_numbers)}.json")
        self.note = SideCall(pid=os.getpid(), start=jobdir.process_start(os.getpid()), host=socket.gethostname(),
                             store=store, world=int(world), member=int(member), created_at=created_at)
        self.lock = threading.Lock()
        self.event: object | None = None  # the last call's CUDA event while it is in flight

    def write(self, state: CallState, **changes) -> None:
        with self.lock:
            note = self.note
            note.state, note.since = state.value, time.time()
            for key, value in changes.items():
                setattr(note, key, value)
            try:
                jobdir.write_json(self.path, note.to_dict())
            except OSError:  # a note for the watch, never an error of the user's call
                pass


def _watched() -> bool:
    return bool(os.environ.get(jobdir.ENV_DIR))


def _text(value) -> str:
    """A call's argument as a headline reads it: a tensor's shape and dtype, else its type."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{list(shape)} {str(getattr(value, 'dtype', '')).removeprefix('torch.')}".strip()
    return type(value).__name__ if value is not None else ""


def _detail(contributed, peer_name: str | None, peer) -> str:
    parts = [_text(contributed)] if contributed is not None else []
    if peer_name is not None and peer is not None:
        parts.append(f"{peer_name}={peer}")
    return " ".join(p for p in parts if p)


def _traced(op: str, real, member_of, describe):
    """``real`` (a method) noted as call #n of its group while it runs; ``member_of(self)`` -> the
    ``_Member`` or None (a group this process did not see created: not followed)."""

    @functools.wraps(real)
    def traced(self, *args, **kwargs):
        member = member_of(self) if not getattr(_local, "depth", 0) else None
        if member is None:
            return real(self, *args, **kwargs)
        try:
            detail, value = describe(args, kwargs)
            site = call_site(sys._getframe(1))
        except Exception:  # the call says what is wrong with its arguments
            detail, value, site = "", None, ""
        seq = member.note.seq + 1
        member.write(CallState.IN_CALL, seq=seq, op=op, detail=detail, site=site, error="")
        _local.depth = 1
        try:
            result = real(self, *args, **kwargs)
        except Exception as exc:  # raised: a store barrier's own timeout; the user sees it as ever
            member.write(CallState.FAILED, error=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:300])
            raise
        finally:
            _local.depth = 0
        _returned(member, value, kwargs.get("stream"))
        return result

    vars(traced)[WRAPPED] = True
    return traced


def _returned(member: _Member, value, stream) -> None:
    """Call returned: done, or (a CUDA tensor) in flight until its stream passes an event."""
    if getattr(getattr(value, "device", None), "type", "") == "cuda":
        try:
            import torch

            event = torch.cuda.Event()
            event.record(stream) if stream is not None else event.record()
            member.event = event
            member.write(CallState.IN_FLIGHT)
            if member not in _Poller.members:
                _Poller.members.append(member)
            _Poller.ensure()
            return
        except Exception:  # no event: taken as complete
            pass
    member.event = None
    member.write(CallState.IDLE)


class _Poller(threading.Thread):
    """One thread: members whose last CUDA call is in flight become idle once its event completed."""
    members: list = []
    started: _Poller | None = None

    def __init__(self):
        super().__init__(name="pytest-nccl-vllm", daemon=True)

    @classmethod
    def ensure(cls) -> None:
        if cls.started is None:
            cls.started = cls()
            cls.started.start()

    def run(self) -> None:
        while True:
            time.sleep(POLL)
            for member in list(_Poller.members):
                event = member.event
                try:
                    if event is not None and event.query() and member.note.state == CallState.IN_FLIGHT.value:
                        member.event = None
                        member.write(CallState.IDLE)
                except Exception:  # the process is ending: its note stays as it was
                    pass


def _group_member(group) -> _Member | None:
    return getattr(group, ATTR, None)


def _comm_member(comm) -> _Member | None:
    return _group_member(getattr(comm, "group", None))


def _group_describe(op: str):
    peer_name = GROUP_OPS[op]

    def describe(args, kwargs):
        value = args[0] if args else kwargs.get("tensor", kwargs.get("obj"))
        peer = kwargs.get(peer_name) if peer_name in kwargs else (args[1] if len(args) > 1 else None)
        if op == "barrier":
            return "", None
        return _detail(value if op not in ("recv_obj",) else None, peer_name, peer), value
    return describe


def _comm_describe(op: str):
    pos, peer_name = COMM_OPS[op]

    def describe(args, kwargs):
        names = ("tensor", "in_tensor", "input_tensor")
        value = next((kwargs[n] for n in names if n in kwargs), None)
        if value is None and pos < len(args):
            value = args[pos]
        peer = kwargs.get(peer_name) if peer_name in kwargs else (args[1] if peer_name and len(args) > 1 else None)
        return _detail(value, peer_name, peer), value
    return describe


def _created(real):
    """``StatelessProcessGroup.create``: this member noted as creating the group until it exists."""

    @functools.wraps(real)
    def create(host, port, rank, world_size, *args, **kwargs):
        member = None
        if _watched() and not getattr(_local, "depth", 0):
            try:
                member = _Member(f"{host}:{port}", world_size, rank, call_site(sys._getframe(1)))
                member.write(CallState.CREATING)
            except Exception:  # a note for the watch, never an error of the user's call
                member = None
        try:
            group = real(host, port, rank, world_size, *args, **kwargs)
        except Exception as exc:
            if member is not None:
                member.write(CallState.FAILED, op="create", error=f"{type(exc).__name__}: {exc}"[:300])
            raise
        if member is not None:
            try:
                setattr(group, ATTR, member)
                member.write(CallState.IDLE)
            except Exception:  # a group that takes no attribute: not followed
                pass
        return group

    vars(create)[WRAPPED] = True
    return staticmethod(create)


def trace_group_class(cls) -> None:
    """Wrap a ``StatelessProcessGroup`` class: its creation and its calls."""
    create = vars(cls).get("create")
    real = getattr(create, "__func__", None)
    if real is not None and not getattr(real, WRAPPED, False):
        cls.create = _created(real)
    for op in GROUP_OPS:
        method = vars(cls).get(op)
        if method is not None and not getattr(method, WRAPPED, False):
            setattr(cls, op, _traced(op, method, _group_member, _group_describe(op)))


def trace_communicator_class(cls) -> None:
    """Wrap a ``PyNcclCommunicator`` class (vLLM's, or a stand-in with its methods)."""
    for op in COMM_OPS:
        method = vars(cls).get(op)
        if method is not None and not getattr(method, WRAPPED, False):
            setattr(cls, op, _traced(op, method, _comm_member, _comm_describe(op)))


def install(module) -> None:
    """Once one of ``MODULES`` has run: wrap the class it defines."""
    group = getattr(module, "StatelessProcessGroup", None)
    if module.__name__ == GROUP_MODULE and group is not None:
        trace_group_class(group)
    comm = getattr(module, "PyNcclCommunicator", None)
    if module.__name__ == COMM_MODULE and comm is not None:
        trace_communicator_class(comm)
