"""Rank side: the main loop of one rank process, forked from the fork server (``zygote.py``).

Like xdist's ``remote.py`` it imports nothing of the controller side: only torch, the standard
library and the rank side (``core``'s messages and journal format, the tracer). It sets the environment as torchrun
would, creates the process group itself with the test's bound as timeout (so accelerate,
transformers and DeepSpeed reuse it instead of waiting 30 minutes), then runs calls until told to
exit. A reader thread answers "dump" requests (stacks of all threads, Flight Recorder) while the
main thread may be stuck inside a collective: those release the GIL while they wait.
"""

from __future__ import annotations

import ast
import datetime
import faulthandler
import importlib
import io
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import types
from multiprocessing.connection import Connection
from typing import Any

from ..core.agreement import Digest
from ..core.messages import Call, CallDone, CallKind, Dump, DumpRequest, Hello, Joined, RankSpec, RunCall, SetupFailed
from ..core.reports import RankReport
from ..core.states import Backend, RankState
from . import adopted, libraries, tracer
from .stacks import describe_exception, exit_like_os_exit, format_exception, format_stacks

_send_lock = threading.Lock()


def _send(conn: Connection, msg) -> None:
    with _send_lock:
        conn.send(msg)


def _reader(conn: Connection, calls: queue.Queue, rank: int) -> None:
    """Answers dump requests at once (the main thread may be stuck in a collective); calls go to the
    main thread."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(70)  # the controller is gone: a rank must never outlive it
        if isinstance(msg, DumpRequest):
            _send(conn, Dump(rank, format_stacks(), tracer.flight_recorder_json(), tracer.flight_recorder_pickle()))
        elif isinstance(msg, RunCall):
            calls.put(msg.call)


def load_module(name: str, path: str):
    """Import a test module the way pytest did (with assertion rewriting), under the same name."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    if not path or not os.path.exists(path):
        return importlib.import_module(name)
    if "." in name:
        try:
            importlib.import_module(name.rpartition(".")[0])
        except ImportError:
            pass
    with open(path, "rb") as f:
        source = f.read()
    try:
        # pytest's assertion rewriting is private API (``rewrite_asserts(mod, source, module_path)``
        # since pytest 6): should it move or change, the module loads with plain asserts instead
        from _pytest.assertion.rewrite import rewrite_asserts
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path)
        code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:  # pytest's private rewriter, any version: unrewritten asserts then
        code = compile(source, path, "exec", dont_inherit=True)
    mod = types.ModuleType(name)
    mod.__file__ = path
    sys.modules[name] = mod
    try:
        exec(code, mod.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def resolve(call: Call):
    for entry in call.sys_path:
        if entry not in sys.path:
            sys.path.append(entry)
    obj = load_module(call.module, call.path)
    head, _, rest = call.qualname.partition(".")
    obj = getattr(obj, head)
    if rest:
        # a test method: pytest calls it on a fresh instance of its class
        obj = getattr(obj(), rest)
    return obj


def _format_exception(exc: BaseException) -> str:
    """The user's and torch's frames: not run_call's, nor the tracer's wrappers."""
    return format_exception(exc, drop=(__file__, adopted.__file__))


def _rank_fixtures(names, rank: int) -> dict:
    """Values of the fixtures that only exist inside a rank."""
    if not names:
        return {}
    import torch
    import torch.distributed as dist
    backend = str(dist.get_backend())  # torch's Backend is a str of the same word
    local = int(os.environ.get("LOCAL_RANK", rank))
    values = {"rank": rank, "world_size": dist.get_world_size(), "backend": backend,
              "device": torch.device("cuda", local) if backend == Backend.NCCL else torch.device("cpu")}
    return {name: values[name] for name in names}


def run_call(call: Call, rank: int) -> RankReport:
    import torch.distributed as dist
    start = time.perf_counter()
    try:
        if call.adopted is not None:  # a test of torch's harness classes: the class's own rank entry
            fn = adopted.entry(load_module(call.module, call.path), call.adopted, rank)
        else:
            fn = resolve(call)
        args, kwargs = pickle.loads(call.payload) if call.payload else ((), {})
        kwargs.update(_rank_fixtures(call.rank_args, rank))
    except BaseException as exc:
        return RankReport(rank, RankState.ERROR, call_id=call.call_id, exc_type=type(exc).__name__,
                          exc_text=_format_exception(exc), digest={}, ended=time.time(), unloadable=True,
                          message=f"cannot load {call.module}.{call.qualname} in rank {rank}: "
                                  f"{type(exc).__name__}: {exc}")
    if call.trace:
        tracer.start(os.path.join(call.journal_dir, f"journal-{rank}.txt"), raise_leaves=call.adopted is not None)
    status, value, exc_type, exc_text, message = RankState.PASSED, None, "", "", ""
    try:
        if call.adopted is None:  # (an adopted test's class builds its own state, as under torch's harness)
            libraries.prepare()
        value = fn(*args, **kwargs)
    except SystemExit as exc:
        exit_like_os_exit(exc)
    except BaseException as exc:
        status, exc_type, exc_text, message = describe_exception(exc, _format_exception)
    finally:
        digest, dangling = tracer.stop() if call.trace else ({}, 0)
    payload = b""
    if call.kind == CallKind.FUNCTION and status == RankState.PASSED:
        try:
            payload = pickle.dumps(value)
        except Exception as exc:  # a value's own __reduce__ may raise anything: the rank's error
            status, exc_type = RankState.ERROR, type(exc).__name__
            message = (f"rank {rank} returned a value that cannot be pickled "
                       f"({type(value).__name__}): {type(exc).__name__}: {exc}")
    return RankReport(rank, status, call_id=call.call_id, value=payload, exc_type=exc_type, exc_text=exc_text,
                      message=message, digest={pg: Digest(*d) for pg, d in digest.items()}, dangling=dangling,
                      initialized=dist.is_initialized(), ended=time.time(), duration=time.perf_counter() - start)


def set_environment(spec: RankSpec) -> None:
    rank = spec.rank
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(spec.local_rank), "WORLD_SIZE": str(spec.world),
        "LOCAL_WORLD_SIZE": str(spec.local_world), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
        "TORCHELASTIC_RUN_ID": spec.run_id,
    })
    os.environ.update(spec.env)


