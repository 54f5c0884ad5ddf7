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
from dataclasses import dataclass, field

import pytest

from . import errors, protocol
from .diagnose import Diagnosis, diagnose, members_of
from .errors import (DistributedTestFailure, NcclUsageError, RankSetupError)
from .group import CallResult, GroupPool
from .report import format_report, trace_json, write_trace_dir

WORLD_HELP = "world size of distributed tests that do not set one (default 2)"
BACKEND_HELP = "auto (NCCL when CUDA has at least WORLD devices, else gloo), nccl or gloo"
TIMEOUT_HELP = "bound in seconds for each distributed test (default 120)"
TRACE_HELP = "record every collective on every rank (on, the default) or not (off)"
TRACE_DIR_HELP = "write each failed distributed test's collective trace (JSON, Flight Recorder dumps) here"
REPORT_HELP = "write a validation-gate report (markdown) to this file"
INFRA_HELP = ("exit with 125 (git bisect's 'skip') when every failure is an "
              "infrastructure failure: ranks could not start, the library does not import, nothing collected")
PRELOAD_HELP = "modules the fork server imports once, so that every rank has them"
SPMD_HELP = ("auto (the default: SPMD when a launcher such as torchrun set RANK, WORLD_SIZE, MASTER_ADDR and "
             "MASTER_PORT), on or off. In SPMD mode each launched pytest process is one rank")
RANK_FIXTURES = ("rank", "world_size", "device", "backend")
BACKENDS = ("auto", "nccl", "gloo")
# pytest-timeout must not fire before our bound: keep this much of its budget for our report
PYTEST_TIMEOUT_RESERVE = 3.0
MARKER = ("nccl(world=None, timeout=None, backend=None): run the test body on every rank of a "
          "torch.distributed group of `world` processes (NCCL on GPUs, else gloo), bounded in time")

