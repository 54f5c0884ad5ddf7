"""The adopter: torch's ``MultiProcessTestCase`` and ``MultiProcContinuousTest`` classes, their
ranks taken from the fork server (controller side; the forked mode's pool and judge).

- at collection, each unittest class of torch's harnesses gets its verdict (``classes.py``);
  adopted ones have their modules imported by the fork server, and torch's harness methods are
  taken over in this process (``harness.py``);
- ``MultiProcessTestCase``: every test gets fresh ranks, forked (milliseconds, not an interpreter
  start per rank), each running ``cls._run`` as a spawned rank would (``rank/adopted.py``);
- ``MultiProcContinuousTest``: one group per class, kept while its tests pass; after a failure the
  next test gets a fresh group (a new rendezvous file, ``_init_pg`` again), so later tests still run.

A failure is the plugin's verdict (headline, trace, stacks, exception), exactly as for a marked test;
where every rank finished cleanly, torch's rules give the pass or skip (``rules.py``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import unittest
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from ..budget import Budget
from ..core.messages import AdoptedTest, Call, CallKind, Harness
from ..core.states import Backend
from ..errors import NcclUsageError
from ..placement import Placement
from ..session import NcclSession, item_budget, item_outcome
from ..settings import parse_marker
from .classes import Verdict, harness_of, verdict_for
from .harness import Takeover
from .rules import ANY_EXIT, torch_outcome

if TYPE_CHECKING:
    from ..forked.mode import ForkedMode

#: an item's class verdict (set on the tests of torch's harness classes only)
ADOPTED_KEY = pytest.StashKey[Verdict]()
#: the session's adopter (plugin.py keeps it in the config's stash)
ADOPTER_KEY = pytest.StashKey["Adopter"]()


@dataclass
class ContinuousClass:
    """A ``MultiProcContinuousTest`` class's ranks as its ``_spawn_processes`` asked for them."""
    world: int
    environ: dict
    rdvz_file: str = ""
    group: object = None       # the group its ranks were last bootstrapped in


