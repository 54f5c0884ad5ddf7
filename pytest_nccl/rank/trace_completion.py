"""Rank side: when a traced collective is complete, on every backend.

On gloo a collective's work is done when its call (or ``Work.wait``) returns. On NCCL it is not:
the call enqueues a kernel on a CUDA stream and returns, ``Work.wait`` makes the current stream
wait, and the CPU goes on until a sync point. So a collective is complete when its *work* is
(``Work.is_completed``: a CUDA event's query on NCCL). A call that returned first is journaled in
flight (a Q line); the flusher thread, which already writes deferred C lines every ``FLUSH_EVERY``,
polls those works and writes each one's C line when it completes (docs/diagnosis.md, "Backends").
"""

from __future__ import annotations

import os
import threading
import time
from time import perf_counter

import torch
import torch.distributed as dist

from ..core.journal import Line
from . import trace_core as core

FLUSH_EVERY = 0.02  # seconds a completed collective's C line waits at most for the next write
_flusher_pid = None


# Whether a group's calls may return before their work completed, by its backend (GroupTrace.early):
UNKNOWN, ON_RETURN, ON_STREAM, BY_DEVICE = -1, 0, 1, 2
_COMPLETE_ON_RETURN = frozenset({"gloo", "mpi", "fake"})  # their wait blocks the CPU until it is done


def early_of(pg) -> int:
    """ON_RETURN: the call's return is its completion (gloo: its wait blocks the CPU, and some of its
    composed works never say they completed); ON_STREAM: the work says (NCCL, XCCL, a backend
    written in Python, as the NCCL model); BY_DEVICE: gloo for CPU tensors, the other for the rest
    ("cpu:gloo,cuda:nccl"). A group that cannot tell: ON_RETURN, as before this was learned."""
    if pg is None:
        return ON_RETURN
    if not type(pg).__module__.startswith("torch"):
        return ON_STREAM
    try:
        name = str(pg._get_backend_name()).lower()
    except Exception:  # whatever an older build raises: the call's return, as always
        return ON_RETURN
    if name in _COMPLETE_ON_RETURN or name in ("", "undefined"):
        return ON_RETURN
    return BY_DEVICE if "gloo" in name else ON_STREAM


# How a call that returned completes (the mode kept with each async call's Work):
ON_ITS_RETURN, BY_WORK, BY_STREAM = 0, 1, 2


def watched(g: core.GroupTrace, value) -> int:
    """How a call of group ``g`` on ``value`` completes: ON_ITS_RETURN (gloo, or CPU tensors of a
    "cpu:gloo,cuda:nccl" group); BY_STREAM (a CUDA tensor of NCCL: its stream runs it later);
    BY_WORK (the rest that may return first, as a backend written in Python: its Work says)."""
    return _mode(g, _device_of(value))


def incomplete(g: core.GroupTrace, value, work):
    """A synchronous call of group ``g`` on ``value`` returned, with the Work ``work`` its group's
    method gave (or None): what tells when its work completes (journaled in flight, then polled),
    or None: complete."""
    device = _device_of(value)
    return pending_after(_mode(g, device), work, device)


def _mode(g: core.GroupTrace, device) -> int:
    """``watched`` for a call on a tensor of ``device`` (None: no tensor)."""
    if g.early == UNKNOWN:
        g.early = early_of(g.pg if g.pg is not None else core.default_group())
    kind = None if device is None else device.type
    if g.early == ON_RETURN or (g.early == BY_DEVICE and kind in (None, "cpu")):
        return ON_ITS_RETURN
    return BY_STREAM if kind == "cuda" else BY_WORK


def pending_after(mode: int, work, device=None):
    """After a synchronous call or a ``Work.wait`` returned: what to poll until the collective
    completed, or None. BY_STREAM: an event recorded now on the current CUDA stream of ``device``
    (the tensor's; the current device's for a wait), which c10d orders after the collective once
    either returned (NCCL ran it on that stream, or made the stream wait for it); so it holds
    whatever Work the release returns, none included."""
    if mode == BY_STREAM:
        try:
            if torch.cuda.is_current_stream_capturing():  # a CUDA graph being captured: nothing runs
                return None  # until it is replayed, and an event queried in it would end the capture
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            return None if event.query() else StreamMark(event)
        except Exception:  # no CUDA after all (a tensor of a device torch cannot record on): the Work says
            mode = BY_WORK
    if mode == BY_WORK and work is not None and not completed_work(work):
        return work
    return None


class StreamMark:
    """A CUDA event recorded on the current stream after a collective: it completes when the
    collective and what the stream ran before it did."""

    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def is_completed(self) -> bool:
        return bool(self.event.query())


def _device_of(value):
    first = value[0] if isinstance(value, (list, tuple)) and value else value
    return getattr(first, "device", None)


def completed_work(work) -> bool:
    """Whether a collective's work completed (gloo: once the call returned; NCCL: once its kernel ran
    on the stream). A Work that cannot say (a backend's Python Work that does not define
    ``is_completed``: torch's default never turns true for it; a backend that is gone): completed."""
    cls = type(work)
    if cls is not dist.Work and getattr(cls, "is_completed", None) is _BASE_IS_COMPLETED:
        return True
    try:
        return bool(work.is_completed())
    except Exception:  # whatever the backend raises: nothing to wait for here
        return True


