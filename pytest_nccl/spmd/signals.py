"""The signals a launched rank answers: an ending signal (Ctrl-C, SIGTERM, SIGHUP), and the decider's
interrupt of a test body that the bound caught outside any collective.

An ending signal during a marked test interrupts the test on every rank, as Ctrl-C does a forked
group's: this rank notes it, its watchdog publishes it, rank 0's decider concludes the call as
interrupted (where each rank was), and every rank stops after the test. The launcher forwards the
signal it got (torchrun: the same one, to every rank), so a second one cannot be told from the
forward: it is ignored, and ``TIMING.interrupt_wait`` after the first the rank ends regardless.
The Python handler runs only when the main thread returns to Python (an NCCL rank may sit in
``cudaStreamSynchronize``): the watchdog also reads the signal from the wakeup fd. Outside a marked
test, SIGINT raises KeyboardInterrupt and SIGTERM or SIGHUP (the launcher stopping every rank after
one exited with an error) says in one line which test this rank was in or came after, and which
ranks' processes it sees ended, and the first line of each test that failed here (pytest's summary
of them will not come), then goes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from ..core.diagnosis.wording import rank_list
from ..interrupts import ENDINGS_KEY
from .group import INTERRUPT_SIGNAL
from .timing import TIMING

ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class BoundReached(BaseException):
    """Raised in a rank's main thread when the test's bound was reached and the rank is still in
    the body outside any collective (a BaseException: ``except Exception`` in the test keeps it)."""


class RankSignals:
    """SIGTERM and the interrupt signal, for the session ``session`` (an ``SpmdSession``: the test in
    progress, the store, where to say things)."""

    def __init__(self, session):
        self.session = session
        self.finishing = False       # the session is over here: SIGTERM is ignored
        self.got: int | None = None  # the first ending signal
        self._lock = threading.Lock()
        self._wakeup = -1            # read end of the wakeup fd (signal numbers, written in C)
        self.pid = os.getpid()

    def install(self) -> None:
        try:
            for sig in ENDING:
                signal.signal(sig, self.on_ending)
            signal.signal(INTERRUPT_SIGNAL, self.on_interrupt)
        except ValueError:  # not the main thread
            return
        os.register_at_fork(after_in_child=self._forked)
        read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            previous = -2
        if previous != -1:  # the process has one already (its owner reads it): the handler alone
            if previous >= 0:
                signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        self._wakeup = read

    def _forked(self) -> None:
        """A process this rank forks (a DataLoader worker, a multiprocessing child) is not the rank:
        none of its signals may reach this rank's wakeup fd, where it would read as the rank's own.
        Its handlers stay (the watch's at-fork hook may put our C handler back after any change made
        here): ``on_ending`` gives a signal there its usual effect (``terminate()`` kills it)."""
        if self._wakeup >= 0:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:  # forked from a thread other than the main one: Python keeps none there
                pass

    def drain(self) -> None:
        """Forget signals written before now (a marked test starts: they were handled already)."""
        self._read_wakeup()

    def _read_wakeup(self) -> bytes:
        if self._wakeup < 0:
            return b""
        try:
            return os.read(self._wakeup, 512)
        except (BlockingIOError, OSError):
            return b""

    def poll(self) -> None:
        """The watchdog thread, each tick of a marked test: an ending signal the main thread has not
        handled yet (it waits in C++) is noted from here."""
        for signum in self._read_wakeup():
            if signum in ENDING and not (self.finishing and signum == signal.SIGTERM):
                self._note(signum)

    def _note(self, signum: int) -> bool:
        """The first ending signal: the test in progress (if any) is interrupted; the session's end
        ends the process by it (SIGTERM, SIGHUP), and so does a deadline. False for a later one."""
        with self._lock:
            if self.got is not None:
                return False
            self.got = signum
        run = self.session.run
        if run is not None:
            run.interrupted_by = signal.Signals(signum).name
        endings = self.session.config.stash.get(ENDINGS_KEY, None)
        if endings is not None:
            endings.note(signum)
        threading.Thread(target=self._deadline, args=(signum,), name="pytest-nccl-interrupt-deadline",
                         daemon=True).start()
        return True

    def _deadline(self, signum: int) -> None:
        threading.Event().wait(TIMING.interrupt_wait)
        self.session.say(f"{signal.Signals(signum).name}: the session did not end within "
                         f"{TIMING.interrupt_wait:g} s; this rank ends now")
        os._exit(128 + signum)

    def on_ending(self, signum, frame):
        """SIGINT, SIGTERM, SIGHUP in the main thread (module doc)."""
        __tracebackhide__ = True  # pytest names where the main thread was, not this handler
        if os.getpid() != self.pid:  # a child this rank forked (``_forked``): the signal's usual effect
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.got is not None:
            return  # the launcher's forward of the first one, or a second: the deadline ends the rank
        if self.finishing and signum == signal.SIGTERM:
            return  # the launcher stopping every rank: this one leaves on its own, with its own exit code
        if self.session.run is not None or self.finishing:
            self._note(signum)
            return
        if signum == signal.SIGINT:
            self._note(signum)
            raise KeyboardInterrupt
        self.on_sigterm(signum, frame)

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
        where = f"after {sp.last_nodeid}" if sp.last_nodeid is not None else "before its first distributed test"
        try:  # between two tests the launcher's reason is a rank that ended: named where this rank sees it
            gone = [r for r in range(sp.world) if r != sp.rank and sp.group.ended(r, sp.group.store)]
        except Exception:  # in a signal handler, a store gone raises by its type: said less
            gone = []
        if gone:
            where += f"; the process{'es' if len(gone) > 1 else ''} of {rank_list(gone)} had ended"
        return where

    def on_sigterm(self, signum, frame):
        """The launcher stops every rank when one exits with an error (or died): say in one line
        which test this rank was in, then go."""
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
        self.session.say(f"the launcher stopped this rank ({signal.Signals(signum).name}) {where}")
        for nodeid, line in self.session.failures.items():  # pytest's summary of them is not coming
            self.session.say(f"failed here before it: {nodeid}: {line}")
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