SESSION_KEY = pytest.StashKey["NcclSession"]()
RESULT_KEY = pytest.StashKey["dict"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nccl", "distributed tests on torch.distributed groups (pytest-nccl)")
    group.addoption("--nccl-world", dest="nccl_world", metavar="N", help=WORLD_HELP)
    group.addoption("--nccl-backend", dest="nccl_backend", metavar="NAME", help=BACKEND_HELP)
    group.addoption("--nccl-timeout", dest="nccl_timeout", metavar="SECONDS", help=TIMEOUT_HELP)
    group.addoption("--nccl-trace", dest="nccl_trace", metavar="on|off", help=TRACE_HELP)
    group.addoption("--nccl-trace-dir", dest="nccl_trace_dir", metavar="DIR", help=TRACE_DIR_HELP)
    group.addoption("--nccl-report", dest="nccl_report", metavar="FILE", help=REPORT_HELP)
    group.addoption("--nccl-exitcode-infra", dest="nccl_exitcode_infra", action="store_const", const=125,
                    default=None, help=INFRA_HELP)
    group.addoption("--nccl-spmd", dest="nccl_spmd", metavar="auto|on|off", help=SPMD_HELP)  # spmd.py
    parser.addini("nccl_world", WORLD_HELP, default="2")
    parser.addini("nccl_backend", BACKEND_HELP, default="auto")
    parser.addini("nccl_timeout", TIMEOUT_HELP, default="120")
    parser.addini("nccl_trace", TRACE_HELP, default="on")
    parser.addini("nccl_preload", PRELOAD_HELP, type="linelist", default=[])
    parser.addini("nccl_spmd", SPMD_HELP, default="auto")


# -- parsing user input: one clear line for anything wrong ---------------------------------------

def parse_world(value, where: str) -> int:
    try:
        world = int(str(value).strip())
    except (TypeError, ValueError):
        raise NcclUsageError(f"{where} must be a whole number of ranks >= 1, got {value!r}") from None
    if world < 1:
        raise NcclUsageError(f"{where} must be a whole number of ranks >= 1, got {value!r}")
    return world


def parse_timeout(value, where: str) -> float:
    try:
        timeout = float(str(value).strip())
    except (TypeError, ValueError):
        raise NcclUsageError(f"{where} must be a number of seconds > 0, got {value!r}") from None
    if not timeout > 0:
        raise NcclUsageError(f"{where} must be a number of seconds > 0, got {value!r}")
    return timeout


def parse_backend(value, where: str) -> str:
    backend = str(value).strip().lower()
    if backend not in BACKENDS:
        raise NcclUsageError(f"{where} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return backend


def resolve_backend(requested: str, world: int, cuda_devices: int) -> tuple[str, str]:
    """(backend, why) for a group of ``world`` ranks."""
    if requested == "gloo":
        return "gloo", "requested"
    if requested == "nccl":
        if cuda_devices < world:
            raise NcclUsageError(f"--nccl-backend=nccl needs {world} CUDA devices for world {world}; "
                                 f"this machine has {cuda_devices}")
        return "nccl", "requested"
    if cuda_devices == 0:
        return "gloo", "auto: no CUDA device"
    if cuda_devices < world:
        return "gloo", f"auto: {cuda_devices} CUDA device{'s' if cuda_devices != 1 else ''} < world {world}"
    return "nccl", f"auto: {cuda_devices} CUDA devices >= world {world}"


def _option(config, name: str):
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        raise NcclUsageError("torch is not installed: install it first (see the README: "
                             "`pip install torch==2.13.0` on CPU-only machines)") from None
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


@dataclass
class NcclSession:
    """Per pytest process: settings, the group pool, results for the gate report."""
    config: pytest.Config
    world: int
    requested_backend: str
    timeout: float
    trace: bool
    trace_dir: str | None
    cuda_devices: int = -1
    pool: GroupPool | None = None
    test_modules: dict = field(default_factory=dict)    # module name -> path, of nccl-marked tests
    environment: dict | None = None                      # for the gate report and JUnit properties
    recorder: "ReportRecorder | None" = None
    spmd: "object | None" = None                         # spmd.SpmdSession under a launcher (SPMD mode)

    def devices(self) -> int:
        if self.cuda_devices < 0:
            self.cuda_devices = _cuda_device_count()
        return self.cuda_devices

    def backend_for(self, world: int, requested: str | None = None) -> tuple[str, str]:
        requested = requested or self.requested_backend
        if requested == "gloo":
            return "gloo", "requested"
        return resolve_backend(requested, world, self.devices())

    def get_pool(self) -> GroupPool:
        if self.pool is None:
            from .gpus import GpuLeaser
            preload = [(m, "") for m in self.config.getini("nccl_preload")]
            preload += sorted(self.test_modules.items())
            leaser = GpuLeaser(self.devices()) if self.devices() > 0 else None
            self.pool = GroupPool(None, preload, self.trace, gpu_leaser=leaser)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    try:
        world = parse_world(_option(config, "nccl_world"), "--nccl-world")
        backend = parse_backend(_option(config, "nccl_backend"), "--nccl-backend")
        timeout = parse_timeout(_option(config, "nccl_timeout"), "--nccl-timeout")
        trace_value = str(_option(config, "nccl_trace")).strip().lower()
        if trace_value not in ("on", "off", "1", "0", "true", "false"):
            raise NcclUsageError(f"--nccl-trace must be on or off, got {trace_value!r}")
    except NcclUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = NcclSession(config, world, backend, timeout, trace_value in ("on", "1", "true"),
                          config.getoption("nccl_trace_dir"))
    if backend == "nccl":
        try:
            session.backend_for(world)
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
        backend, why = session.backend_for(session.world)
    except NcclUsageError as exc:
        return f"nccl: {exc}"
    return (f"nccl: world {session.world}, backend {backend} ({why}), timeout {session.timeout:g} s, "
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

    def __init__(self, session: NcclSession, nodeid: str, timeout: float):
        self._session = session
        self._nodeid = nodeid
        self._timeout = timeout
        self.size = session.world
        self.backend = session.backend_for(self.size)[0]

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
        result = execute(self._session, call, self.size, self.backend, self._timeout, None)
        return [pickle.loads(result.outcomes[r].value) for r in range(self.size)]


@pytest.fixture
def nccl_world(request) -> NcclWorld:
    """A started torch.distributed group of --nccl-world ranks: ``.size``, ``.backend``, ``.run(fn)``."""
    session = request.config.stash[SESSION_KEY]
    if session.spmd is not None:  # SPMD mode: no group of our own to drive from a controller
        pytest.skip("nccl_world drives a group the plugin starts; under a launcher (SPMD mode) there is none: "
                    "run this test with plain pytest, or mark it @pytest.mark.nccl")
    return NcclWorld(session, request.node.nodeid, effective_timeout(request.node, session.timeout))


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


def effective_timeout(item, timeout: float) -> float:
    """Our bound, shortened to fire before pytest-timeout's (so the report keeps our content)."""
    other = None
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        other = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if other is None:
        try:
            other = item.config.getoption("timeout")
        except (ValueError, AttributeError):
            other = None
        if other is None:
            try:
                other = item.config.getini("timeout")
            except (ValueError, KeyError):
                other = None
    try:
        other = float(other) if other not in (None, "") else 0.0
    except (TypeError, ValueError):
        other = 0.0
    if other > 0:
        return max(0.5, min(timeout, other - PYTEST_TIMEOUT_RESERVE))
    return timeout


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


def execute(session: NcclSession, call: protocol.Call, world: int, backend: str, timeout: float,
            item_stash: dict | None) -> CallResult:
    """Run one call on a group of ``world`` ranks; raise the right DistributedTestFailure on any
    failure, ``pytest.skip`` / ``pytest.xfail`` when every rank did."""
    __tracebackhide__ = True
    pool = session.get_pool()
    if session.test_modules and call.path:
        pool.ensure_zygote().import_modules([(call.module, call.path)])
    setup_deadline = time.monotonic() + max(timeout, 30.0)
    group = pool.get(world, backend, timeout, setup_deadline)
    call.journal_dir = pool.new_call_dir()
    call.trace = session.trace
    call.sys_path = list(sys.path)
    try:
        result = group.run(call, timeout)
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
    kw = dict(marker.kwargs)
    if marker.args:
        kw.setdefault("world", marker.args[0])
    unknown = set(kw) - {"world", "timeout", "backend"}
    if unknown:
        raise NcclUsageError(f"@pytest.mark.nccl got unknown argument(s) {', '.join(sorted(unknown))}; "
                             "it takes world, timeout, backend")
    world = parse_world(kw["world"], "@pytest.mark.nccl(world=...)") if kw.get("world") is not None else session.world
    timeout = parse_timeout(kw["timeout"], "@pytest.mark.nccl(timeout=...)") if kw.get("timeout") is not None else session.timeout
    requested = parse_backend(kw["backend"], "@pytest.mark.nccl(backend=...)") if kw.get("backend") is not None else None
    if session.spmd is not None:  # SPMD mode: run the body here, on this launched rank (spmd.py)
        return session.spmd.run_test(pyfuncitem)
    backend, _ = session.backend_for(world, requested)
    timeout = effective_timeout(pyfuncitem, timeout)
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
        execute(session, call, world, backend, timeout, stash)
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
    if xml is None and not config.getoption("nccl_report"):
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
    path = config.getoption("nccl_report")
    if path:
        from . import gate
        results = [r for r in (gate.result_from_report(rep) for rep in reports) if r is not None]
        backend, _ = nccl.backend_for(nccl.world)
        env = getattr(nccl, "environment", None) or gate.collect_environment()
        markdown = gate.render_report(env, results, backend, nccl.world)
        with open(path, "w", encoding="utf-8") as f:
            f.write(markdown)
        gate.append_step_summary(markdown)
    code = config.getoption("nccl_exitcode_infra")
    if code is not None:
        from .bisect import exitcodes
        failures = [exitcodes.failure_from_report(rep) for rep in reports if rep.failed]
        session.exitstatus = exitcodes.map_exitstatus(int(exitstatus), failures, code)
