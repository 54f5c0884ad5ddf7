"""Rank side of ``pytest-nccl watch``: what the start-up hook (``startup/sitecustomize.py``) runs in a
process of the watched job. Imports only the rank side, and torch only once the script does.

- ``bootstrap()``, at interpreter start-up: in a process that is not a rank (neither RANK nor
  SLURM_PROCID in its environment: the launcher, a tokenizer's workers) it returns at once. In a rank
  it adds a meta path finder that waits for ``import torch``; once torch's own module has run, and
  before the importing code gets control back, it installs the tracer (``tracer.install``) and wraps
  ``init_process_group``: libraries the script imports next see the traced functions.
- the wrapper calls the real ``init_process_group`` unchanged. Once the default group exists it
  starts the journal, starts the agent thread (``agent.py``), writes ``rank-R.json``, enables
  faulthandler into ``fatal-R.txt`` (unless the script enabled it already) and, at exit, writes
  ``exit-R.json``: raised (the interpreter's unhandled exception, ``sys.last_value``), exited
  through ``sys.exit`` with a non-zero status, or passed. A killed process writes nothing.

Nothing here may break the user's job: a step that fails prints one line and the job runs on.
"""

from __future__ import annotations

import os
import sys

from . import jobdir

_rank = None          # _Rank once the default group exists in this process
_exit_status = None   # what sys.exit was called with


def is_rank(env=os.environ) -> bool:
    """A process a launcher started as a rank (torchrun, accelerate, deepspeed: RANK; srun:
    SLURM_PROCID). Its children inherit it (data loader workers): they get the hook, which stays
    idle unless they create a default process group themselves."""
    return "RANK" in env or "SLURM_PROCID" in env


def bootstrap() -> None:
    if not os.environ.get(jobdir.ENV_DIR) or not is_rank():
        return
    _wrap_sys_exit()
    if "torch" in sys.modules:  # imported by a sitecustomize we chained to
        after_torch()
    else:
        sys.meta_path.insert(0, _AfterTorch())


def _warn(text: str) -> None:
    try:
        sys.stderr.write(f"pytest-nccl watch (pid {os.getpid()}): {text}\n")
    except Exception:
        pass


class _AfterTorch:
    """A meta path finder for one module, ``torch``: it finds torch's spec with the finders after it
    and runs ``after_torch`` once torch's module has executed. Every other import costs one string
    comparison; the finder removes itself at the first ``import torch``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            after_torch()

        spec.loader.exec_module = exec_module
        return spec


def after_torch() -> None:
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from ..rank import tracer

        tracer.install()
        _wrap_init_process_group()
    except Exception as exc:
        _warn(f"collectives are not traced in this process ({type(exc).__name__}: {exc})")


def _wrap_init_process_group() -> None:
    import functools

    import torch.distributed.distributed_c10d as c10d

    real = c10d.init_process_group
    if getattr(real, "_pytest_nccl_watch", False):
        return

    @functools.wraps(real)
    def init_process_group(*args, **kwargs):
        result = real(*args, **kwargs)
        _started()
        return result

    init_process_group._pytest_nccl_watch = True
    # torch's own modules that bound the name at import time (torch.distributed among them)
    for name, module in list(sys.modules.items()):
        if (name == "torch" or name.startswith("torch.")) and getattr(module, "init_process_group", None) is real:
            try:
                setattr(module, "init_process_group", init_process_group)
            except Exception:
                pass


def _wrap_sys_exit() -> None:
    real = sys.exit

    def exit(status=None):
        global _exit_status
        _exit_status = status
        real(status)

    exit.__doc__ = real.__doc__
    sys.exit = exit


def _started() -> None:
    global _rank
    if _rank is not None:
        return  # a default group created again: the same journal goes on
    try:
        _rank = _Rank(os.environ[jobdir.ENV_DIR])
        _rank.start()
    except Exception as exc:
        _warn(f"pytest-nccl watch cannot follow this rank ({type(exc).__name__}: {exc})")


class _Rank:
    """This process as a rank of the watched job."""

    def __init__(self, directory: str):
        import torch.distributed as dist

        self.directory = directory
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())
        self.pid = os.getpid()
        self.fatal_file = None

    def start(self) -> None:
        import atexit
        import faulthandler
        import socket
        import time

        from ..rank import tracer
        from .agent import Agent

        d, r = self.directory, self.rank
        try:
            os.unlink(jobdir.exit_record(d, r))  # a restarted rank (torchrun --max-restarts)
        except OSError:
            pass
        tracer.start(jobdir.journal(d, r))
        try:
            self.agent = Agent(d, r)
            self.agent.start()
        except OSError as exc:  # no stacks nor Flight Recorder progress from this rank; the rest works
            self.agent = None
            _warn(f"no agent socket ({exc})")
        if not faulthandler.is_enabled():
            self.fatal_file = open(jobdir.fatal(d, r), "w")
            faulthandler.enable(file=self.fatal_file, all_threads=True)
        atexit.register(self.at_exit)
        jobdir.write_json(jobdir.rank_info(d, r), {
            "rank": r, "world": self.world, "local_rank": os.environ.get("LOCAL_RANK"),
            "pid": self.pid, "start": jobdir.process_start(self.pid), "host": socket.gethostname(),
            "backend": self.backend, "t0": time.time(), "argv": sys.argv[:8]})

    def at_exit(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child that exits through the interpreter
        import time

        from ..core.reports import RankReport
        from ..core.states import RankState

        record = RankReport(self.rank, RankState.PASSED, ended=time.time())
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        try:
            if exc is not None and not isinstance(exc, SystemExit):
                from ..rank.stacks import describe_exception, format_exception

                _, record.exc_type, record.exc_text, record.message = describe_exception(
                    exc, lambda e: format_exception(e, cut_to_user=True))
                record.state = RankState.FAILED
            elif _exit_status not in (None, 0):
                record.state, record.exc_type, record.message = (RankState.FAILED, "SystemExit",
                                                                 f"SystemExit: {_exit_status}")
            jobdir.write_text(jobdir.exit_record(self.directory, self.rank), record.to_json())
        except Exception as exc:
            _warn(f"no exit record ({type(exc).__name__}: {exc})")
        if self.agent is not None:
            self.agent.close()
        from ..rank import tracer

        tracer.stop()  # the trace holds the default group: let it go as it would without us
