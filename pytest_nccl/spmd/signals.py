"""The signals a launched rank answers: SIGTERM from the launcher (one line saying which test this
rank was in, then go), and the decider's interrupt of a test body that the bound caught outside any
collective."""

from __future__ import annotations

import os
import signal
import sys
import threading

from .group import INTERRUPT_SIGNAL


class BoundReached(BaseException):
    """Raised in a rank's main thread when the test's bound was reached and the rank is still in
    the body outside any collective (a BaseException: ``except Exception`` in the test keeps it)."""


class RankSignals:
    """SIGTERM and the interrupt signal, for the session ``session`` (an ``SpmdSession``: the test in
    progress, the store, where to say things)."""

    def __init__(self, session):
        self.session = session
        self.finishing = False       # the session is over here: SIGTERM is ignored

    def install(self) -> None:
        try:
            signal.signal(signal.SIGTERM, self.on_sigterm)
            signal.signal(INTERRUPT_SIGNAL, self.on_interrupt)
        except ValueError:  # not the main thread
            pass

    def ignore_sigterm(self) -> None:
        """From here on every rank's exit code is its own (ignored in C: Python's own handlers are
        reset while the interpreter shuts down)."""
        self.finishing = True
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except ValueError:
            pass

    def _where(self) -> str:
        sp = self.session
        run = sp.run
        if run is not None:
            where = f"during {run.nodeid}"
            try:
                left = [r for r in range(sp.world) if not sp.group.store.check([run.keys.outcome(r)])]
                where += (" (another rank's process ended, or the job was cancelled); ranks that had not "
                          f"finished it: {','.join(map(str, left)) or 'none'}")
            except Exception:  # in a signal handler, a store gone raises by its type: said less
                where += " (another rank's process ended, or the job was cancelled)"
            return where
        if sp.last_nodeid is not None:
            return f"after {sp.last_nodeid}"
        return "before its first distributed test"

    def on_sigterm(self, signum, frame):
        """The launcher stops every rank when one exits with an error (or died): say in one line
        which test this rank was in, then go. Once the session is over here, ignore it: this rank
        leaves on its own, with its own exit code."""
        if self.finishing:
            return
        where = self._where()
        try:
            capman = self.session.config.pluginmanager.get_plugin("capturemanager")
            if capman is not None:
                capman.suspend_global_capture(in_=True)
        except Exception:  # in a signal handler: pytest's capture, any version, may refuse
            pass
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:  # sys.__stdout__ is None without a console
                    stream.flush()
            except Exception:  # in a signal handler: a stream may be anything by now
                pass
        self.session.say(f"the launcher stopped this rank (SIGTERM) {where}")
        os._exit(128 + signum)

    def on_interrupt(self, signum, frame):
        """INTERRUPT_SIGNAL: the bound was reached and the decider aborted the test. Raise in the main
        thread only while a fixture or the body runs (elsewhere pytest would see an INTERNALERROR)."""
        run = self.session.run
        if run is None or not run.interrupt or run.user_depth <= 0 or not run.running:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        run.interrupt = False  # once: the test may go on to clean up
        run.bound_reached = True
        raise BoundReached(f"pytest-nccl: the test's {run.bound:g} s bound was reached on rank "
                           f"{self.session.rank} (it was interrupted outside any collective)")
