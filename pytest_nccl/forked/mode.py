"""The forked mode: every marked test runs on every rank of a group forked from the fork server;
``nccl_world.run(fn)`` drives such a group from the controller. Controller side.
"""

from __future__ import annotations

import gc
import pickle
import shutil
import sys
import warnings

import pytest

from ..budget import Budget
from ..core.messages import Call, CallKind, RankStart
from ..core.reports import CallResult
from ..core.states import RankState
from ..errors import NcclUsageError, RankSetupError
from ..placement import Placement
from ..session import NcclSession, exception_class, item_budget, item_outcome, record_failure, write_trace
from ..settings import RANK_FIXTURES, MarkerArgs, argnames_of, parse_marker
from ..torch_gaps import gap_line
from ..views.report import format_report
from .gpus import GpuLeaser
from .group import RankGroup
from .pool import GroupPool


class RankValue:
    """What a rank-side fixture holds in the controller: the real value exists only in a rank."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}: set inside each rank>"


class ForkedMode:
    """The session's fork server and group pool; runs items and ``nccl_world`` calls on them."""

    def __init__(self, session: NcclSession):
        self.session = session
        self.pool: GroupPool | None = None
        self.warned_spawn = False

    # -- Mode ------------------------------------------------------------------------------------------
    def header(self) -> str:
        s = self.session.settings
        try:
            placement = self.session.placement(s.world)
        except NcclUsageError as exc:
            return f"nccl: {exc}"
        return (f"nccl: world {s.world}, {placement.describe()}, timeout {s.timeout:g} s, "
                f"trace {'on' if s.trace else 'off'}") + gap_line(placement.backend)

    def session_started(self, session: pytest.Session) -> None:
        """Start the fork server now, without waiting: it imports torch (and ``nccl_preload``) while
        pytest imports torch itself and collects."""
        self.get_pool().ensure_zygote(wait=False)

    def collection_finished(self, session: pytest.Session) -> None:
        """Hand the fork server the test modules that hold distributed tests; without any, stop it."""
        if not self.session.test_modules:
            self.close()
            return
        self.get_pool().add_modules(sorted(self.session.test_modules.items()))
        # torch's ~175,000 objects, loaded by now, would be walked by every full collection that
        # follows (pytest runs two at the end, the interpreter one at exit: about 0.5 s of a short
        # session, measured): they live as long as the session anyway
        gc.freeze()

    def fixture_value(self, name: str, request) -> object:
        return RankValue(name)

    def controller_world(self, request) -> "NcclWorld":
        return NcclWorld(self, request.node.nodeid, item_budget(request.node, self.session.settings.timeout))

    def run_item(self, item: pytest.Function) -> bool:
        __tracebackhide__ = True
        args = parse_marker(item) or MarkerArgs()  # run_item is only asked for marked items
        settings = self.session.settings
        world = args.world or settings.world
        placement = self.session.placement(world, args.backend)
        budget = item_budget(item, args.timeout or settings.timeout)
        kwargs, rank_args = _test_kwargs(item)
        module = item.module
        cls = item.cls
        qualname = f"{cls.__name__}.{item.originalname}" if cls is not None else item.originalname
        call = Call(0, CallKind.TEST, module.__name__, getattr(module, "__file__", "") or "",
                    qualname, pickle.dumps(((), kwargs)), nodeid=item.nodeid, rank_args=rank_args)
        try:
            self.execute(call, world, placement, budget, item)
        except (RankSetupError, NcclUsageError) as exc:
            # the test could not run at all: git bisect must skip such a commit, not blame it
            infra = isinstance(exc, RankSetupError) or exc.infrastructure
            item.user_properties.append(("nccl_infra", "1" if infra else "0"))
            raise
        return True

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    # -- running a call ---------------------------------------------------------------------------------
    def get_pool(self) -> GroupPool:
        if self.pool is None:
            s = self.session
            preload = [(m, "") for m in s.settings.preload]
            # GPUs are counted (torch imported) only when a group needs them: the fork server
            # starts first, so that its own import of torch runs beside the controller's
            self.pool = GroupPool(None, preload, s.settings.trace, gpu_leaser=lambda: GpuLeaser(s.devices()),
                                  rank_start=s.settings.rank_start)
        return self.pool

    def execute(self, call: Call, world: int, placement: Placement, budget: Budget,
                item=None) -> CallResult:
        """Run one call on a group of ``world`` ranks; raise the right DistributedTestFailure on any
        failure, ``pytest.skip`` / ``pytest.xfail`` when every rank did."""
        __tracebackhide__ = True
        result = self.run_on(self.group(call, world, placement, budget), call, budget)
        try:
            return self.judge(call, result, world, placement.backend, item)
        finally:
            shutil.rmtree(call.journal_dir, ignore_errors=True)

    def group(self, call: Call, world: int, placement: Placement, budget: Budget,
              own_group: str | None = None) -> RankGroup:
        """A started group for ``call`` (``own_group``: see ``GroupPool.get``)."""
        pool = self.get_pool()
        if self.session.test_modules and call.path:
            pool.ensure_zygote().import_modules([(call.module, call.path)])
        group = pool.get(world, placement, budget.timeout, budget.setup_deadline(), own_group)
        self._warn_once_about_spawn(pool)
        return group

    def run_on(self, group: RankGroup, call: Call, budget: Budget) -> CallResult:
        """Run ``call`` on ``group``; a group left in doubt is released. The caller judges the result
        and removes ``call.journal_dir``."""
        pool = self.get_pool()
        call.journal_dir = pool.new_call_dir()
        call.trace = self.session.settings.trace
        call.sys_path = list(sys.path)
        result = None
        try:
            result = group.run(call, budget.bound())
        finally:
            # ranks that issued different collectives (a rank skipped new_group, a mismatch gloo
            # completed) hold c10d state that differs across them: the next call gets a fresh group
            if not group.healthy or (result is not None and not result.clean):
                pool.release()
        return result

    def judge(self, call, result: CallResult, world: int, backend: str, item) -> CallResult:
        __tracebackhide__ = True
        if item is not None:
            item_outcome(item).result = result
        diag = result.diagnosis
        if diag is None:
            states = {v.status for v in result.ranks}
            if states == {RankState.SKIPPED}:
                # reported at the test's own location, not at this line
                raise pytest.skip.Exception(result.ranks[0].message or "skipped on every rank",
                                            _use_item_location=True)
            if states == {RankState.XFAILED}:
                pytest.xfail(result.ranks[0].message or "xfail on every rank")
            return result
        usage = _same_error_everywhere(result, world)
        if usage is not None:
            raise usage
        report = format_report(result.ranks, diag, result.elapsed, result.bound, backend)
        exc_class = exception_class(diag.exception_name)
        if item is not None:
            record_failure(item, self.session, diag, exc_class.__name__, result=result)
        elif self.session.settings.trace_dir:
            write_trace(self.session.settings.trace_dir, call.nodeid, result)
        raise exc_class(diag.headline, diag, report)

    def _warn_once_about_spawn(self, pool: GroupPool) -> None:
        culprit = pool.zygote.cuda_initialized_by if pool.zygote is not None else None
        if culprit is None or self.warned_spawn or self.session.settings.rank_start != RankStart.AUTO:
            return
        self.warned_spawn = True
        cost = f" (this group: {pool.spawned_group_starts[-1]:.1f} s)" if pool.spawned_group_starts else ""
        # attributed to the module that did it, so the warnings summary names it
        warnings.warn_explicit(pytest.PytestWarning(
            f"pytest-nccl: {culprit} initialized CUDA when the fork server imported it (a CUDA tensor or a "
            f"CUDA call at module level); a forked rank cannot use CUDA after that, so this session starts "
            f"ranks as fresh interpreters: each new group pays an interpreter start and the imports{cost} "
            f"instead of a fork. Move that CUDA work into a fixture or the test body to get forked ranks back."),
            None, culprit, 1)


