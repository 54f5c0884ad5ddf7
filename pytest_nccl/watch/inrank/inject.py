"""Rank side of ``pytest-nccl watch``: what a process of the watched job runs once it has imported
torch (``startup/sitecustomize.py`` calls ``after_torch``). Imports only the rank side.

- ``after_torch()``: notes that this process imported torch (``torch-<pid>`` in the job directory: the
  watch tells "not a torch job" from "no group created"), installs the tracer (``tracer.install``)
  and wraps ``init_process_group``, before the code that imported torch gets control back: libraries
  imported next see the traced functions. Every process of the job that imports torch gets this, a
  launcher, a data loader worker or a Ray worker as much as a rank; it is idle until it creates a
  default process group.
- the wrapper notes the process as joining (``joining-<pid>.json``: where, and the rank and world
  when the arguments or the environment say; torchrun's agent, waiting for the other nodes in its
  rendezvous, is noted so too), calls the real ``init_process_group`` unchanged, and
  once the default group exists the process is a rank, whatever gave it its rank and world
  (environment, arguments, an ``init_method`` URL, a store): it starts the journal, starts the agent
  thread (``agent.py``), writes ``rank-R.json``, enables faulthandler into ``fatal-R.txt`` (unless
  the script enabled it already), has SIGTERM and SIGHUP write its stacks into ``signal-R-SIG.txt``
  before their own effect (``endsignals``) and, at exit, writes ``exit-R.json`` (``exitrecord``): raised (the unhandled
  exception), exited through ``sys.exit`` with a non-zero status, or passed. A ``multiprocessing``
  child (``mp.spawn``, ``Process``) writes it from multiprocessing's own exit path, which sees the
  exception its target raised (a forked child ends with ``os._exit``: no ``atexit``). A killed
  process writes nothing.

- ``after_fork()``: the same for a process forked (not executed) from a pytest process whose test
  starts ranks itself (``launched.py``: ``torch.multiprocessing.start_processes`` with fork, as
  accelerate's ``debug_launcher`` does): torch is there already, the start-up hook never ran; only
  ``init_process_group`` is wrapped, and the tracer is installed when it is called (a forked data
  loader worker pays for nothing else).

Files go to the directory of the launcher's attempt (``jobdir.attempt_dir``: torchrun's
``TORCHELASTIC_RESTART_COUNT``). Nothing here may break the user's job: a step that fails prints one
line and the job runs on.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

from ...core import jobdir
from . import endsignals, exitrecord
from .ownranks import created_by_pytest_nccl
from .worlds_rank import launcher_env, world_key

if TYPE_CHECKING:
    from .agent import Agent

_rank: "_Rank | None" = None    # once the default group exists in this process
_forked = False                 # forked from a test's pytest process (after_fork): its faulthandler is pytest's
WRAPPED = "_pytest_nccl_watch"  # set on what the watch wrapped: never wrapped twice


def _warn(text: str) -> None:
    try:
        sys.stderr.write(f"pytest-nccl watch (pid {os.getpid()}): {text}\n")
    except Exception:  # in the user's process: stderr may be anything (closed, replaced)
        pass


def after_torch() -> None:
    base = os.environ.get(jobdir.ENV_DIR)
    if not base:
        return
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from ...rank import tracer

        exitrecord.wrap_sys_exit(WRAPPED)
        tracer.install()
        _wrap_init_process_group()
        from . import sidegroups
        sidegroups.install(_note_joining, _unlink)
        _when_imported(ELASTIC_AGENT, _wrap_rendezvous)
        from ...rank import trace_vllm  # vLLM's own groups (TRL's weight sync), once vLLM's modules ran
        for name in trace_vllm.MODULES:
            _when_imported(name, trace_vllm.install)
        from . import fold
        _when_imported(fold.SIGNAL_EXCEPTION, fold.install)  # torchrun's traceback of our SIGTERM
        os.makedirs(base, exist_ok=True)  # a test's directory is made by the first process that needs it
        jobdir.touch(jobdir.torch_marker(base, os.getpid()))
    except Exception as exc:  # never stop the user's process: said, it runs untraced
        _warn(f"collectives are not traced in this process ({type(exc).__name__}: {exc})")


def after_fork() -> None:
    """In a child forked from a pytest process while its test's ranks are followed (``launched.py``
    calls it from ``os.register_at_fork``): torch is imported already; wrap ``init_process_group``
    (the tracer is installed when it is called). Cheap: every process the test forks runs it."""
    global _forked
    if not os.environ.get(jobdir.ENV_DIR) or "torch.distributed.distributed_c10d" not in sys.modules:
        return
    try:
        _forked = True
        exitrecord.wrap_sys_exit(WRAPPED)
        _wrap_init_process_group()
    except Exception as exc:  # never stop the user's process: said, it runs untraced
        _warn(f"collectives are not traced in this process ({type(exc).__name__}: {exc})")


class _AfterImport:
    """A meta path finder for one module: ``then(module)`` runs once it has executed."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = None if finder is self else getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if loader is None or run is None:
            return spec

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                self.then(module)
            except Exception as exc:  # never stop the user's import: said
                _warn(f"cannot follow {self.name} ({type(exc).__name__}: {exc})")

        try:
            loader.exec_module = exec_module
        except Exception:  # a loader that takes no attributes: this module goes unfollowed
            pass
        return spec


