"""Ranks a test starts itself (docs/launched.md): ``torchrun``, ``python -m torch.distributed.run``,
``accelerate launch`` or ``deepspeed`` in a subprocess; ``torch.multiprocessing.spawn`` or
``start_processes``, accelerate's ``debug_launcher`` or ``notebook_launcher`` in the test's own
process. Controller side; ``plugin.py`` calls ``before`` and ``after`` around each test's call.

During the call of a test the plugin does not run itself (not marked ``nccl``, no ``nccl_world``):

- the session's environment carries the watch's (``watch.control.job_env``): its start-up hook first on
  ``PYTHONPATH``; the test's call, a directory of the test's own (the hook acts only with one).
  Every Python process the test executes, at any depth, traces its collectives once it imports
  torch, as under ``pytest-nccl watch``; a process the test forks (``start_method="fork"``:
  ``debug_launcher``) gets the same from ``os.register_at_fork`` (``inject.after_fork``). A test whose
  processes never import torch leaves no directory.
- the session's helper process (``watch/frontends/intest.py``) follows that directory with the watch's
  monitor, referee and judge. On a hang or a desync it ends every process the test started, so the
  test's own wait (``subprocess.run``, ``mp.spawn``'s join) returns within seconds.
- when the call returns, the helper judges what the journals show and ends what the test left
  running. Its verdict becomes the test's failure (``decide``): the exception kind and report a
  marked test gets.

What it costs a test that starts no ranks: a few environment variables set and restored and a
``stat`` of its directory (no thread in pytest, no message: the helper learns of a call from its
directory's name, ``TestCall``, once a process of the test makes it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

from .budget import MIN_BOUND, Budget, pytest_timeout_of
from .core.call import signal_of
from .core.jobdir import ENV_DIR
from .core.messages import LaunchedVerdict, Quit, TestCall, TestEnded, TestFollowed
from .interrupts import ENDING, PREVIOUS_HANDLER, stop_message
from .session import NcclSession, exception_class, item_budget, record_failure

LAUNCHED_KEY = pytest.StashKey["Launched"]()
RANKS_START = 10.0   # seconds of pytest-timeout's budget kept for the ranks to start (at most a quarter)
CLOSE_WAIT = 1.0     # seconds pytest waits for the helper at the session's end
ANSWER_WAIT = 60.0   # seconds pytest waits for the helper's verdict (it ends the test's processes first)
_HELPER = ("import sys; sys.path.insert(0, sys.argv[1]); from pytest_nccl.watch.frontends.intest import main; "
           "sys.exit(main(int(sys.argv[2]), sys.argv[3]))")
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watch", "inrank", "startup")  # as control's

_armed = False          # a test's call runs with its ranks followed: forked children get the hook
_fork_hook = False      # os.register_at_fork cannot be undone: registered once per process


def _forked_child() -> None:
    if not _armed:
        return
    from .watch.inrank import inject  # imported by ``Launched.start``: a lookup here

    inject.after_fork()
    # a forked rank keeps pytest's SIGTERM and SIGHUP handler, a Python one that never runs while the
    # rank waits in a collective (C++): the rank would outlive the SIGTERM that ends it
    for sig in ENDING:
        try:
            handler = signal.getsignal(sig)
            if hasattr(handler, PREVIOUS_HANDLER):
                previous = getattr(handler, PREVIOUS_HANDLER)
                signal.signal(sig, previous if callable(previous) or previous == signal.SIG_IGN else signal.SIG_DFL)
        except (ValueError, OSError, TypeError):
            pass


def boot_ticks() -> int:
    """Now, in the unit of a process's start time in ``/proc/PID/stat`` (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def stall_bound(budget: Budget) -> float:
    """How long the test's ranks may wait without progress. Under pytest-timeout, what its budget
    leaves (``Budget.bound``), less a part for the ranks to start: the clock of a stall starts once a
    rank waits in a collective, not with the call, and ours must fire before pytest-timeout's."""
    bound = budget.bound()
    if budget.deadline is not None:
        bound = max(MIN_BOUND, bound - min(RANKS_START, bound / 4))
    return round(bound, 1)  # as the report prints it


def decide(verdict: LaunchedVerdict | None, failed: bool) -> bool:
    """Whether the helper's verdict becomes the test's failure. A hang or a desync it ended the job
    for: always (the test would have waited forever, or passed on a job that never finished). A
    rank that raised or died, or what the journals show once the job ended on its own: only when the
    test failed too; the launcher told the test of those itself (``mp.spawn`` raised, ``torchrun``
    exited non-zero), and a test that expects a failing job passes as before."""
    if verdict is None:
        return False
    return failed or (verdict.live and not verdict.launcher_sees)


