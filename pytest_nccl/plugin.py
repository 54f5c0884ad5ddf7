"""The pytest plugin: options, ini keys and the marker declared together (as pytest-timeout does),
fixtures, the header line, and the hook that hands a marked test to a rank group.

Controller side only; what runs inside a rank lives in ``rank.py``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field

import pytest

from . import errors, protocol
from .diagnose import Diagnosis, diagnose, members_of
from .errors import (DistributedTestFailure, NcclUsageError, RankSetupError)
from .group import CallResult, GroupPool
from .report import format_report, trace_json, write_trace_dir

from .settings import (MARKER, Budget, Placement, Settings, add_options, budget_for, parse_marker,
                       parse_settings, place)

RANK_FIXTURES = ("rank", "world_size", "device", "backend")

SESSION_KEY = pytest.StashKey["NcclSession"]()
RESULT_KEY = pytest.StashKey["dict"]()
STARTED_KEY = pytest.StashKey[float]()   # when the item's protocol started (pytest-timeout's clock)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


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
    except Exception:
        return 0


@dataclass
class NcclSession:
    """Per pytest process: settings, the group pool, results for the gate report."""
    config: pytest.Config
    settings: Settings
    cuda_devices: int = -1
    pool: GroupPool | None = None
    test_modules: dict = field(default_factory=dict)    # module name -> path, of nccl-marked tests
    environment: dict | None = None                      # for the gate report and JUnit properties
    recorder: "ReportRecorder | None" = None
    spmd: "object | None" = None                         # spmd.SpmdSession under a launcher (SPMD mode)
    warned_spawn: bool = False

    # the settings the rest of the plugin reads most
    @property
    def world(self) -> int:
        return self.settings.world

    @property
    def timeout(self) -> float:
        return self.settings.timeout

    @property
    def trace(self) -> bool:
        return self.settings.trace

    @property
    def trace_dir(self) -> str | None:
        return self.settings.trace_dir

    @property
    def requested_backend(self) -> str:
        return self.settings.backend

    def devices(self) -> int:
        if self.cuda_devices < 0:
            self.cuda_devices = cuda_device_count()
        return self.cuda_devices

    def placement(self, world: int, requested: str | None = None) -> Placement:
        return place(requested or self.settings.backend, world, self.devices())

    def backend_for(self, world: int, requested: str | None = None) -> tuple[str, str]:
        p = self.placement(world, requested)
        return p.backend, p.why

    def get_pool(self) -> GroupPool:
        if self.pool is None:
            from .gpus import GpuLeaser
            preload = [(m, "") for m in self.settings.preload]
            preload += sorted(self.test_modules.items())
            leaser = GpuLeaser(self.devices()) if self.devices() > 0 else None
            self.pool = GroupPool(None, preload, self.trace, gpu_leaser=leaser,
                                  rank_start=self.settings.rank_start)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    try:
        settings = parse_settings(config)
    except NcclUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = NcclSession(config, settings)
    if settings.backend == "nccl":
        try:
            session.placement(settings.world)
        except NcclUsageError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.stash[SESSION_KEY] = session
    session.recorder = ReportRecorder()
    config.pluginmanager.register(session.recorder, "nccl-report-recorder")
    _install_sigterm_cleanup(session)
    from . import spmd  # SPMD mode: this process is one rank of a launched group (torchrun, srun)
    session.spmd = spmd.configure(config, session)


def _install_sigterm_cleanup(session: NcclSession) -> None:
    """On SIGTERM, tear the groups down before dying (they would die with the fork server anyway,
    through PR_SET_PDEATHSIG; this also reaches what a rank started)."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        return

    def on_sigterm(signum, frame):
        session.close()
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        pass


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()


def pytest_report_header(config: pytest.Config) -> str | None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return None
    if session.spmd is not None:
        return session.spmd.header()
    try:
        placement = session.placement(session.world)
    except NcclUsageError as exc:
        return f"nccl: {exc}"
    return (f"nccl: world {session.world}, {placement.describe()}, timeout {session.timeout:g} s, "
            f"trace {'on' if session.trace else 'off'}")


def pytest_collection_modifyitems(session, config, items) -> None:
    nccl = config.stash.get(SESSION_KEY, None)
    if nccl is None:
        return
    for item in items:
        if item.get_closest_marker("nccl") is not None and isinstance(item, pytest.Function):
            mod = item.module
            if mod is not None and getattr(mod, "__file__", None):
                nccl.test_modules[mod.__name__] = mod.__file__


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    """Start the fork server now, without waiting: it imports torch and the test modules while
    pytest reports collection and runs the first tests' set-up."""
    nccl = session.config.stash.get(SESSION_KEY, None)
    if nccl is None or nccl.spmd is not None or not nccl.test_modules or session.config.option.collectonly:
        return
    if getattr(session.config.option, "dist", "no") not in ("no", None) and not _is_worker(session.config):
        return  # the xdist controller runs no test; its workers start their own
    nccl.get_pool().ensure_zygote(wait=False)


