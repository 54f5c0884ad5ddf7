"""The default worlds of a watched attempt beside its first: a job may create several (OpenRLHF's
trainer ranks beside each vLLM engine's own world, verl's worker groups on separate resource pools).
Each world's ranks write to a directory of their own (``jobdir.world_dir``), rank numbers from 0
again; each is followed by a ``Monitor`` of its own on this node, and a verdict in any of them is
the job's. The attempt's first world keeps the cli's own monitor (and the channel to other nodes'
watches); another world is followed on this node only.
"""

from __future__ import annotations

import time

from ...core import jobdir
from ...core.reports import CallOutcome
from ...core.states import Reason
from ..timing import TIMING
from .monitor import Monitor


def _no_channel(info, is_deciding):
    return None


def label(directory: str) -> str:
    """How a report names a world beside the first: by its store and size."""
    key = jobdir.world_key(directory)
    return f"another default world of this job ({key})" if key else "another default world of this job"


class OtherWorlds:
    """The worlds beside the first in one attempt's ``directory``."""

    def __init__(self, directory: str, timeout: float):
        self.dir, self.timeout = directory, timeout
        self.monitors: dict[str, Monitor] = {}
        self.done: set[str] = set()     # concluded (a verdict given, or nothing to act on)
        self.ended: set[str] = set()    # every rank ended: polled no more; its journals read at the job's end
        self._next_scan = 0.0

    def _scan(self, now: float) -> None:
        if now < self._next_scan:
            return
        self._next_scan = now + TIMING.scan_every * 4  # rarer than ranks: a world appears once
        for path in jobdir.other_worlds(self.dir):
            if path not in self.monitors:
                self.monitors[path] = Monitor(path, self.timeout, connect=_no_channel)

    def _followed(self):
        return [(path, m) for path, m in self.monitors.items() if path not in self.done]

    def poll(self, now: float) -> tuple[str, CallOutcome] | None:
        """(the world's label, its verdict) once a world's referee decided and the judge found a fault."""
        self._scan(now)
        for path, monitor in self._followed():
            if path in self.ended:
                continue
            reason = monitor.poll(now)
            if reason == Reason.COMPLETED:
                # as the first world's: what its journals show waits for the launcher's own status
                # (Ray ends a worker group's actors at the driver's end without an exit record)
                self.ended.add(path)
            elif reason in (Reason.DECIDED, Reason.TIMEOUT):
                self.done.add(path)
                finding = monitor.conclude(reason, time.monotonic())
                if finding.diagnosis is not None:
                    return label(path), finding
        return None

    def after_exit(self, now: float, launcher_ok: bool = False) -> tuple[str, CallOutcome] | None:
        """The job ended on its own: the first world beside the first whose journals show a failure."""
        self._next_scan = 0.0
        self._scan(now)
        for path, monitor in self._followed():
            monitor.poll(now)  # ranks written since the last look
            finding = monitor.after_exit(now, launcher_ok=launcher_ok)
            if finding is not None:
                return label(path), finding
        return None

    def wake_at(self, now: float) -> float:
        return min([m.wake_at(now) for path, m in self._followed() if path not in self.ended],
                   default=now + TIMING.scan_every * 4)

    def close(self) -> None:
        for monitor in self.monitors.values():
            monitor.close()
