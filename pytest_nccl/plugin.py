"""The pytest plugin: hooks only (as xdist's ``plugin.py``). Each hook asks the session
(``session.py``) and its mode: forked groups (``forked/``), under a launcher SPMD (``spmd/``), or on a
platform where ranks cannot run, a mode that skips (``unsupported.py``). Settings are declared and
parsed in ``settings.py``; nothing imports this module back.

Importing this module must never break a pytest session on any platform (the plugin loads through
its entry point wherever the package is installed): what only exists on Linux is imported when a
Linux session configures its mode.
"""

from __future__ import annotations

import time

import pytest

from . import github
from .adopt.adopter import ADOPTED_KEY, ADOPTER_KEY, Adopter
from .core.states import Phase
from .errors import DistributedTestFailure, NcclUsageError, RankSetupError
from .interrupts import ENDINGS_KEY, Endings
from .launched import LAUNCHED_KEY, Launched, off_reason
from .session import OUTCOME_KEY, SESSION_KEY, STARTED_KEY, NcclSession, junit_writer
from .settings import (
    MARKER,
    TIMEOUT_MARKER,
    add_options,
    argnames_of,
    exitcode_infra_of,
    parse_settings,
    rank_fixture_conflict,
    unsupported_platform,
)
from .views import gate
from .views.github import GithubMode
from .views.report import NcclLongRepr, trace_files

# A bad setting, kept from configure to the session's start: --help, --version, --markers and
# --collect-only must still work with a bad value in the config file.
SETTINGS_ERROR_KEY = pytest.StashKey[str]()
# The rank fixtures the plugin itself supplied to an item (a user's own fixture of the name did not).
RANK_FIXTURES_KEY = pytest.StashKey[set]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", TIMEOUT_MARKER)
    try:
        settings = parse_settings(config)
    except NcclUsageError as exc:
        config.stash[SETTINGS_ERROR_KEY] = f"pytest-nccl: {exc}"
        return
    session = NcclSession(config, settings)
    config.stash[SESSION_KEY] = session
    session.recorder = gate.ReportRecorder()
    config.pluginmanager.register(session.recorder, "nccl-report-recorder")
    github.install(config, session)  # GitHub Actions: annotations, the job summary's table (--nccl-github)
    reason = unsupported_platform()
    if reason is not None:
        from .unsupported import UnsupportedPlatform
        session.mode = UnsupportedPlatform(reason)
        return
    # SIGTERM and SIGHUP interrupt as Ctrl-C does: a running test says where its ranks were
    endings = config.stash[ENDINGS_KEY] = Endings(session.close)
    endings.install()
    # Linux only from here: the fork server's client, pidfds, flock
    from . import spmd  # SPMD mode: this process is one rank of a launched group (torchrun, srun)
    from .forked.mode import ForkedMode
    session.mode = spmd.configure(config, session) or ForkedMode(session)
    # ranks a test starts itself (torchrun, mp.spawn, debug_launcher): traced and judged (launched.py)
    config.stash[LAUNCHED_KEY] = Launched(session, off_reason(session, not isinstance(session.mode, ForkedMode)))
    # tests written for torch's MultiProcessTestCase family: their ranks from the fork server (adopt/)
    forked = session.mode if isinstance(session.mode, ForkedMode) else None
    adopter = config.stash[ADOPTER_KEY] = Adopter(session, forked)
    if not settings.adopt:
        adopter.off = "--nccl-adopt=off"
    elif forked is None:
        adopter.off = "SPMD mode: this process is one rank"


def _usage_error(config: pytest.Config, message: str):
    """A usage error that surfaces once the session runs: with --nccl-exitcode-infra it exits 125
    (git bisect's skip: a node id not found or a setting the plugin of this commit does not take
    depends on the commit), else pytest's usage error (exit 4)."""
    code = exitcode_infra_of(config)
    if code is not None:
        pytest.exit(f"{message} (exit {code}: --nccl-exitcode-infra)", returncode=code)
    raise pytest.UsageError(message)


