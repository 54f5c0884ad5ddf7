"""The bound of one test, under pytest-timeout's budget when it has one: ours fires first, so the report
keeps the trace. Controller side; reads pytest-timeout's marker, options and ini keys."""

from __future__ import annotations

import time
from dataclasses import dataclass

# Under pytest-timeout, our bound ends this long before pytest-timeout's deadline: what it takes
# to collect every stuck rank's stack (DUMP_WAIT), tear the group down and write the report.
PYTEST_TIMEOUT_RESERVE = 3.0
MIN_BOUND = 0.5


def _number(value) -> float:
    try:
        return float(value) if value not in (None, "") else 0.0
    except (TypeError, ValueError):
        return 0.0


def pytest_timeout_of(item) -> tuple[float, bool]:
    """(seconds, func_only) of pytest-timeout for this item; 0 when it sets none."""
    seconds, func_only = None, None
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        seconds = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        func_only = marker.kwargs.get("func_only")
    config = item.config
    if seconds is None:
        for get in (config.getoption, config.getini):
            try:
                seconds = get("timeout")
            except (ValueError, KeyError, AttributeError):
                seconds = None
            if seconds not in (None, ""):
                break
    if func_only is None:
        try:
            func_only = config.getini("timeout_func_only")
        except (ValueError, KeyError):
            func_only = False
    return _number(seconds), bool(func_only) and str(func_only).lower() not in ("false", "0")


@dataclass
class Budget:
    """The time a test may take: our bound, and pytest-timeout's deadline when it has one.

    pytest-timeout's clock starts with the item's set-up (or with the call, ``func_only``), and
    group start (fork server, imports, rendezvous) happens inside the call: so the bound is what is
    left of pytest-timeout's budget once the group is up, minus what our report needs.
    """
    timeout: float
    deadline: float | None = None    # time.monotonic() at which pytest-timeout fires

    def setup_deadline(self, now: float | None = None, minimum: float = 30.0) -> float:
        now = time.monotonic() if now is None else now
        own = now + max(self.timeout, minimum)
        return own if self.deadline is None else min(own, self.deadline - PYTEST_TIMEOUT_RESERVE)

    def bound(self, now: float | None = None) -> float:
        """The bound of a call that starts now."""
        if self.deadline is None:
            return self.timeout
        now = time.monotonic() if now is None else now
        return max(MIN_BOUND, min(self.timeout, self.deadline - now - PYTEST_TIMEOUT_RESERVE))


def budget_for(item, timeout: float, started: float | None) -> Budget:
    """``started``: when pytest-timeout's clock started for this item (set-up, or the call)."""
    seconds, func_only = pytest_timeout_of(item)
    if seconds <= 0:
        return Budget(timeout)
    start = started if (started is not None and not func_only) else time.monotonic()
    return Budget(timeout, start + seconds)