def _when_imported(name: str, then) -> None:
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


ELASTIC_AGENT = "torch.distributed.elastic.agent.server.api"  # torchrun's (and accelerate's) agent


def _wrap_rendezvous(module) -> None:
    """torchrun's agent waits for the other nodes in ``SimpleElasticAgent._rendezvous``: note it as
    joining too (a node whose peers never appear has no rank waiting in init_process_group)."""
    import functools

    agent = getattr(module, "SimpleElasticAgent", None)
    real = getattr(agent, "_rendezvous", None)
    if real is None or getattr(real, WRAPPED, False):
        return

    @functools.wraps(real)
    def _rendezvous(self, worker_group, *args, **kwargs):
        handler = getattr(getattr(worker_group, "spec", None), "rdzv_handler", None)
        settings = getattr(handler, "_settings", None)
        nodes = getattr(handler, "world_size", None) or getattr(settings, "min_nodes", None)
        note = _note_joining(rank=getattr(handler, "rank", None), world=nodes, site="", what="rendezvous")
        try:
            return real(self, worker_group, *args, **kwargs)
        finally:
            _unlink(note)

    vars(_rendezvous)[WRAPPED] = True
    setattr(agent, "_rendezvous", _rendezvous)  # noqa: B010  (found by name: absent in some releases)