class NcclWorld:
    """A started group of ``--nccl-world`` ranks, driven from the controller."""

    def __init__(self, mode: ForkedMode, nodeid: str, budget: Budget):
        self._mode = mode
        self._nodeid = nodeid
        self._budget = budget
        self.size = mode.session.settings.world
        self._placement = mode.session.placement(self.size)
        self.backend = self._placement.backend

    def run(self, fn, *args, **kwargs) -> list:
        """Run module-level ``fn(*args, **kwargs)`` on every rank; the return values in rank order."""
        module, path, qualname = function_reference(fn)
        try:
            payload = pickle.dumps((args, kwargs))
        except Exception as exc:  # a user's object's __reduce__ may raise anything: one line
            raise NcclUsageError(f"the arguments of nccl_world.run({qualname}) cannot be pickled: "
                                 f"{type(exc).__name__}: {exc}") from None
        call = Call(0, CallKind.FUNCTION, module, path, qualname, payload, nodeid=self._nodeid)
        result = self._mode.execute(call, self.size, self._placement, self._budget)
        return [pickle.loads(result.reports[r].value) for r in range(self.size)]


def function_reference(fn) -> tuple[str, str, str]:
    """(module, file, qualname) a rank can import; a clear error for what it cannot."""
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", None)
    if qualname is None or module is None:
        raise NcclUsageError(f"{fn!r} is not a function a rank can import: pass a module-level function")
    if "<lambda>" in qualname:
        raise NcclUsageError(f"a lambda cannot be imported by a rank: pass a module-level function "
                             f"(got {qualname})")
    if "<locals>" in qualname:
        raise NcclUsageError(f"{qualname} is a nested function or closure, which a rank cannot import: "
                             "define it at module level")
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) if mod is not None else None
    if module == "__main__" or not path:
        raise NcclUsageError(f"{qualname} lives in module {module!r}, which a rank cannot import: "
                             "define it in an importable module")
    return module, path, qualname


def _same_error_everywhere(result: CallResult, world: int) -> NcclUsageError | None:
    """One error when every rank could not run the call for the same reason (the function cannot be
    loaded, the result cannot be pickled): a usage error, not a distributed failure."""
    messages, unloadable = set(), set()
    for rank in range(world):
        out = result.reports.get(rank)
        if out is None or out.state != RankState.ERROR:
            return None
        messages.add(out.message.replace(f" in rank {rank}", " in the ranks").replace(f"rank {rank} ", "each rank "))
        unloadable.add(out.unloadable)
    if len(messages) != 1:
        return None
    return NcclUsageError(messages.pop(), infrastructure=unloadable == {True})


def _test_kwargs(item: pytest.Function) -> tuple[dict, list[str]]:
    """The arguments to send: fixture and parametrize values that pickle; rank-side names apart."""
    kwargs, rank_args = {}, []
    for name in argnames_of(item):
        if name in RANK_FIXTURES:
            rank_args.append(name)
            continue
        value = item.funcargs[name]
        try:
            pickle.dumps(value)
        except Exception as exc:  # a user's object's __reduce__ may raise anything: one line
            raise NcclUsageError(f"fixture '{name}' cannot be used in a test marked nccl: its value "
                                 f"({type(value).__name__}) cannot be sent to the ranks "
                                 f"({type(exc).__name__}: {exc})") from None
        kwargs[name] = value
    return kwargs, rank_args