@pytest.hookimpl(trylast=True)  # the very end: a signal that interrupted the session ends it now
def pytest_unconfigure(config: pytest.Config) -> None:
    launched = config.stash.get(LAUNCHED_KEY, None)
    if launched is not None:
        launched.close()
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()
    adopter = config.stash.get(ADOPTER_KEY, None)
    if adopter is not None:
        adopter.close()
    endings = config.stash.get(ENDINGS_KEY, None)
    if endings is not None:
        endings.session_ended()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    error = config.stash.get(SETTINGS_ERROR_KEY, None)
    if error is not None:  # --collect-only goes on; a session that runs tests stops at its start
        return [f"nccl: {error}"]
    session = config.stash.get(SESSION_KEY, None)
    if session is None or session.mode is None:
        return None
    launched = config.stash.get(LAUNCHED_KEY, None)
    return [session.mode.header()] + ([launched.header()] if launched is not None else [])


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """A node id or file that does not exist (at this commit), or a bad -k/-m, is a usage error that
    pytest raises during collection: --nccl-exitcode-infra makes it 125."""
    try:
        return (yield)
    except pytest.UsageError as exc:
        if exitcode_infra_of(session.config) is not None:
            _usage_error(session.config, "; ".join(str(a) for a in exc.args))
        raise


def pytest_pycollect_makeitem(collector, name, obj) -> None:
    if isinstance(obj, type):
        adopter = collector.config.stash.get(ADOPTER_KEY, None)
        if adopter is not None:
            adopter.class_collected(obj)


@pytest.hookimpl(trylast=True)  # the final selection, after -k and -m deselected items
def pytest_collection_modifyitems(session, config, items) -> None:
    nccl = config.stash.get(SESSION_KEY, None)
    if nccl is None:
        return
    adopter = config.stash.get(ADOPTER_KEY, None)
    if adopter is not None:  # which tests of torch's harness classes are adopted
        adopter.collected(items)
    reason = unsupported_platform()
    for item in items:
        if reason is not None and item.get_closest_marker("nccl") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))  # before its fixtures are set up
            continue
        if item.get_closest_marker("nccl") is not None and isinstance(item, pytest.Function):
            mod = item.module
            if mod is not None and getattr(mod, "__file__", None):
                nccl.test_modules[mod.__name__] = mod.__file__


def _runs_tests(config) -> bool:
    """False for --collect-only and for xdist's controller (its workers run the tests)."""
    if config.option.collectonly:
        return False
    return getattr(config.option, "dist", "no") in ("no", None) or _is_worker(config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session) -> None:
    error = session.config.stash.get(SETTINGS_ERROR_KEY, None)
    if error is not None and not session.config.option.collectonly:
        _usage_error(session.config, error)
    nccl = session.config.stash.get(SESSION_KEY, None)
    if nccl is not None and _runs_tests(session.config):
        nccl.mode.session_started(session)
    _junit_and_gate_start(session)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    adopter = config.stash.get(ADOPTER_KEY, None)
    return adopter.report_lines() if adopter is not None else None


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    nccl = session.config.stash.get(SESSION_KEY, None)
    if nccl is not None and _runs_tests(session.config):
        nccl.mode.collection_finished(session)


# -- fixtures -------------------------------------------------------------------------------------

def _rank_fixture(name: str):
    def fixture(request):
        if request.node.get_closest_marker("nccl") is None:
            raise NcclUsageError(f"the '{name}' fixture exists only inside a test marked "
                                 "@pytest.mark.nccl")
        request.node.stash.setdefault(RANK_FIXTURES_KEY, set()).add(name)
        return request.config.stash[SESSION_KEY].mode.fixture_value(name, request)
    fixture.__name__ = name
    fixture.__doc__ = f"pytest-nccl: this rank's {name} (only in tests marked nccl)."
    return pytest.fixture(name=name)(fixture)


rank = _rank_fixture("rank")
world_size = _rank_fixture("world_size")
device = _rank_fixture("device")
backend = _rank_fixture("backend")


@pytest.fixture
def nccl_world(request):
    """A started torch.distributed group of --nccl-world ranks: ``.size``, ``.backend``, ``.run(fn)``."""
    return request.config.stash[SESSION_KEY].mode.controller_world(request)