# -- fixtures -------------------------------------------------------------------------------------

class _RankValue:
    """What a rank-side fixture holds in the controller: the real value exists only in a rank."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}: set inside each rank>"


def _rank_fixture(name: str):
    def fixture(request):
        if request.node.get_closest_marker("nccl") is None:
            raise NcclUsageError(f"the '{name}' fixture exists only inside a test marked "
                                 "@pytest.mark.nccl")
        spmd = request.config.stash[SESSION_KEY].spmd
        if spmd is not None:  # SPMD mode: this process is the rank
            return spmd.fixture_value(name)
        return _RankValue(name)
    fixture.__name__ = name
    fixture.__doc__ = f"pytest-nccl: this rank's {name} (only in tests marked nccl)."
    return pytest.fixture(name=name)(fixture)


rank = _rank_fixture("rank")
world_size = _rank_fixture("world_size")
device = _rank_fixture("device")
backend = _rank_fixture("backend")


class NcclWorld:
    """A started group of ``--nccl-world`` ranks, driven from the controller."""

    def __init__(self, session: NcclSession, nodeid: str, budget: Budget):
        self._session = session
        self._nodeid = nodeid
        self._budget = budget
        self.size = session.world
        self._placement = session.placement(self.size)
        self.backend = self._placement.backend

    def run(self, fn, *args, **kwargs) -> list:
        """Run module-level ``fn(*args, **kwargs)`` on every rank; the return values in rank order."""
        module, path, qualname = function_reference(fn)
        try:
            payload = pickle.dumps((args, kwargs))
        except Exception as exc:
            raise NcclUsageError(f"the arguments of nccl_world.run({qualname}) cannot be pickled: "
                                 f"{type(exc).__name__}: {exc}") from None
        call = protocol.Call(0, protocol.KIND_FUNCTION, module, path, qualname, payload,
                             nodeid=self._nodeid)
        result = execute(self._session, call, self.size, self._placement, self._budget, None)
        return [pickle.loads(result.outcomes[r].value) for r in range(self.size)]


@pytest.fixture
def nccl_world(request) -> NcclWorld:
    """A started torch.distributed group of --nccl-world ranks: ``.size``, ``.backend``, ``.run(fn)``."""
    session = request.config.stash[SESSION_KEY]
    if session.spmd is not None:  # SPMD mode: no group of our own to drive from a controller
        pytest.skip("nccl_world drives a group the plugin starts; under a launcher (SPMD mode) there is none: "
                    "run this test with plain pytest, or mark it @pytest.mark.nccl")
    return NcclWorld(session, request.node.nodeid, item_budget(request.node, session.timeout))


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
    if module == "__main__" or mod is None or not getattr(mod, "__file__", None):
        raise NcclUsageError(f"{qualname} lives in module {module!r}, which a rank cannot import: "
                             "define it in an importable module")
    return module, mod.__file__, qualname


def item_budget(item, timeout: float) -> Budget:
    """Our bound for ``item``, and pytest-timeout's deadline when it has one: ours fires first, so
    the report keeps the trace."""
    return budget_for(item, timeout, item.stash.get(STARTED_KEY, None))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # pytest-timeout starts its clock here too (unless func_only)
    item.stash[STARTED_KEY] = time.monotonic()


# -- running a call ---------------------------------------------------------------------------------

def _raise_failure(session: NcclSession, call: protocol.Call, result: CallResult, diag: Diagnosis,
                   backend: str, item_stash: dict | None):
    report = format_report(result.ranks, diag, result.elapsed, result.bound, backend)
    exc_class = getattr(errors, diag.exception_name, DistributedTestFailure)
    if item_stash is not None:
        item_stash["headline"] = diag.headline
        item_stash["kind"] = diag.kind
        item_stash["exception"] = exc_class.__name__
    if session.trace_dir:
        text = trace_json(call.nodeid, result.ranks, diag, result.elapsed, result.bound, backend)
        write_trace_dir(session.trace_dir, call.nodeid, text, result.fr_pickle)
    raise exc_class(diag.headline, diag, report)


def execute(session: NcclSession, call: protocol.Call, world: int, placement: Placement, budget: Budget,
            item_stash: dict | None) -> CallResult:
    """Run one call on a group of ``world`` ranks; raise the right DistributedTestFailure on any
    failure, ``pytest.skip`` / ``pytest.xfail`` when every rank did."""
    __tracebackhide__ = True
    pool = session.get_pool()
    if session.test_modules and call.path:
        pool.ensure_zygote().import_modules([(call.module, call.path)])
    backend = placement.backend
    group = pool.get(world, placement, budget.timeout, budget.setup_deadline())
    _warn_once_about_spawn(session, pool)
    call.journal_dir = pool.new_call_dir()
    call.trace = session.trace
    call.sys_path = list(sys.path)
    try:
        result = group.run(call, budget.bound())
    finally:
        if not group.healthy:
            pool.release()
    if item_stash is not None:
        item_stash["result"] = result
    statuses = {v.status for v in result.ranks}
    clean = result.reason == "completed" and statuses <= {"passed", "skipped", "xfailed"} \
        and len(statuses) == 1 and result.digests_agree
    if clean:
        _remove(call.journal_dir)
        if statuses == {"skipped"}:
            # reported at the test's own location, not at this line
            raise pytest.skip.Exception(result.ranks[0].message or "skipped on every rank",
                                        _use_item_location=True)
        if statuses == {"xfailed"}:
            pytest.xfail(result.ranks[0].message or "xfail on every rank")
        return result
    usage = _same_error_everywhere(result, world)
    if usage is not None:
        _remove(call.journal_dir)
        raise NcclUsageError(usage)
    diag = diagnose(result.ranks, result.reason, result.bound)
    if diag is None:
        diag = Diagnosis("rank-raised", "the ranks disagree on the outcome: "
                         + ", ".join(f"rank {v.rank} {v.status}" for v in result.ranks))
    try:
        _raise_failure(session, call, result, diag, backend, item_stash)
    finally:
        _remove(call.journal_dir)


def _warn_once_about_spawn(session: NcclSession, pool: GroupPool) -> None:
    culprit = pool.zygote.cuda_initialized_by if pool.zygote is not None else None
    if culprit is None or session.warned_spawn or session.settings.rank_start != "auto":
        return
    session.warned_spawn = True
    cost = f" (this group: {pool.spawned_group_starts[-1]:.1f} s)" if pool.spawned_group_starts else ""
    # attributed to the module that did it, so the warnings summary names it
    warnings.warn_explicit(pytest.PytestWarning(
        f"pytest-nccl: {culprit} initialized CUDA when the fork server imported it (a CUDA tensor or a "
        f"CUDA call at module level); a forked rank cannot use CUDA after that, so this session starts "
        f"ranks as fresh interpreters: each new group pays an interpreter start and the imports{cost} "
        f"instead of a fork. Move that CUDA work into a fixture or the test body to get forked ranks back."),
        None, culprit, 1)


def _same_error_everywhere(result: CallResult, world: int) -> str | None:
    """The one message when every rank could not run the call for the same reason (the function
    cannot be imported, the result cannot be pickled): a usage error, not a distributed failure."""
    messages = set()
    for rank in range(world):
        out = result.outcomes.get(rank)
        if out is None or out.status != protocol.ERROR:
            return None
        messages.add(out.message.replace(f" in rank {rank}", " in the ranks").replace(f"rank {rank} ", "each rank "))
    return messages.pop() if len(messages) == 1 else None


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _test_kwargs(item: pytest.Function) -> tuple[dict, list[str]]:
    """The arguments to send: fixture and parametrize values that pickle; rank-side names apart."""
    names = item._fixtureinfo.argnames
    kwargs, rank_args = {}, []
    for name in names:
        if name in RANK_FIXTURES:
            rank_args.append(name)
            continue
        value = item.funcargs[name]
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise NcclUsageError(f"fixture '{name}' cannot be used in a test marked nccl: its value "
                                 f"({type(value).__name__}) cannot be sent to the ranks "
                                 f"({type(exc).__name__}: {exc})") from None
        kwargs[name] = value
    return kwargs, rank_args


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    marker = pyfuncitem.get_closest_marker("nccl")
    if marker is None:
        return None
    __tracebackhide__ = True
    session: NcclSession = pyfuncitem.config.stash[SESSION_KEY]
    args = parse_marker(pyfuncitem)
    if session.spmd is not None:  # SPMD mode: run the body here, on this launched rank (spmd.py)
        return session.spmd.run_test(pyfuncitem)
    world = args.world or session.world
    placement = session.placement(world, args.backend)
    budget = item_budget(pyfuncitem, args.timeout or session.timeout)
    kwargs, rank_args = _test_kwargs(pyfuncitem)
    module = pyfuncitem.module
    cls = pyfuncitem.cls
    qualname = f"{cls.__name__}.{pyfuncitem.originalname}" if cls is not None else pyfuncitem.originalname
    call = protocol.Call(0, protocol.KIND_TEST, module.__name__, getattr(module, "__file__", "") or "",
                         qualname, pickle.dumps(((), kwargs)), nodeid=pyfuncitem.nodeid,
                         rank_args=rank_args)
    stash: dict = {}
    pyfuncitem.stash[RESULT_KEY] = stash
    try:
        execute(session, call, world, placement, budget, stash)
    except (RankSetupError, NcclUsageError) as exc:
        # the test could not run at all: git bisect must skip such a commit, not blame it
        infra = isinstance(exc, RankSetupError) or str(exc).startswith("cannot load")
        pyfuncitem.user_properties.append(("nccl_infra", "1" if infra else "0"))
        raise
    finally:
        if "headline" in stash:
            pyfuncitem.user_properties.append(("nccl_diagnosis", stash["headline"]))
            pyfuncitem.user_properties.append(("nccl_diagnosis_kind", stash["kind"]))
            pyfuncitem.user_properties.append(("nccl_exception", stash["exception"]))
    return True


# -- reports ------------------------------------------------------------------------------------

class NcclLongRepr:
    """A failure report whose first line is the diagnosis headline (shown by -r summaries and as
    the JUnit failure message) and whose body is the collective trace."""

    def __init__(self, headline: str, body: str, path: str, lineno: int):
        from _pytest._code.code import ReprFileLocation
        self.headline = headline
        self.body = body
        self.reprcrash = ReprFileLocation(path, lineno, headline)
        self.sections: list = []

    def toterminal(self, tw) -> None:
        tw.line(self.headline, red=True, bold=True)
        rest = self.body[len(self.headline):] if self.body.startswith(self.headline) else "\n" + self.body
        for line in rest.splitlines():
            tw.line(line)
        for name, content, sep in self.sections:
            tw.sep(sep, name)
            tw.line(content)

    def addsection(self, name, content, sep="-"):
        self.sections.append((name, content, sep))

    def __str__(self) -> str:
        return self.body if self.body.startswith(self.headline) else self.headline + "\n" + self.body


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if call.when != "call":
        if isinstance(exc, NcclUsageError) and rep.longrepr is not None:
            line = f"pytest-nccl: {exc}"
            rep.longrepr = NcclLongRepr(line, line, str(item.path), (item.location[1] or 0) + 1)
        return rep
    stash = item.stash.get(RESULT_KEY, None)
    if stash and "result" in stash:
        for view in stash["result"].ranks:
            if view.output.strip():
                rep.sections.append((f"Captured output rank {view.rank}", view.output))
    if isinstance(exc, (DistributedTestFailure, NcclUsageError)) and rep.longrepr is not None \
            and not getattr(rep, "wasxfail", None):
        path, lineno = str(item.path), (item.location[1] or 0) + 1
        if isinstance(exc, DistributedTestFailure) and not isinstance(exc, RankSetupError):
            rep.longrepr = NcclLongRepr(str(exc), exc.report or str(exc), path, lineno)
        else:
            line = f"pytest-nccl: {exc}"
            rep.longrepr = NcclLongRepr(line.split("\n")[0], line, path, lineno)
    return rep


# -- gate report, JUnit properties, exit codes for git bisect -------------------------------------

def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # an xdist worker: the controller writes the report


def pytest_sessionstart(session) -> None:
    config = session.config
    nccl = config.stash.get(SESSION_KEY, None)
    if nccl is None or _is_worker(config):
        return
    from _pytest.junitxml import xml_key
    xml = config.stash.get(xml_key, None)
    if xml is None and not nccl.settings.report:
        return
    from . import gate
    nccl.environment = gate.collect_environment()
    if xml is not None:
        backend, _ = nccl.backend_for(nccl.world)
        for name, value in gate.junit_properties(nccl.environment, backend, nccl.world):
            xml.add_global_property(name, value)


class ReportRecorder:
    """Keeps the reports that decide outcomes, for the gate report and the exit-code mapping.
    Registered as a plugin object of its own (hooks without a config argument need one)."""

    def __init__(self):
        self.reports: list = []

    def pytest_runtest_logreport(self, report) -> None:
        self.reports.append(report)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.reports.append(report)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    config = session.config
    nccl = config.stash.get(SESSION_KEY, None)
    if nccl is None or _is_worker(config):
        return
    reports = nccl.recorder.reports
    path = nccl.settings.report
    if path:
        from . import gate
        results = [r for r in (gate.result_from_report(rep) for rep in reports) if r is not None]
        backend, _ = nccl.backend_for(nccl.world)
        env = getattr(nccl, "environment", None) or gate.collect_environment()
        markdown = gate.render_report(env, results, backend, nccl.world)
        with open(path, "w", encoding="utf-8") as f:
            f.write(markdown)
        gate.append_step_summary(markdown)
    code = nccl.settings.exitcode_infra
    if code is not None:
        from .bisect import exitcodes
        failures = [exitcodes.failure_from_report(rep) for rep in reports if rep.failed]
        session.exitstatus = exitcodes.map_exitstatus(int(exitstatus), failures, code)