def _unlink(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def _wrap_init_process_group() -> None:
    import functools

    import torch.distributed.distributed_c10d as c10d

    real = c10d.init_process_group
    if getattr(real, WRAPPED, False):
        return

    @functools.wraps(real)
    def init_process_group(*args, **kwargs):
        if _forked:  # installed here, not at the fork: a forked process that creates no group pays nothing
            _install_tracer()
        caller = sys._getframe(1)
        joining = _joining(real, args, kwargs, caller)
        try:
            return real(*args, **kwargs)
        except Exception as exc:  # a restart that cannot form its group: the watch says so (outcome.py)
            jobdir.note_join_failed(joining, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
            raise
        finally:
            _unlink(joining)
            _started(created_by_pytest_nccl(caller))

    vars(init_process_group)[WRAPPED] = True
    # torch's own modules that bound the name at import time (torch.distributed among them)
    for name, module in list(sys.modules.items()):
        if (name == "torch" or name.startswith("torch.")) and getattr(module, "init_process_group", None) is real:
            try:
                setattr(module, "init_process_group", init_process_group)  # noqa: B010  (any torch module)
            except Exception:  # a torch module with its own __setattr__ keeps its own name
                pass


def _install_tracer() -> None:
    try:
        from ...rank import tracer

        tracer.install()
    except Exception as exc:  # never stop the user's process: said, it runs untraced
        _warn(f"collectives are not traced in this process ({type(exc).__name__}: {exc})")


def _joining(real, args, kwargs, frame) -> str | None:
    """Note this process as waiting in ``init_process_group`` (for peers that may never come)."""
    try:
        import inspect

        from ...rank import tracer

        given = inspect.signature(real).bind_partial(*args, **kwargs).arguments

        def given_or_env(arg: str, var: str):
            value = given.get(arg, -1)
            return value if value not in (-1, None) else os.environ.get(var)

        return _note_joining(rank=given_or_env("rank", "RANK"), world=given_or_env("world_size", "WORLD_SIZE"),
                             site=tracer.call_site(frame), what="init_process_group")
    except Exception:  # a note for the watch, never an error of the user's call
        return None


def _note_joining(*, rank, world, site: str, what: str, group: str = "", store: str = "") -> str | None:
    """``joining-PID.json`` in this attempt's directory; its path (removed once the wait is over)."""
    try:
        import socket
        import time

        env = os.environ
        directory = jobdir.attempt_dir(env[jobdir.ENV_DIR], jobdir.attempt_of(env))
        os.makedirs(directory, exist_ok=True)
        path = jobdir.joining(directory, os.getpid())
        jobdir.write_json(path, jobdir.JoiningNote(
            pid=os.getpid(), start=jobdir.process_start(os.getpid()), host=socket.gethostname(), t=time.time(),
            rank=jobdir.int_or(rank), world=jobdir.int_or(world), site=site, what=what,
            local_world=jobdir.int_or(env.get("LOCAL_WORLD_SIZE")), group=group, store=store).to_dict())
        return path
    except Exception:  # a note for the watch, never an error of the user's call
        return None


def _started(self_judged: bool = False) -> None:
    global _rank
    if _rank is not None and _rank.pid == os.getpid():
        return  # a default group created again: the same journal goes on
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return  # init_process_group raised
        _rank = _Rank(os.environ[jobdir.ENV_DIR], self_judged)
        _rank.start()
    except Exception as exc:  # never stop the user's process: said, it runs unfollowed
        _warn(f"pytest-nccl watch cannot follow this rank ({type(exc).__name__}: {exc})")


class _Rank:
    """This process as a rank of the watched job."""

    def __init__(self, base: str, self_judged: bool = False):
        import torch.distributed as dist

        self.self_judged = self_judged
        self.attempt = jobdir.attempt_of(os.environ)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        attempt = jobdir.attempt_dir(base, self.attempt)
        os.makedirs(attempt, exist_ok=True)
        self.directory = jobdir.world_dir(attempt, world_key(self.world))
        self.first_world = self.directory == attempt  # another world's ranks are not torchrun's
        self.backend = str(dist.get_backend())
        self.pid = os.getpid()
        self.fatal_file: TextIO | None = None
        self.agent: Agent | None = None
        self.done = False

    def start(self) -> None:
        import atexit
        import faulthandler
        import socket
        import time

        from ...rank import tracer
        from .agent import Agent

        d, r = self.directory, self.rank
        os.makedirs(d, exist_ok=True)
        try:
            os.unlink(jobdir.exit_record(d, r))  # a rank that created its group again
        except OSError:
            pass
        tracer.start(jobdir.journal(d, r))
        try:
            self.agent = Agent(d, r)
            self.agent.start()
        except OSError as exc:  # no stacks nor Flight Recorder progress from this rank; the rest works
            self.agent = None
            _warn(f"no agent socket ({exc})")
        if _forked or not faulthandler.is_enabled():  # a forked child has pytest's, to its stderr
            self.fatal_file = open(jobdir.fatal(d, r), "w")
            faulthandler.enable(file=self.fatal_file, all_threads=True)
        try:  # ended by its launcher or a scheduler: where it was, then the signal's own effect
            endsignals.install(d, r)
        except (OSError, ValueError, RuntimeError) as exc:  # the rest works without it: said
            _warn(f"no stacks on SIGTERM ({type(exc).__name__}: {exc})")
        atexit.register(self.at_exit)
        self._multiprocessing_exit()
        jobdir.write_json(jobdir.rank_info(d, r), jobdir.RankInfo(
            rank=r, world=self.world, local_rank=os.environ.get("LOCAL_RANK"),
            pid=self.pid, start=jobdir.process_start(self.pid), host=socket.gethostname(),
            backend=self.backend, t0=time.time(), argv=sys.argv[:8],
            attempt=self.attempt, max_restarts=jobdir.max_restarts_of(os.environ),
            # the other nodes: how many ranks this node has, and the job's store, through which the
            # watches of several nodes see each other's ranks (channel.py)
            # (another default world's process inherited them from the launcher's rank that started it)
            **(launcher_env() if self.first_world else {}), self_judged=self.self_judged).to_dict())

    def _multiprocessing_exit(self) -> None:
        """In a multiprocessing child, the exit record is written by multiprocessing's exit path (a
        finalizer runs inside ``_bootstrap``'s ``finally``: the target's exception is current)."""
        mp = sys.modules.get("multiprocessing")
        if mp is None or mp.parent_process() is None:
            return
        from multiprocessing import util

        util.Finalize(None, lambda: self.at_exit(sys.exc_info()[1]), exitpriority=0)

    def at_exit(self, exc: BaseException | None = None) -> None:
        if os.getpid() != self.pid or self.done:
            return  # a forked child that exits through the interpreter; or written already
        self.done = True
        import time

        from ...rank import tracer

        if exc is None:
            exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        # the journal complete (its last C line is deferred: trace_core.pending) before the exit record
        # says the rank ended, else the rank looks as if it left its last collective pending; ``stop``
        # also lets the default group go, as it would without us (the trace holds it)
        try:
            tracer.stop()
        except Exception as err:  # at exit, never in the way of the process's own status: said
            _warn(f"the journal's last lines may be missing ({type(err).__name__}: {err})")
        try:
            record = exitrecord.outcome(self.rank, exc)
            record.ended = time.time()
            jobdir.write_text(jobdir.exit_record(self.directory, self.rank), record.to_json())
        except Exception as err:  # at exit, never in the way of the process's own status: said
            _warn(f"no exit record ({type(err).__name__}: {err})")
        if self.agent is not None:
            self.agent.close()
