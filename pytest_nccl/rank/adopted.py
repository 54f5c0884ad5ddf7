"""Rank side: one test of torch's ``MultiProcessTestCase`` family, run by its class's own per-rank
entry, in a rank forked from the fork server instead of an interpreter torch's harness spawned.

What a spawned rank of torch's harness would do, and nothing else:

- ``MultiProcessTestCase`` (fresh ranks per test): the environment the controller had when its
  ``setUp`` started the ranks, then ``cls._run(rank, test_name, file_name, pipe, **kwargs)`` (the
  class's own ``_run``: ``TestDistBackend``'s creates the process group, barriers, runs the test,
  exits 0); ``run_test`` turns an exception into exit code 10 and a ``SkipTest`` into 86;
- ``MultiProcContinuousTest`` (one group per class): the first test on a rank does the worker's
  bootstrap (``cls.rank``, ``cls.world_size``, ``cls._init_pg``), every test then
  ``cls._run_test_given_id(test_id)``.

How the rank ended becomes what the rank loop reports: passed; skipped with torch's reason
(``TEST_SKIPS``, read from the installed torch); the test's own exception (the one ``run_test``
caught, so the report shows the test's frames, not ``sys.exit(10)``); any other exit code ends the
rank as ``os._exit`` would (as the spawned process would have ended). Imports nothing of the
controller side.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import unittest

from ..core.messages import AdoptedTest, Harness

#: MultiProcessTestCase.TEST_ERROR_EXIT_CODE: run_test caught an exception
TEST_ERROR_EXIT_CODE = 10
#: TEST_SKIPS["generic"]: run_test caught a unittest.SkipTest (torch's message hides its reason)
GENERIC_SKIP_EXIT_CODE = 86


class Skipped(Exception):
    """The rank skipped (the rank loop classifies an exception of this name as a skip)."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg


def skip_reason(code, context: BaseException | None = None) -> str | None:
    """torch's reason for a skip exit code, or None when ``code`` is not one of ``TEST_SKIPS``.
    For the generic code, the ``SkipTest``'s own reason when it is known (torch's harness only
    says to look at the rank's log)."""
    from torch.testing._internal.common_distributed import TEST_SKIPS
    skip = next((s for s in TEST_SKIPS.values() if s.exit_code == code), None)
    if skip is None:
        return None
    if code == GENERIC_SKIP_EXIT_CODE and context is not None and type(context).__name__ == "SkipTest":
        return str(context) or skip.message
    return skip.message


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _ended(exc: SystemExit) -> None:
    """A rank's entry called ``sys.exit``: passed (0), skipped, the test's exception (10), or the
    process ends with that code, as torch's spawned rank would have."""
    code = _exit_code(exc)
    if code == 0:
        return
    reason = skip_reason(code, exc.__context__)
    if reason is not None:
        raise Skipped(reason) from None
    if code == TEST_ERROR_EXIT_CODE and isinstance(exc.__context__, Exception):
        raise exc.__context__
    from .stacks import exit_like_os_exit
    exit_like_os_exit(exc)


def _environment(adopted: AdoptedTest) -> None:
    if adopted.environ:
        os.environ.clear()
        os.environ.update(adopted.environ)


def _run_process_test(cls, adopted: AdoptedTest, rank: int) -> None:
    _environment(adopted)
    mine, theirs = multiprocessing.Pipe()  # run_test's pipe: it sends the traceback torch's parent reads
    try:
        cls._run(rank, adopted.test_name, adopted.file_name, theirs, **adopted.kwargs)
    except SystemExit as exc:
        _ended(exc)
    finally:
        mine.close()
        theirs.close()


# MultiProcContinuousTest classes this rank bootstrapped: class -> init skip reason (None: none)
_bootstrapped: dict = {}


def _run_continuous_test(cls, adopted: AdoptedTest, rank: int) -> None:
    if cls not in _bootstrapped:
        _environment(adopted)
        cls.rank, cls.world_size = rank, adopted.world
        reason = None
        try:
            cls._init_pg(rank, adopted.world, adopted.rdvz_file)
        except SystemExit as exc:  # the worker loop's bootstrap: a skip code skips every test
            reason = skip_reason(_exit_code(exc), exc.__context__)
            if reason is None:
                raise
        _bootstrapped[cls] = reason
    reason = _bootstrapped[cls]
    if reason is not None:
        raise Skipped(reason)
    try:
        cls._run_test_given_id(adopted.test_id)
    except unittest.SkipTest as exc:  # self.skipTest() on a worker: torch's worker reports it as an error
        raise Skipped(str(exc)) from None
    except SystemExit as exc:
        code = _exit_code(exc)
        reason = skip_reason(code, exc.__context__)
        if reason is not None:
            raise Skipped(reason) from None
        raise


def entry(module, adopted: AdoptedTest, rank: int):
    """The function the rank loop runs for one adopted test: the class's own entry for this rank."""
    cls = getattr(module, adopted.class_name)
    run = _run_continuous_test if adopted.harness == Harness.CONTINUOUS else _run_process_test

    def adopted_test() -> None:
        run(cls, adopted, rank)
        sys.stdout.flush()

    return adopted_test
