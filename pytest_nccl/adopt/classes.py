"""Which collected test classes are adopted, and why a class is not.

A class is one of torch's harness classes when it derives from ``MultiProcessTestCase``,
``MultiProcContinuousTest`` or ``MultiThreadedTestCase`` of
``torch.testing._internal.common_distributed``. The module is looked up among those already
imported, never imported here: a test module that uses the harness has imported it.

Adopting a class replaces, in this process only, the methods through which torch's harness starts
and joins the class's ranks (``harness.py``); a class that overrides one of them starts its ranks
its own way, and runs under its own harness.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..core.messages import Harness

HARNESS_MODULE = "torch.testing._internal.common_distributed"

#: per harness, the controller-side methods the plugin takes over or relies on being torch's own
CONTROLLER_METHODS = {
    Harness.PROCESS: ("_start_processes", "_join_processes", "join_or_run", "_check_return_codes"),
    Harness.CONTINUOUS: ("_spawn_processes", "_worker_loop", "_worker_run_main_wait"),
}


@dataclass(frozen=True)
class Verdict:
    """What becomes of one collected class: its harness, and why it is not adopted (None: it is)."""
    harness: Harness
    why_not: str | None = None

    @property
    def adopted(self) -> bool:
        return self.why_not is None


def harness_base(harness: Harness) -> type | None:
    module = sys.modules.get(HARNESS_MODULE)
    base = getattr(module, harness.value, None) if module is not None else None
    return base if isinstance(base, type) else None


def harness_of(cls) -> Harness | None:
    """The harness ``cls`` derives from, or None."""
    if not isinstance(cls, type):
        return None
    for harness in Harness:
        base = harness_base(harness)
        if base is not None and issubclass(cls, base):
            return harness
    return None


def _owner(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def verdict_for(cls: type, module, name: str) -> Verdict | None:
    """Whether the class pytest collected as ``name`` from ``module`` is adopted; None: not a class
    of torch's harnesses."""
    harness = harness_of(cls)
    if harness is None:
        return None
    if harness == Harness.THREADED:
        return Verdict(harness, "MultiThreadedTestCase runs its ranks as threads of this process")
    base = harness_base(harness)
    for method in CONTROLLER_METHODS[harness]:
        owner = _owner(cls, method)
        if owner is not None and owner is not base:
            return Verdict(harness, f"{owner.__name__}.{method} is overridden: it starts or joins its ranks "
                                    "its own way")
    if getattr(module, name, None) is not cls:
        return Verdict(harness, f"{name} is not the name of the class in its module (a rank finds it by name)")
    return Verdict(harness)
