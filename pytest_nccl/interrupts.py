"""Ending signals in the pytest process (controller side): SIGTERM and SIGHUP interrupt it as Ctrl-C does.

A hung test is most often ended by another hand: Ctrl-C, Slurm's SIGTERM at the time limit (SIGKILL
follows 30 s later), a closed terminal's SIGHUP. Python turns only SIGINT into ``KeyboardInterrupt``;
``Endings`` raises ``core.call.Interrupted`` for the other two, so the call being watched concludes as
interrupted (``CallDriver.run``), its report says where each rank was, and pytest stops as on Ctrl-C
(``session.record_failure`` sets ``shouldstop`` to ``stop_message``), its summary written. Then
``Endings.session_ended`` ends the process by the signal it got, so that its exit status is still
128+N, as a scheduler reads it. A second signal ends it at once, the
groups torn down first (the first one's handling may be what hangs).
"""

from __future__ import annotations

import os
import signal
from typing import Callable

import pytest

from .core.call import Interrupted

ENDING = (signal.SIGTERM, signal.SIGHUP)
#: on the session's handler: the one it replaced (a forked rank restores it: ``launched._forked_child``)
PREVIOUS_HANDLER = "_pytest_nccl_previous"


class Endings:
    """The pytest process's SIGTERM and SIGHUP handler; ``close`` tears the session's groups down."""

    def __init__(self, close: Callable[[], None]):
        self.close = close
        self.pid = os.getpid()
        self.got: int | None = None            # the first ending signal
        self.previous: dict[int, object] = {}
        self.installed: dict[int, object] = {}

    def install(self) -> None:
        for sig in ENDING:
            try:
                self.previous[sig] = signal.getsignal(sig)
                handler = self.installed[sig] = self._handler(sig)
                signal.signal(sig, handler)
            except (ValueError, OSError):  # not the main thread: pytest's defaults stay
                self.previous.pop(sig, None)
                self.installed.pop(sig, None)

    def _handler(self, sig: int):
        def on_signal(signum, frame):
            self._handle(signum, frame)

        vars(on_signal)[PREVIOUS_HANDLER] = self.previous[sig]
        return on_signal

    def _handle(self, signum: int, frame) -> None:
        previous = self.previous.get(signum)
        if os.getpid() != self.pid:  # a child a test forked (debug_launcher's ranks): not our session
            self._die(signum, previous, close=False)
            return
        if self.got is not None:
            self._die(signum, previous, close=True)
            return
        self.got = signum
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # another plugin's handler first; it may end the process itself
        raise Interrupted(signal.Signals(signum).name)

    def note(self, signum: int) -> None:
        """An ending signal that another handler took (an SPMD rank's, which reports the test first):
        the process still ends by it at the session's end."""
        if self.got is None and signum in ENDING:
            self.got = signum

    def _die(self, signum: int, previous, close: bool) -> None:
        if close:
            self.close()
        if callable(previous):
            previous(signum, None)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def session_ended(self) -> None:
        """At the session's very end: after an ending signal, end the process by it (its exit status
        is 128+N, as without the plugin); else put back the handlers it found (an in-process inner
        session leaves the outer one's) where ours is still in place: one set since stays (an SPMD
        rank ignores the launcher's SIGTERM from its own unconfigure on, to exit with its own code)."""
        if os.getpid() != self.pid:
            return
        if self.got is None:
            for sig, previous in self.previous.items():
                try:
                    if signal.getsignal(sig) is self.installed.get(sig):
                        signal.signal(sig, previous)  # type: ignore[arg-type]
                except (ValueError, OSError, TypeError):
                    pass
            return
        signum, self.got = self.got, None
        previous = self.previous.get(signum)
        if callable(previous):  # its own handler decides (it was called once already)
            return
        self.close()
        try:
            signal.signal(signum, signal.SIG_DFL)
        except ValueError:
            return
        os.kill(os.getpid(), signum)


def stop_message(nodeid: str, interrupted: str) -> str:
    """What pytest prints as it stops after an interrupted test (``session.shouldstop``)."""
    return f"{interrupted or 'interrupted'} while {nodeid} ran (where its ranks were: its report above)"


#: the session's ``Endings`` (plugin.py installs it; SPMD mode's rank signals note theirs in it)
ENDINGS_KEY = pytest.StashKey[Endings]()
