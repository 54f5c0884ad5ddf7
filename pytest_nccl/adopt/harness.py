"""torch's harness, taken over in this pytest process only (the fork server and the ranks import
their own, untouched copy): the methods through which ``MultiProcessTestCase`` and
``MultiProcContinuousTest`` start and join ranks hand an adopted test to the adopter instead.

Everything else of the class runs as under torch's harness, in the same order: pytest's unittest
support calls ``setUpClass``, ``setUp`` (``TestDistBackend``'s makes ``TEMP_DIR``, ``setUp`` of
``MultiProcessTestCase`` the ``file_name``), the test method, ``tearDown``. Only:

- ``MultiProcessTestCase._start_processes``: starts nothing; the adopter notes the environment the
  ranks would have inherited;
- ``MultiProcessTestCase._join_processes``: the adopter runs the test on ranks from the fork server;
- ``MultiProcContinuousTest._spawn_processes``: starts nothing; the adopter notes the world size
  and environment of the class's ranks;
- ``MultiProcContinuousTest._worker_run_main_wait``: the test method in this process asks the
  adopter instead of waiting on the workers' queues.

An instance that is not the adopted test being run (another class, or an adopted class used outside
its test) gets torch's own methods. ``uninstall`` puts them back.
"""

from __future__ import annotations

import functools
import sys
import types

from .classes import HARNESS_MODULE


class Takeover:
    """The replaced methods of torch's harness classes, and the originals to put back."""

    def __init__(self, adopter):
        self.adopter = adopter
        self.saved: list[tuple[type, str, object]] = []

    def install(self) -> None:
        if self.saved:
            return
        module = sys.modules[HARNESS_MODULE]
        self._take_process(module.MultiProcessTestCase)
        # torch's continuous harness is newer than the oldest torch supported (2.6 has none)
        continuous = getattr(module, "MultiProcContinuousTest", None)
        if continuous is not None and all(n in vars(continuous) for n in ("_spawn_processes", "_worker_run_main_wait")):
            self._take_continuous(continuous)

    def _take_process(self, process: type) -> None:
        adopter = self.adopter
        start, join = vars(process)["_start_processes"], vars(process)["_join_processes"]

        @functools.wraps(start)
        def _start_processes(self, proc):
            if not adopter.owns(self):
                return start(self, proc)
            adopter.process_ranks_started(self)
            self.processes = []
            return None

        @functools.wraps(join)
        def _join_processes(self, fn):
            if not adopter.owns(self) or not adopter.process_ranks_pending(self):
                return join(self, fn)  # not ours, or ranks that something else started
            return adopter.run_process_test(self, fn)

        self._replace(process, "_start_processes", _start_processes)
        self._replace(process, "_join_processes", _join_processes)

    def _take_continuous(self, continuous: type) -> None:
        adopter = self.adopter
        spawn = vars(continuous)["_spawn_processes"].__func__
        main_wait = vars(continuous)["_worker_run_main_wait"]

        @functools.wraps(spawn)
        def _spawn_processes(cls, world_size):
            if not adopter.owns_class(cls):
                return spawn(cls, world_size)
            adopter.continuous_ranks_started(cls, int(world_size))
            return None

        @functools.wraps(main_wait)
        def _worker_run_main_wait(self, fn):
            torch_wrapper = main_wait(self, fn)

            @functools.wraps(fn)
            def wrapper(self):
                if self.rank == self.MAIN_PROCESS_RANK and adopter.owns(self):
                    return adopter.run_continuous_test(self)
                return torch_wrapper()

            return types.MethodType(wrapper, self)

        self._replace(continuous, "_spawn_processes", classmethod(_spawn_processes))
        self._replace(continuous, "_worker_run_main_wait", _worker_run_main_wait)

    def _replace(self, cls: type, name: str, value) -> None:
        self.saved.append((cls, name, vars(cls)[name]))
        setattr(cls, name, value)

    def uninstall(self) -> None:
        for cls, name, original in reversed(self.saved):
            setattr(cls, name, original)
        self.saved.clear()
