"""A model of NCCL's host-side semantics on CPU: a ``torch.distributed`` backend, ``nccl_model``.

A collective returns as soon as it is enqueued; it runs later, on its group's "stream" (a worker
thread that runs gloo underneath), and completes there. ``Work.wait()`` makes the *current* stream
wait for it, not the CPU; the CPU blocks only at a sync point: ``synchronize()``, ``item(t)``, a
barrier, a full queue, or ``TORCH_NCCL_BLOCKING_WAIT=1``. What it models, each assumption with how
it was checked, is in docs/diagnosis.md ("Backends: when a collective is complete").

    from pytest_nccl.testing import nccl_model
    nccl_model.register()
    pg = dist.new_group(backend=nccl_model.NAME)       # or init_process_group(nccl_model.NAME, ...)
    dist.all_reduce(t, group=pg)                       # returns at once, incomplete
    nccl_model.item(t)                                 # the sync point: blocks until it completed

Settings (environment, read when a group is made): ``PYTEST_NCCL_MODEL_QUEUE`` (collectives a
group's stream holds before the next one blocks the CPU, NCCL's full queue; 0: unbounded, the
default); ``TORCH_NCCL_BLOCKING_WAIT`` (``wait()`` blocks the CPU). The group's timeout is the
watchdog's, as NCCL's: a collective incomplete for longer aborts the process (SIGABRT).

Test support: it models NCCL for the project's own tests and for users' CPU runners, it is not a
transport. Collectives whose ranks disagree on the op or the element count hang (NCCL's behaviour
is undefined there: a hang or a corrupt result), instead of gloo's abort.
"""

# The methods take c10d's arguments as c10d passes them to a Python ProcessGroup, not the overloads
# torch's stubs declare for its C++ one.
# mypy: disable-error-code="override"
from __future__ import annotations

import atexit
import gc
import os
import queue
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..rank.trace_core import hide_thread

NAME = "nccl_model"
_HANG = 10**9  # seconds: how long a mismatched collective waits (until the watchdog or the test's end)


class Event:
    """A point on a stream: set once everything enqueued before it ran."""

    def __init__(self, done: bool = False):
        self._event = threading.Event()
        if done:
            self._event.set()

    def set(self) -> None:
        self._event.set()

    def query(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)


