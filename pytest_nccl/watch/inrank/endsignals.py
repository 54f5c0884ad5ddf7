"""Rank side of ``pytest-nccl watch``: a rank ended by another hand writes where it was first.

torchrun ends every other worker with SIGTERM once one failed (NCCL's watchdog aborted it, say); Ray
ends its actors, srun and Slurm's time limit send SIGTERM, a closed terminal SIGHUP. A rank gone so
leaves no exit record, and where it was would be lost. ``install`` has faulthandler write every
thread's stack to ``signal-R-SIG.txt`` when SIGTERM or SIGHUP arrives: from C, so it works while the
main thread waits inside a collective, then chained to the handler that was there, so the signal's
own effect and the exit status stay (an unhandled SIGTERM still kills by SIGTERM; a job's handler
still runs). A handler the job installs later is kept in the same order: ``signal.signal`` is wrapped
to put faulthandler back in front of it. A child the rank forks (a data loader's worker) writes
nothing: its end is not the rank's.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
from typing import TextIO

from ...core import jobdir

SIGNALS = tuple(signal.Signals[name] for name in jobdir.ENDING_SIGNALS)
_files: dict[int, TextIO] = {}
_pid = 0
_fork_hook = False  # os.register_at_fork cannot be undone: registered once a process
WRAPPED = "_pytest_nccl_endsignals"


def install(directory: str, rank: int) -> None:
    """From now on, SIGTERM and SIGHUP write this rank's stacks before their own effect."""
    global _pid, _fork_hook
    close()
    _pid = os.getpid()
    for sig in SIGNALS:
        _files[sig] = open(jobdir.ended_by(directory, rank, signal.Signals(sig).name), "w")
        _register(sig)
    _wrap_signal()
    if not _fork_hook:
        os.register_at_fork(after_in_child=_forget)
        _fork_hook = True


def _register(sig: int) -> None:
    faulthandler.register(sig, file=_files[sig], all_threads=True, chain=True)


def _forget() -> None:
    """In a forked child: the signals as they were before us (the child's end is not the rank's)."""
    for sig in list(_files):
        try:
            faulthandler.unregister(sig)
        except (ValueError, RuntimeError):
            pass
    _files.clear()


def close() -> None:
    """No more stacks on these signals (the rank's process group is gone, or it starts anew)."""
    if os.getpid() == _pid:
        for sig in list(_files):
            try:
                faulthandler.unregister(sig)
            except (ValueError, RuntimeError):
                pass
    for f in _files.values():
        try:
            f.close()
        except OSError:
            pass
    _files.clear()


def _wrap_signal() -> None:
    real = signal.signal
    if getattr(real, WRAPPED, False):
        return

    @functools.wraps(real)
    def signal_(signalnum, handler):
        if signalnum not in _files or os.getpid() != _pid:
            return real(signalnum, handler)
        # faulthandler chains to the handler it found when it registered: take it off (it puts back
        # what it found), let the job's handler in, and register again in front of it
        faulthandler.unregister(signalnum)
        try:
            return real(signalnum, handler)
        finally:
            _register(signalnum)

    vars(signal_)[WRAPPED] = True
    signal.signal = signal_
