"""Per pytest process: the parsed settings, the mode that runs marked items, what each item's run
left for the report, and the one place a failure is recorded (JUnit properties, trace dir).

Controller side. Two modes sit behind the small ``Mode`` interface: the forked groups
(``forked.mode.ForkedMode``) and SPMD under a launcher (``spmd.session.SpmdSession``); ``plugin.py``
holds the hooks and asks the session's mode.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Protocol

import pytest

from . import errors
from .budget import Budget, budget_for
from .core.diagnosis import Diagnosis
from .core.reports import CallOutcome
from .core.states import Reason
from .errors import DistributedTestFailure, NcclUsageError
from .interrupts import stop_message
from .placement import Placement, place
from .settings import Settings
from .views import tracedir


class Mode(Protocol):
    """How marked items run: every rank of a forked group, or this launched process as one rank."""

    def header(self) -> str:
        """The report header line."""

    def session_started(self, session: pytest.Session) -> None:
        """Before collection: start what takes long (the fork server imports torch meanwhile)."""

    def collection_finished(self, session: pytest.Session) -> None:
        """Collection is over: hand over what the first test needs."""

    def fixture_value(self, name: str, request) -> object:
        """The value of a rank-side fixture (``rank``, ``world_size``, ``device``, ``backend``)."""

    def controller_world(self, request) -> object:
        """The ``nccl_world`` fixture's value (or a skip)."""

    def run_item(self, item: pytest.Function) -> bool:
        """Run a marked test; raise its failure."""

    def close(self) -> None:
        """Tear down every process the mode started."""


@dataclass
class ItemOutcome:
    """What a marked item's run left for the report hooks and the gate report."""
    result: CallOutcome | None = None
    headline: str = ""
    kind: str = ""
    exception: str = ""


SESSION_KEY = pytest.StashKey["NcclSession"]()
OUTCOME_KEY = pytest.StashKey[ItemOutcome]()
STARTED_KEY = pytest.StashKey[float]()   # when the item's protocol started (pytest-timeout's clock)


def cuda_device_count() -> int:
    """GPUs on this host, without initializing CUDA in this process: ``device_count()`` asks NVML
    first (``is_available()`` would call cudaGetDeviceCount, which poisons later forks)."""
    try:
        import torch
    except ImportError:
        raise NcclUsageError("torch is not installed: install it first (see the README: "
                             "`pip install torch==2.13.0` on CPU-only machines)") from None
    try:
        return torch.cuda.device_count()
    except Exception:  # CUDA's driver errors differ by torch version: no GPU
        return 0


@dataclass
class NcclSession:
    """Per pytest process: settings, the mode, the test modules, results for the gate report."""
    config: pytest.Config
    settings: Settings
    mode: Mode | None = None
    cuda_devices: int = -1
    test_modules: dict = field(default_factory=dict)    # module name -> path, of nccl-marked tests
    environment: dict | None = None                      # for the gate report and JUnit properties
    recorder: object | None = None                       # gate.ReportRecorder

    def devices(self) -> int:
        if self.cuda_devices < 0:
            self.cuda_devices = cuda_device_count()
        return self.cuda_devices

    def placement(self, world: int, requested: str | None = None) -> Placement:
        return place(requested or self.settings.backend, world, self.devices())

    def close(self) -> None:
        if self.mode is not None:
            self.mode.close()


def junit_writer(config: pytest.Config):
    """pytest's JUnit XML writer when --junitxml is on. Found by its public method (the one
    ``record_testsuite_property`` uses), not through ``_pytest.junitxml``'s private stash key."""
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "LogXML" and callable(getattr(plugin, "add_global_property", None)):
            return plugin
    return None


def item_budget(item, timeout: float) -> Budget:
    """Our bound for ``item``, and pytest-timeout's deadline when it has one: ours fires first, so
    the report keeps the trace."""
    return budget_for(item, timeout, item.stash.get(STARTED_KEY, None))


def item_outcome(item) -> ItemOutcome:
    outcome = item.stash.get(OUTCOME_KEY, None)
    if outcome is None:
        outcome = item.stash[OUTCOME_KEY] = ItemOutcome()
    return outcome


def exception_class(name: str) -> type:
    """The public exception class of that name (a verdict travels by name in SPMD mode)."""
    cls = getattr(errors, name or "", None)
    if isinstance(cls, type) and issubclass(cls, DistributedTestFailure):
        return cls
    return DistributedTestFailure


def record_failure(item, session: NcclSession, diag: Diagnosis, exception: str, *,
                   result: CallOutcome | None = None, on_error=None) -> None:
    """The one place a failed item is recorded: headline, kind and exception for the report hooks,
    the JUnit XML and the gate report; the trace (and Flight Recorder dumps) in --nccl-trace-dir."""
    outcome = item_outcome(item)
    outcome.headline, outcome.kind, outcome.exception = diag.headline, diag.kind, exception
    if result is not None:
        outcome.result = result
        if result.reason == Reason.INTERRUPTED:  # reported where its ranks were; then pytest stops, as on Ctrl-C
            item.session.shouldstop = stop_message(item.nodeid, result.interrupted)
    # plain str: pytest-xdist (execnet) sends a report only of exact builtin types, never an enum
    item.user_properties.extend([("nccl_diagnosis", str(diag.headline)), ("nccl_diagnosis_kind", str(diag.kind)),
                                 ("nccl_exception", exception)])
    if session.settings.trace_dir and result is not None:
        page = write_trace(session.settings.trace_dir, item.nodeid, result, on_error)
        if page:
            item.user_properties.append(("nccl_trace_page", page))


def write_trace(directory: str, nodeid: str, result: CallOutcome, on_error=None) -> str | None:
    """A failed call in --nccl-trace-dir (``views.tracedir``: the JSON, Flight Recorder dumps, the
    Perfetto trace and the swimlane page). Returns the page's absolute path, or None when it could
    not be written. ``on_error(message)`` hears of what could not be written; without it an OSError
    on the JSON is raised, and a failure of the views becomes a warning (never the test's failure)."""
    def view_error(message: str) -> None:
        if on_error is not None:
            on_error(message)
        else:
            # stacklevel 1: the warning is about this write, not about a caller's line
            warnings.warn(pytest.PytestWarning("pytest-nccl: " + message), stacklevel=1)

    try:
        written = tracedir.write_trace(directory, nodeid, result, view_error)
    except OSError as exc:
        if on_error is None:
            raise
        on_error(f"cannot write the trace of {nodeid}: {exc}")
        return None
    page = written[-1]
    return os.path.abspath(page) if page.endswith(".html") else None