# -- running a marked test --------------------------------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # pytest-timeout starts its clock here too (unless func_only): our bound is what it leaves
    item.stash[STARTED_KEY] = time.monotonic()
    adopter = item.config.stash.get(ADOPTER_KEY, None)
    if adopter is not None:
        adopter.running(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    adopter = item.config.stash.get(ADOPTER_KEY, None)
    if adopter is not None:
        adopter.finished(item, nextitem)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if pyfuncitem.get_closest_marker("nccl") is None:
        return None
    __tracebackhide__ = True
    callspec = getattr(pyfuncitem, "callspec", None)
    conflict = rank_fixture_conflict(argnames_of(pyfuncitem), pyfuncitem.stash.get(RANK_FIXTURES_KEY, set()),
                                     callspec.params if callspec is not None else {})
    if conflict is not None:
        raise NcclUsageError(conflict)
    mode = pyfuncitem.config.stash[SESSION_KEY].mode
    assert mode is not None, "pytest_configure sets the mode before any test runs"
    return mode.run_item(pyfuncitem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that starts ranks itself (torchrun, mp.spawn, debug_launcher): they are followed while
    it runs, and a hang or desync among them is its failure (launched.py)."""
    __tracebackhide__ = True
    launched = item.config.stash.get(LAUNCHED_KEY, None)
    adopted = item.stash.get(ADOPTED_KEY, None)
    # an adopted test's ranks are the fork server's, judged by its own call (adopt/)
    call = launched.before(item) if launched is not None and not (adopted and adopted.adopted) else None
    if call is None:
        return (yield)
    try:
        result = yield
    except BaseException as exc:
        launched.after(call, item, exc)
        raise
    launched.after(call, item, None)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if Phase(call.when) is not Phase.CALL:
        if isinstance(exc, NcclUsageError) and rep.longrepr is not None:
            line = f"pytest-nccl: {exc}"
            rep.longrepr = NcclLongRepr(line, line, str(item.path), (item.location[1] or 0) + 1)
        return rep
    outcome = item.stash.get(OUTCOME_KEY, None)
    if outcome is not None and outcome.result is not None:
        for view in outcome.result.ranks:
            if view.output.strip():
                rep.sections.append((f"Captured output rank {view.rank}", view.output))
    if isinstance(exc, (DistributedTestFailure, NcclUsageError)) and rep.longrepr is not None \
            and not getattr(rep, "wasxfail", None):
        path, lineno = str(item.path), (item.location[1] or 0) + 1
        # the class a user catches with pytest.raises or xfail(raises=) leads the report; bad input
        # (NcclUsageError) is the plugin's own word, not an outcome to catch
        exception = type(exc).__name__ if isinstance(exc, DistributedTestFailure) else ""
        if isinstance(exc, DistributedTestFailure) and not isinstance(exc, RankSetupError):
            rep.longrepr = NcclLongRepr(str(exc), exc.report or str(exc), path, lineno, exception,
                                        _trace_files(item, call))
        else:
            line = str(exc) if str(exc).startswith("pytest-nccl: ") else f"pytest-nccl: {exc}"
            rep.longrepr = NcclLongRepr(line.split("\n")[0], line, path, lineno, exception)
    return rep


def _trace_files(item, call) -> list[tuple[str, str]]:
    """The files --nccl-trace-dir got for this call of ``item`` (none without the option)."""
    nccl = item.config.stash.get(SESSION_KEY, None)
    directory = nccl.settings.trace_dir if nccl is not None else None
    return trace_files(directory, item.nodeid, getattr(call, "start", None)) if directory else []


# -- gate report, JUnit properties, exit codes for git bisect -------------------------------------

def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # an xdist worker: the controller writes the report


def _world_backend(nccl: NcclSession) -> tuple[int, str]:
    world = nccl.settings.world
    try:
        return world, nccl.placement(world).backend
    except NcclUsageError:
        return world, nccl.settings.backend


def _junit_and_gate_start(session) -> None:
    config = session.config
    nccl = config.stash.get(SESSION_KEY, None)
    if nccl is None or _is_worker(config):
        return
    xml = junit_writer(config)
    if xml is None and not nccl.settings.report:
        return
    nccl.environment = gate.collect_environment()
    if xml is not None:
        world, backend = _world_backend(nccl)
        for name, value in gate.junit_properties(nccl.environment, backend, world):
            xml.add_global_property(name, value)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    config = session.config
    nccl = config.stash.get(SESSION_KEY, None)
    if nccl is None or _is_worker(config):
        return
    reports = nccl.recorder.reports
    if nccl.settings.report:
        results = [r for r in (gate.result_from_report(rep) for rep in reports) if r is not None]
        world, backend = _world_backend(nccl)
        env = nccl.environment or gate.collect_environment()
        markdown = gate.render_report(env, results, backend, world, report_path=nccl.settings.report)
        with open(nccl.settings.report, "w", encoding="utf-8") as f:
            f.write(markdown)
        if nccl.settings.github != GithubMode.OFF:
            gate.append_step_summary(markdown)
    code = nccl.settings.exitcode_infra
    if code is not None:
        from . import exitcodes
        failures = [exitcodes.failure_from_report(rep) for rep in reports if rep.failed]
        session.exitstatus = exitcodes.map_exitstatus(int(exitstatus), failures, code)