def _share_gpu(torch, device: int) -> None:
    """Make ``cuda:device`` this rank's current device when CUDA first initializes, not now: a rank
    that never touches CUDA pays nothing (``_lazy_call`` queues it as ``manual_seed`` does)."""
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None:
        lazy_call(lambda: torch.cuda.set_device(device))
    else:  # a torch without the queue: at once
        torch.cuda.set_device(device)


def _join_group(spec: RankSpec, conn: Connection) -> None:
    """The process group every marked test runs in; a rank that cannot join says why and exits."""
    import torch
    import torch.distributed as dist
    try:
        timeout = datetime.timedelta(seconds=spec.pg_timeout)
        store = dist.FileStore(spec.store_path, spec.world)
        kwargs: dict[str, Any] = {}
        if spec.backend == Backend.NCCL:
            torch.cuda.set_device(spec.local_rank)
            kwargs["device_id"] = torch.device("cuda", spec.local_rank)
        dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world,
                                timeout=timeout, **kwargs)
    except BaseException as exc:
        _send(conn, SetupFailed(spec.rank, f"{type(exc).__name__}: {exc}"))
        os._exit(71)


def main(spec: RankSpec, prepare=None) -> None:
    """Entry point in the forked (or spawned) child. Never returns. ``prepare``: what a spawned rank
    imports before joining (a forked one has it from the fork server)."""
    rank = spec.rank
    out_fd = os.open(spec.output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(write_through=True)
        except (OSError, ValueError):  # closed, or not reconfigurable
            pass
    stack_file = open(spec.stack_path, "w")
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    set_environment(spec)
    if prepare is not None:
        prepare()

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(spec.control_path)
    conn = Connection(sock.detach())
    _send(conn, Hello(rank, os.getpid()))

    if spec.cuda_device is not None:
        import torch
        _share_gpu(torch, spec.cuda_device)
    if not spec.own_group:  # an adopted test's rank: the test creates its process group itself
        _join_group(spec, conn)
        libraries.install()
    _send(conn, Joined(rank))

    calls: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(conn, calls, rank), name="pytest-nccl-reader",
                     daemon=True).start()
    while True:
        report = run_call(calls.get(), rank)
        sys.stdout.flush()
        sys.stderr.flush()
        _send(conn, CallDone(report))