_BASE_IS_COMPLETED = dist.Work.is_completed


def returned_incomplete(trace: core.CallTrace, work, label: str, seq: int, index: int = -1) -> None:
    """The call (or its Work.wait) returned before its work completed: journal it in flight (Q); the
    flusher writes its C line when ``work`` (its Work, or a StreamMark) completes."""
    if not _poll_device:
        _poll_device.append(_cuda_device())
    trace.in_flight[id(work) if index < 0 else (id(work), index)] = (work, label, seq, index, True)
    line = core.record_line(Line.IN_FLIGHT, trace, label, seq, index)
    with core._fd_lock:
        os.write(trace.fd, core.take_pending(trace) + line)


# The CUDA device the rank's collectives run on, learned when a work first returned incomplete, and
# whether the flusher thread made it its own (once: that thread polls for the process's life).
_poll_device: list = []
_poll_device_set = False


def _cuda_device():
    """The main thread's CUDA device, for the flusher thread to query events on (a thread that
    touches CUDA first on another device would create a context there); None without CUDA."""
    try:
        return torch.cuda.current_device() if torch.cuda.is_initialized() else None
    except Exception:  # no CUDA in this build: nothing to set
        return None


def lenient_capture_mode() -> bool:
    """Put this thread's CUDA stream-capture mode to thread-local, as NCCL's watchdog does for its
    own: in the default (global) mode an event query from any thread while the job's thread captures
    a CUDA graph invalidates that capture. The runtime is the one torch loaded; whether it was set."""
    try:
        import ctypes

        lib = _loaded_cudart()
        if lib is None:
            return False
        mode = ctypes.c_int(_CAPTURE_MODE_THREAD_LOCAL)
        return lib.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    except Exception:  # a runtime without it: the flusher polls as before
        return False


_CAPTURE_MODE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal (Global 0, Relaxed 2)


def _loaded_cudart():
    """The CUDA runtime library this process loaded (torch's), or None."""
    import ctypes

    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").rpartition(" ")[2]
            if os.path.basename(path).startswith("libcudart.so"):
                return ctypes.CDLL(path)
    return None


def _poll_in_flight(trace: core.CallTrace) -> None:
    """Write the C line of every collective in flight whose work completed since the last look."""
    global _poll_device_set
    if not _poll_device_set and _poll_device and _poll_device[0] is not None:
        torch.cuda.set_device(_poll_device[0])
        lenient_capture_mode()
        _poll_device_set = True
    done = b""
    for key, (work, label, seq, index, _) in list(trace.in_flight.items()):
        if completed_work(work):
            trace.in_flight.pop(key, None)
            done += core.record_line(Line.COMPLETED, trace, label, seq, index)
    if done:
        with core._fd_lock:
            os.write(trace.fd, core.take_pending(trace) + done)


def traced_wait(real):
    """``Work.wait`` traced: W when it starts, C when it returns with the work complete (gloo), Q when
    it returned first (NCCL: the current stream waits, not the CPU; the flusher writes the C line)."""
    def wait(self, *args, **kwargs):
        trace = core.active
        entry = trace.async_pending.pop(id(self), None) if trace is not None else None
        if entry is None or trace is None:
            return real(self, *args, **kwargs)
        _, label, seq, index, mode = entry
        trace.writer.waiting(label, seq, perf_counter() - trace.t0, index)
        result = real(self, *args, **kwargs)
        held = pending_after(mode, self)
        if held is None:
            trace.writer.completed(label, seq, perf_counter() - trace.t0, index)
        else:
            returned_incomplete(trace, held, label, seq, index)
        return result
    core.mark_traced(wait, real)
    return wait


_adopted_works: set = set()


def adopt_work(cls) -> None:
    """A Work class written in Python (a backend's own, as the NCCL model's) that defines ``wait``:
    its wait is traced as torch's ``Work.wait`` is (once per class)."""
    if cls in _adopted_works or cls is dist.Work:
        return
    _adopted_works.add(cls)
    for klass in cls.__mro__:
        if klass is dist.Work or klass is object:
            break
        real = vars(klass).get("wait")
        if real is not None and not getattr(real, "_pytest_nccl_traced", False):
            setattr(klass, "wait", traced_wait(real))  # noqa: B010


def _flush_loop() -> None:
    """A completed collective followed by a long computation is shown completed within FLUSH_EVERY,
    and one that returned before its work completed, within FLUSH_EVERY of its work."""
    while True:
        time.sleep(FLUSH_EVERY)
        _flush_active()


def _flush_active() -> None:
    # a function of its own: the trace is not held while the thread sleeps (``core.close`` says why)
    trace = core.active
    if trace is not None:
        try:
            core.flush(trace)
            if trace.in_flight:
                _poll_in_flight(trace)
        except OSError:
            pass


def start_flusher() -> None:
    """The flusher thread of this process (a forked rank has none of its parent's threads)."""
    global _flusher_pid
    if _flusher_pid != os.getpid():
        _flusher_pid = os.getpid()
        threading.Thread(target=_flush_loop, name="pytest-nccl-journal", daemon=True).start()


def _forget_in_child() -> None:
    global _poll_device_set
    _poll_device.clear()  # a new process: its flusher thread has no device yet
    _poll_device_set = False


os.register_at_fork(after_in_child=_forget_in_child)