@dataclass
class LaunchedCall:
    """One test's call, followed."""
    call: TestCall
    environ: dict        # name -> (value before the call or None, value set for it)


class Launched:
    """The session's side of it: the helper, and each call's environment."""

    def __init__(self, session: NcclSession, off: str | None):
        self.session = session
        self.off = off                     # why tests' own ranks are not followed in this session
        self.base: str | None = None
        self.conn: Connection | None = None
        self.helper: subprocess.Popen | None = None
        self.job_env: dict | None = None   # what watch.control.job_env adds for the session: name -> (before, value)
        self.n = 0
        self.pytest_timeout: float | None = None   # pytest-timeout's session-wide seconds (0: none)

    def header(self) -> str:
        if self.off is not None:
            return f"nccl: ranks a test starts itself are not followed ({self.off})"
        return ("nccl: ranks a test starts itself (torchrun, mp.spawn, accelerate's debug_launcher...) are traced "
                f"and judged; a hang ends them after {self.session.settings.timeout:g} s without progress "
                "(--nccl-adopt=off: not)")

    def start(self) -> None:
        """The helper, at the first test it may follow (a session that runs none starts nothing)."""
        global _fork_hook
        if self.off is not None or self.helper is not None:
            return
        from .watch.engine import control
        from .watch.inrank import inject  # noqa: F401  (imported before any fork: see _forked_child)

        # the same for every test: computed once (a copy of os.environ per test would cost)
        # set once for the session (six variables per test would cost): the start-up hook does nothing
        # in a process whose environment has no test directory
        template = control.job_env("")
        self.job_env = {k: (os.environ.get(k), v) for k, v in template.items()
                        if os.environ.get(k) != v and k != ENV_DIR}
        for name, (_, value) in self.job_env.items():
            os.environ[name] = value
        try:
            self.base = control.job_dir()
            from multiprocessing import Pipe  # here: the plugin must load where multiprocessing cannot
            ours, theirs = Pipe(duplex=True)
            debug = None if os.environ.get("PYTEST_NCCL_WATCH_DEBUG") else subprocess.DEVNULL
            self.helper = subprocess.Popen([sys.executable, "-c", _HELPER, _PACKAGE_PARENT, str(theirs.fileno()),
                                            self.base],
                                           pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=debug)
            theirs.close()
            self.conn = ours
        except OSError as exc:
            self.off = f"its helper process could not start: {exc}"
            return
        if not _fork_hook:
            os.register_at_fork(after_in_child=_forked_child)
            _fork_hook = True

    def applies(self, item) -> bool:
        if self.off is not None or item.get_closest_marker("nccl") is not None \
                or "nccl_world" in getattr(item, "fixturenames", ()):
            return False
        if self.helper is None:
            self.start()
        return self.conn is not None

    # -- one test's call ----------------------------------------------------------------------------------
    def before(self, item) -> LaunchedCall | None:
        global _armed
        if not self.applies(item):
            return None
        assert self.base is not None and self.conn is not None and self.job_env is not None
        self.n += 1
        test = TestCall(self.n, "", boot_ticks(), self._bound(item))
        test.directory = os.path.join(self.base, test.name)  # what the helper reads the call from
        environ = {ENV_DIR: (os.environ.get(ENV_DIR), test.directory)}
        path = os.environ.get("PYTHONPATH") or ""
        if not path.startswith(STARTUP_DIR):  # the test's own set-up changed it: the hook first again
            environ["PYTHONPATH"] = (path, STARTUP_DIR + (os.pathsep + path if path else ""))
        call = LaunchedCall(test, environ)
        for name, (_, value) in call.environ.items():
            os.environ[name] = value
        _armed = True
        return call

    def _bound(self, item) -> float:
        timeout = self.session.settings.timeout
        if self.pytest_timeout is None:  # the session's, read once (per item it costs)
            self.pytest_timeout = pytest_timeout_of(item)[0] if item.get_closest_marker("timeout") is None else -1.0
        if not self.pytest_timeout and item.get_closest_marker("timeout") is None:
            return timeout
        return stall_bound(item_budget(item, timeout))

    def after(self, call: LaunchedCall, item, exc: BaseException | None) -> None:
        """The call returned (``exc``: what it raised): raise the verdict as the test's failure."""
        __tracebackhide__ = True
        global _armed
        _armed = False
        for name, (before, value) in call.environ.items():
            _restore(name, before, value)
        own = _own_failure(item, exc)
        failed = own is not None or isinstance(exc, (KeyboardInterrupt, SystemExit))
        until = boot_ticks()
        if not os.path.isdir(call.call.directory):
            # no process of the test imported torch: nothing to judge, no message (a process it left
            # running is ended when it makes the directory, or at the session's end)
            return
        interrupted = signal_of(exc) if isinstance(exc, KeyboardInterrupt) else ""
        verdict = self._answer(TestEnded(call.call, failed, until, interrupted))
        shutil.rmtree(call.call.directory, ignore_errors=True)
        if interrupted:  # where the test's ranks were, as the test's report; then pytest stops
            if verdict is not None and verdict.finding is not None:
                # also a verdict reached as the same Ctrl-C ended the ranks (a terminal's reaches them too)
                item.session.shouldstop = stop_message(item.nodeid, interrupted)
                self._raise(item, call, verdict, None)
            return
        if isinstance(exc, SystemExit) or not decide(verdict, own is not None):
            return
        assert verdict is not None
        self._raise(item, call, verdict, own)

    def _raise(self, item, call: LaunchedCall, verdict: LaunchedVerdict, own: BaseException | None) -> None:
        __tracebackhide__ = True
        cls = exception_class(verdict.exception)
        finding: Any = verdict.finding   # the helper's core.reports.CallOutcome
        diag = getattr(finding, "diagnosis", None)
        report = verdict.report or verdict.headline
        if own is not None:
            line = f"{type(own).__name__}: {own}".split("\n")[0][:500]
            report += f"\n\nThe test itself raised {line}"
        if finding is not None and diag is not None:
            finding.bound = call.call.bound  # the test's bound, which the helper's watch ran under
            record_failure(item, self.session, diag, cls.__name__, result=finding,
                           on_error=lambda message: warnings.warn(pytest.PytestWarning("pytest-nccl: " + message),
                                                                  stacklevel=1))
        if getattr(item, "_excinfo", None):  # unittest's own record of the failure would win over ours
            item._excinfo = []
        raise cls(verdict.headline, diag, report) from own

    # -- the helper -----------------------------------------------------------------------------------------
    def _send(self, message) -> bool:
        try:
            assert self.conn is not None
            self.conn.send(message)
            return True
        except (OSError, AssertionError):
            self._lost()
            return False

    def _answer(self, ended: TestEnded) -> LaunchedVerdict | None:
        if not self._send(ended):
            return None
        assert self.conn is not None
        deadline = time.monotonic() + ANSWER_WAIT
        try:
            while self.conn.poll(max(0.0, deadline - time.monotonic())):
                answer = self.conn.recv()
                if isinstance(answer, TestFollowed) and answer.n == ended.call.n:
                    return answer.verdict
        except (EOFError, OSError):
            self._lost()
            return None
        warnings.warn(pytest.PytestWarning(f"pytest-nccl: no word from the helper on this test's ranks within "
                                           f"{ANSWER_WAIT:g} s"), stacklevel=1)
        return None

    def _lost(self) -> None:
        self.off = "its helper process ended"
        self.conn = None
        warnings.warn(pytest.PytestWarning("pytest-nccl: the helper that follows the ranks tests start "
                                           "themselves ended; the next tests run without it"), stacklevel=1)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(Quit())
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        if self.helper is not None:
            try:  # an idle helper exits at once; one still ending a test's leftovers finishes that first,
                self.helper.wait(timeout=CLOSE_WAIT)  # also after pytest exits (it is their guardian)
            except subprocess.TimeoutExpired:
                pass
            self.helper = None
        for name, (before, value) in (self.job_env or {}).items():
            _restore(name, before, value)
        self.job_env = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


def _restore(name: str, before: str | None, value: str) -> None:
    if os.environ.get(name) == value:  # unless the test changed it itself
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _own_failure(item, exc: BaseException | None) -> BaseException | None:
    """The test's own failure: what its call raised, or what unittest recorded; not a skip or an xfail."""
    outcomes = (pytest.skip.Exception, pytest.xfail.Exception, KeyboardInterrupt, SystemExit)
    if exc is not None and not isinstance(exc, outcomes):
        return exc
    import unittest
    for info in getattr(item, "_excinfo", None) or ():
        if not isinstance(info.value, (unittest.SkipTest, *outcomes)):
            return info.value
    return None


def off_reason(session: NcclSession, spmd: bool) -> str | None:
    """Why tests' own ranks are not followed in this session, or None."""
    if not session.settings.adopt:
        return "--nccl-adopt=off"
    if spmd:
        return "SPMD mode: this process is one rank"
    if os.environ.get(ENV_DIR):
        return "this pytest runs under pytest-nccl watch, which follows them"
    return None