class Stream:
    """A CUDA stream's order on the host: tasks run one after another on a worker thread."""

    def __init__(self, name: str, depth: int = 0):
        self.name, self.depth = name, depth
        self._pid = -1

    def _start(self) -> None:
        """The worker of this process (a process forked from one with the stream has no thread)."""
        self._pid = os.getpid()
        self._tasks: queue.Queue = queue.Queue(self.depth) if self.depth > 0 else queue.Queue()
        self._tail = Event(done=True)
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name=f"nccl-model-{self.name}", daemon=True).start()

    def enqueue(self, task) -> Event:
        """Run ``task()`` after everything enqueued so far; returns the event set once it ran. Blocks
        the caller while the stream holds ``depth`` tasks (NCCL's full queue)."""
        if self._pid != os.getpid():
            self._start()
        done = Event()
        with self._lock:
            self._tail = done
            self._tasks.put((task, done))
        return done

    def tail(self) -> Event:
        """The event of the last task enqueued (set when the stream is idle)."""
        if self._pid != os.getpid():
            self._start()
        return self._tail

    def _run(self) -> None:
        hide_thread()  # what runs here is the backend's, as an NCCL kernel: the tracer sees the call only
        while True:
            task, done = self._tasks.get()
            try:
                task()
            except BaseException as e:  # an error of the collective: NCCL reports it at the watchdog
                print(f"[nccl_model] {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            done.set()


# the device's current stream: compute, and what ``Work.wait()`` makes wait for a collective
current = Stream("current")
_groups: list = []


def _release_groups() -> None:
    """At exit, the gloo groups underneath are freed while the interpreter still runs. Left to its
    teardown, a gloo group freed that late aborts the process now and then ("terminate called
    without an active exception"): a healthy job's rank ends by SIGABRT. A collective still running
    on a stream holds its own reference."""
    for group in _groups:
        group.inner = None
    _groups.clear()
    gc.collect()  # and the works and groups in reference cycles (c10d's objects among them)


atexit.register(_release_groups)


def sleep(seconds: float) -> None:
    """Hold the current stream for ``seconds`` (``torch.cuda._sleep``: a long kernel)."""
    current.enqueue(lambda: time.sleep(seconds))


def synchronize() -> None:
    """Block the CPU until every stream is idle (``torch.cuda.synchronize()``)."""
    current.tail().wait()
    for group in list(_groups):
        group.stream.tail().wait()


def item(tensor: torch.Tensor):
    """``tensor.item()`` on the device: waits for the current stream first (what it was given to wait
    for included), then reads."""
    current.tail().wait()
    return tensor.item()


class ModelWork(dist.distributed_c10d.Work):
    """A collective enqueued on a group's stream: complete once the stream ran it."""

    def __init__(self, done: Event, blocking: bool, cpu_wait: bool = False):
        super().__init__()
        self.done, self.blocking, self.cpu_wait = done, blocking, cpu_wait

    def is_completed(self) -> bool:
        return self.done.query()

    def wait(self, timeout=None) -> bool:
        if self.blocking or self.cpu_wait:  # TORCH_NCCL_BLOCKING_WAIT, or a barrier: the CPU waits
            self.done.wait()
        else:  # the current stream waits for it; the CPU goes on
            done = self.done
            current.enqueue(done.wait)
        return True

    def get_future(self):
        future: torch.futures.Future = torch.futures.Future()

        def complete() -> None:
            self.done.wait()
            future.set_result(None)
        threading.Thread(target=complete, daemon=True).start()
        return future


# ops whose ranks must agree on the element count, and each op's code in the agreement check
_OPS = {"allreduce": 1, "broadcast": 2, "allgather": 3, "_allgather_base": 4, "reduce_scatter": 5,
        "_reduce_scatter_base": 6, "reduce": 7, "barrier": 8, "alltoall_base": 9}


class ModelGroup(dist.ProcessGroup):
    """One process group of the model: its own stream, gloo underneath, a watchdog."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)  # type: ignore[call-arg]
        self.inner: Any = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.stream = Stream(f"pg{len(_groups)}", int(os.environ.get("PYTEST_NCCL_MODEL_QUEUE", "0") or 0))
        self.blocking = os.environ.get("TORCH_NCCL_BLOCKING_WAIT", "0") == "1"
        self.timeout = timeout.total_seconds()
        self.seq = 0
        self.in_flight: dict[int, tuple] = {}  # seq -> (op, enqueued at, its event)
        _groups.append(self)
        threading.Thread(target=self._watchdog, name="nccl-model-watchdog", daemon=True).start()

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return NAME

    def _enqueue(self, op: str, numel: int, run, cpu_wait: bool = False) -> ModelWork:
        self.seq += 1
        seq, start = self.seq, current.tail()  # the inputs are ready once the current stream got here
        done = Event()

        def task():
            start.wait()
            if not self._agree(op, numel):
                time.sleep(_HANG)
            run()
            self.in_flight.pop(seq, None)
            done.set()
        self.in_flight[seq] = (op, time.monotonic(), done)
        self.stream.enqueue(task)
        return ModelWork(done, self.blocking, cpu_wait)

    def _agree(self, op: str, numel: int) -> bool:
        """Whether every member enqueued the same op with the same element count (NCCL does not
        check: its collective then hangs or corrupts; here it hangs)."""
        mine = torch.tensor([_OPS.get(op, 0), numel], dtype=torch.int64)
        every = [torch.zeros(2, dtype=torch.int64) for _ in range(self.size())]
        self.inner.allgather([every], [mine]).wait()
        return all(bool((t == every[0]).all()) for t in every)

    def _watchdog(self) -> None:
        """NCCL's watchdog: a collective incomplete past the group's timeout takes the process down."""
        while True:
            time.sleep(min(1.0, max(self.timeout / 10, 0.05)))
            now = time.monotonic()
            for seq, (op, since, _) in list(self.in_flight.items()):
                if now - since > self.timeout:
                    print(f"[Rank {self.rank()}] Watchdog caught collective operation timeout: "
                          f"WorkNCCL(SeqNum={seq}, OpType={op.upper().lstrip('_')}, Timeout(ms)="
                          f"{int(self.timeout * 1000)}) ran for {int((now - since) * 1000)} milliseconds before "
                          "timing out. To avoid data inconsistency, we are taking the entire process down.",
                          file=sys.stderr, flush=True)
                    os.abort()

    # -- the collectives: each runs gloo's on the stream ---------------------------------------------
    def allreduce(self, tensors, opts=None):
        inner = self.inner
        return self._enqueue("allreduce", sum(t.numel() for t in tensors),
                             lambda: inner.allreduce(tensors, _reduce_opts(opts)).wait())

    def broadcast(self, tensors, opts=None):
        inner = self.inner
        return self._enqueue("broadcast", sum(t.numel() for t in tensors),
                             lambda: inner.broadcast(tensors, opts or dist.BroadcastOptions()).wait())

    def allgather(self, output_lists, inputs, opts=None):
        inner = self.inner
        return self._enqueue("allgather", sum(t.numel() for t in inputs),
                             lambda: inner.allgather(output_lists, inputs).wait())

    def _allgather_base(self, output, input, opts=None):
        inner = self.inner
        return self._enqueue("_allgather_base", input.numel(), lambda: inner._allgather_base(output, input).wait())

    def reduce_scatter(self, outputs, input_lists, opts=None):
        inner = self.inner
        return self._enqueue("reduce_scatter", sum(t.numel() for t in outputs),
                             lambda: inner.reduce_scatter(outputs, input_lists, _reduce_scatter_opts(opts)).wait())

    def _reduce_scatter_base(self, output, input, opts=None):
        inner = self.inner
        return self._enqueue("_reduce_scatter_base", output.numel(),
                             lambda: inner._reduce_scatter_base(output, input, _reduce_scatter_opts(opts)).wait())

    # torch 2.13's names for the same three (c10d calls these where they exist)
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return self.alltoall_base(output, input, output_splits, input_splits, opts)

    def reduce(self, tensors, opts=None):
        inner = self.inner
        return self._enqueue("reduce", sum(t.numel() for t in tensors),
                             lambda: inner.reduce(tensors, opts or dist.ReduceOptions()).wait())

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        inner = self.inner
        return self._enqueue("alltoall_base", -1,
                             lambda: inner.alltoall_base(output, input, output_splits, input_splits).wait())

    def barrier(self, opts=None):
        # NCCL's barrier is an all_reduce whose wait() blocks the CPU (WorkNCCL's barrier tensor)
        inner = self.inner
        return self._enqueue("barrier", 1, lambda: inner.barrier().wait(), cpu_wait=True)

    def send(self, tensors, dst: int, tag: int = 0):
        inner = self.inner
        return self._transfer(lambda: inner.send(tensors, dst, tag).wait())

    def recv(self, tensors, src: int, tag: int = 0):
        inner = self.inner
        return self._transfer(lambda: inner.recv(tensors, src, tag).wait())

    def _transfer(self, run) -> ModelWork:
        """A point-to-point transfer: on the stream, no agreement check (its peer is one rank)."""
        start, done = current.tail(), Event()

        def task():
            start.wait()
            run()
            done.set()
        self.stream.enqueue(task)
        return ModelWork(done, self.blocking)


def _reduce_opts(opts):
    out = dist.AllreduceOptions()
    if opts is not None:
        out.reduceOp = opts.reduceOp
    return out


def _reduce_scatter_opts(opts):
    out = dist.ReduceScatterOptions()
    if opts is not None:
        out.reduceOp = opts.reduceOp
    return out


def _create(store, rank: int, size: int, timeout: timedelta) -> ModelGroup:
    return ModelGroup(store, rank, size, timeout)


def register() -> str:
    """Make ``nccl_model`` a backend name for ``init_process_group`` and ``new_group`` in this process
    (again: a no-op); returns the name."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])
    return NAME
