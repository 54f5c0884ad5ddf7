"""How a process ended, from its raw wait status: the one decoder every transport uses (the fork
server reports its ranks' statuses, the watch reads a zombie's from /proc)."""

from __future__ import annotations

import os
import signal


def signal_name(num: int) -> str:
    """'SIGABRT' for 6; a number the platform does not name reads 'signal 77'."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def decode_wait_status(status: int) -> tuple[int | None, str | None]:
    """(exit code, signal name) of a raw wait status; (None, None) when it says neither (-1: the
    status could not be read)."""
    if status < 0:
        return None, None
    if os.WIFSIGNALED(status):
        return None, signal_name(os.WTERMSIG(status))
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def describe_wait_status(status: int) -> str:
    """'killed by SIGKILL', 'exited with code 3', or 'exited' when the status says neither."""
    code, sig = decode_wait_status(status)
    if sig is not None:
        return f"killed by {sig}"
    if code is not None:
        return f"exited with code {code}"
    return "exited"