@dataclass
class Adopter:
    session: NcclSession
    mode: ForkedMode | None                              # None: nothing is adopted (SPMD mode)
    verdicts: dict = field(default_factory=dict)         # class -> Verdict
    counts: dict = field(default_factory=dict)           # class -> adopted items
    current: pytest.Function | None = None               # the adopted item being run
    starts: dict = field(default_factory=dict)           # id(instance) -> environment at _start_processes
    continuous: dict = field(default_factory=dict)       # class -> ContinuousClass
    takeover: Takeover | None = None
    off: str | None = None     # why nothing is adopted in this session (None: adoption is on)

    # -- collection --------------------------------------------------------------------------------
    def collected(self, items) -> None:
        for item in items:
            cls = getattr(item, "cls", None)
            if cls is None or not isinstance(item, pytest.Function) or not issubclass(cls, unittest.TestCase):
                continue
            verdict = self.verdicts.get(cls)
            if verdict is None and cls not in self.verdicts:
                verdict = self.verdicts[cls] = verdict_for(cls, item.module, _class_name(item))
            if verdict is None:
                continue
            if self.off is not None and verdict.adopted:
                verdict = self.verdicts[cls] = Verdict(verdict.harness, self.off)
            item.stash[ADOPTED_KEY] = verdict
            if verdict.adopted:
                self.counts[cls] = self.counts.get(cls, 0) + 1
                self.session.test_modules[item.module.__name__] = item.module.__file__

    def class_collected(self, obj) -> None:
        """A class is being collected: if it is one of torch's harness classes, take the harness over
        now, before pytest makes the instances its tests run on (``MultiProcContinuousTest`` wraps
        each test method when an instance is made)."""
        if self.takeover is None and self.off is None and harness_of(obj) is not None:
            self.takeover = Takeover(self)
            self.takeover.install()

    def report_lines(self) -> list[str]:
        """What the session says after collection: what was adopted, and what was not and why."""
        lines = []
        if self.counts:
            names = ", ".join(f"{cls.__name__} ({self.verdicts[cls].harness.value}, {n} tests)"
                              for cls, n in self.counts.items())
            lines.append(f"nccl: adopted onto the fork server: {names}")
        for cls, verdict in self.verdicts.items():
            if verdict is not None and not verdict.adopted:
                lines.append(f"nccl: not adopted, runs under its own harness: {cls.__name__} ({verdict.why_not})")
        return lines

    # -- which instance is being run ------------------------------------------------------------------
    def running(self, item) -> None:
        verdict = item.stash.get(ADOPTED_KEY, None)
        self.starts.clear()  # a test whose setUp started ranks and then skipped never joined them
        self.current = item if verdict is not None and verdict.adopted and isinstance(item, pytest.Function) else None

    def owns(self, instance) -> bool:
        item = self.current
        return (item is not None and type(instance) is item.cls
                and getattr(instance, "_testMethodName", None) == item.name)

    def owns_class(self, cls) -> bool:
        return self.current is not None and cls is self.current.cls

    def finished(self, item, nextitem) -> None:
        """After an item's teardown: a continuous class whose last test ran lets its ranks go."""
        cls = getattr(item, "cls", None)
        if cls in self.continuous and (nextitem is None or getattr(nextitem, "cls", None) is not cls):
            state = self.continuous.pop(cls)
            pool = getattr(self.mode, "pool", None)
            if pool is not None and state.group is not None and pool.group is state.group:
                pool.release()
            _remove(state.rdvz_file)

    # -- MultiProcessTestCase ------------------------------------------------------------------------
    def process_ranks_started(self, instance) -> None:
        self.starts[id(instance)] = dict(os.environ)  # what spawned ranks would have inherited

    def process_ranks_pending(self, instance) -> bool:
        return id(instance) in self.starts and not instance.processes

    def run_process_test(self, instance, fn) -> None:
        __tracebackhide__ = True
        item = self.current
        assert item is not None, "owns() said this instance is the current item's"
        environ = self.starts.pop(id(instance))
        if fn in getattr(instance, "skip_return_code_checks", ()):
            expected = ANY_EXIT
        else:
            expected = getattr(instance, "special_return_code_checks", {}).get(fn, 0)
        world = int(instance.world_size)
        test = AdoptedTest(Harness.PROCESS, _class_name(item), instance._current_test_name(), instance.id(), world,
                           file_name=instance.file_name, environ=environ,
                           kwargs={"fake_pg": getattr(instance, "fake_pg", False)})
        try:
            self._run(item, test, world, expected, own_group=f"{type(instance).__qualname__}:{id(instance)}")
        finally:
            pool = getattr(self.mode, "pool", None)
            if pool is not None:
                pool.release()  # fresh ranks for every test, as torch's harness spawns them

    # -- MultiProcContinuousTest -----------------------------------------------------------------------
    def continuous_ranks_started(self, cls, world: int) -> None:
        self.continuous[cls] = ContinuousClass(world, dict(os.environ))
        cls.processes, cls.task_queues, cls.completion_queues = [], [], []
        cls.rdvz_file = _new_file()  # what tearDownClass removes, whether or not a test ran

    def run_continuous_test(self, instance) -> None:
        __tracebackhide__ = True
        item = self.current
        assert item is not None, "owns() said this instance is the current item's"
        cls = type(instance)
        state = self.continuous[cls]
        test = AdoptedTest(Harness.CONTINUOUS, _class_name(item), instance._testMethodName, instance.id(),
                           state.world, environ=state.environ)
        self._run(item, test, state.world, 0, own_group=cls.__qualname__, continuous=state)

    # -- one adopted test on the fork server's ranks ----------------------------------------------------
    def _run(self, item: pytest.Function, test: AdoptedTest, world: int, expected, own_group: str,
             continuous: ContinuousClass | None = None) -> None:
        __tracebackhide__ = True
        mode = self.mode
        assert mode is not None, "nothing is adopted without the forked mode"
        budget = self._budget(item, test.test_name)
        placement = self._placement(world)
        module = item.module
        call = Call(0, CallKind.ADOPTED, module.__name__, getattr(module, "__file__", "") or "",
                    f"{test.class_name}.{test.test_name}", nodeid=item.nodeid, adopted=test)
        group = mode.group(call, world, placement, budget, own_group=own_group)
        # the fork server's settings (gloo on the loopback interface, OMP_NUM_THREADS) unless the
        # session set them: its zygote_env reads them from this environment first
        test.environ = {**test.environ, **mode.get_pool().zygote_env}
        if continuous is not None and continuous.group is not group:
            # fresh ranks (the first test, or after a failure): a new rendezvous for _init_pg
            _remove(continuous.rdvz_file)
            continuous.rdvz_file = _new_file()
            continuous.group = group
            item.cls.rdvz_file = continuous.rdvz_file  # what tearDownClass removes
        if continuous is not None:
            test.rdvz_file = continuous.rdvz_file
        result = mode.run_on(group, call, budget)
        try:
            outcome = torch_outcome(result, test.harness, expected)
            if outcome is None:
                mode.judge(call, result, world, placement.backend, item)  # raises the failure
                return
            item_outcome(item).result = result
            if outcome.note:
                warnings.warn(pytest.PytestWarning(
                    f"pytest-nccl: {item.nodeid} passes under torch's harness, but its ranks did not agree: "
                    f"{outcome.note}"), stacklevel=1)
            if outcome.skipped:
                raise unittest.SkipTest(outcome.reason)
        finally:
            shutil.rmtree(call.journal_dir, ignore_errors=True)

    def _budget(self, item, test_name: str) -> Budget:
        """The plugin's bound (a nccl marker's timeout, else --nccl-timeout), or torch's own longer
        timeout where its harness gives this test one (``TIMEOUT_OVERRIDE``)."""
        marker = parse_marker(item)
        timeout = (marker.timeout if marker is not None else None) or self.session.settings.timeout
        harness = sys.modules.get("torch.testing._internal.common_distributed")
        override = getattr(harness, "TIMEOUT_OVERRIDE", {}).get(test_name)
        if isinstance(override, (int, float)) and override > timeout:
            timeout = float(override)
        return item_budget(item, timeout)

    def _placement(self, world: int) -> Placement:
        """The label the report gives the group's backend: the session's choice for this world (the
        test creates its group with a backend of its own choosing)."""
        try:
            return self.session.placement(world)
        except NcclUsageError:
            return Placement(Backend.GLOO, "the test's own")

    def close(self) -> None:
        for state in self.continuous.values():
            _remove(state.rdvz_file)
        self.continuous.clear()
        if self.takeover is not None:
            self.takeover.uninstall()
            self.takeover = None


def _class_name(item) -> str:
    """The name pytest collected the item's class by (its name in the module)."""
    parent = item.parent
    return parent.name if parent is not None else type(item.instance).__name__


def _new_file() -> str:
    with tempfile.NamedTemporaryFile(delete=False, prefix="pytest-nccl-rdvz-") as f:
        return f.name


def _remove(path: str) -> None:
    if path:
        try:
            os.remove(path)
        except OSError:
            pass
