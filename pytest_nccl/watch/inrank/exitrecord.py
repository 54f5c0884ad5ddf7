"""Rank side of ``pytest-nccl watch``: how this process ends, as the exit record the watch reads
(``core.reports.RankReport``): the exception that ended it, or the status ``sys.exit`` was called
with (noted by a wrapper, ``wrap_sys_exit``). ``inject.py`` writes the record at exit."""

from __future__ import annotations

import sys

_exit_status: object = None     # what sys.exit was called with


def wrap_sys_exit(wrapped: str) -> None:
    """Note the status of every ``sys.exit`` call (``wrapped``: the attribute that marks the wrapper,
    never wrapped twice)."""
    real = sys.exit
    if getattr(real, wrapped, False):
        return

    def exit(status=None):
        global _exit_status
        _exit_status = status
        real(status)

    exit.__doc__ = real.__doc__
    vars(exit)[wrapped] = True
    sys.exit = exit


def outcome(rank: int, exc: BaseException | None):
    """How the process ends, as its exit record (``core.reports.RankReport``): raised (the exception;
    a SystemExit raised while handling one, as ``mp.spawn``'s wrapper does, is that one),
    ``sys.exit`` with a non-zero status, or passed."""
    from ...core.reports import RankReport
    from ...core.states import RankState

    status = _exit_status
    if isinstance(exc, SystemExit):
        cause = exc.__context__
        status = exc.code
        exc = cause if status not in (None, 0) and isinstance(cause, Exception) else None
    if exc is not None and not isinstance(exc, SystemExit):
        from ...rank.stacks import describe_exception, format_exception

        _, exc_type, text, message = describe_exception(exc, lambda e: format_exception(e, cut_to_user=True))
        return RankReport(rank, RankState.FAILED, exc_type=exc_type, exc_text=text, message=message)
    if status not in (None, 0):
        return RankReport(rank, RankState.FAILED, exc_type="SystemExit", message=f"SystemExit: {status}")
    return RankReport(rank, RankState.PASSED)
