"""Helpers for testing the plugin through real inner pytest sessions (pytester)."""

from __future__ import annotations

import ast
import dis
import functools
import importlib.metadata
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from memcg_support import small_memory_cgroup  # noqa: F401 (a fixture: tests of the OOM killer's kills)
from spmd_support import launch  # noqa: F401 (a fixture: pytest under torchrun, SPMD mode)

# The inner sessions write gate reports: on GitHub Actions they would land in the real job summary
# (a test of the summary sets its own). Removed at import, so every subprocess inherits it too.
os.environ.pop("GITHUB_STEP_SUMMARY", None)
# and their failures would be annotations of this repository's run, their output not what a user's
# sees off GitHub (tests/test_github.py sets its own)
os.environ.pop("GITHUB_ACTIONS", None)

INNER_TIMEOUT = 240  # an inner session that takes longer than this is itself a hang


@dataclass
class Inner:
    result: pytest.RunResult
    elapsed: float
    tag: str

    @property
    def text(self) -> str:
        return self.result.stdout.str() + "\n" + self.result.stderr.str()

    def section(self, test_name: str) -> str:
        """The failure section of one test in the inner session's output."""
        lines = self.result.stdout.lines
        start = next((i for i, line in enumerate(lines) if line.startswith("_") and f" {test_name} " in line), None)
        if start is None:
            return ""
        end = next((i for i in range(start + 1, len(lines))
                    if (lines[i].startswith("___") or lines[i].startswith("===")) ), len(lines))
        return "\n".join(lines[start:end])

    def headline(self, test_name: str) -> str:
        """The failure's headline: its report's first line less the exception class it starts with
        ('CollectiveMismatch: shape mismatch in ...')."""
        lines = self.section(test_name).splitlines()
        first = lines[1] if len(lines) > 1 else ""
        return re.sub(r"^[A-Z]\w*: ", "", first, count=1)


def line_of(source: str, snippet: str) -> int:
    """1-based line of ``snippet`` in the module that ``run_inner`` writes from ``source``."""
    lines = textwrap.dedent(source).lstrip("\n").splitlines()
    return next(i for i, line in enumerate(lines, 1) if snippet in line)


def processes_with_tag(tag: str) -> list[str]:
    """Live processes whose environment carries the tag: the inner session's fork server, ranks and
    anything they started. Zombies count as gone."""
    found = []
    needle = f"PYTEST_NCCL_TEST_TAG={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid}: {cmdline}")
        except OSError:
            continue
    return found


def assert_no_leftovers(tag: str, wait: float = 3.0) -> None:
    deadline = time.monotonic() + wait
    left = processes_with_tag(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_with_tag(tag)
    if left:
        kill_tagged(tag)  # the test fails, and what it left does not outlive it
    assert not left, f"processes outlived the inner session: {left}"


def kill_tagged(tag: str) -> None:
    """SIGKILL every live process carrying the tag (a failed test's inner session, its launcher's
    ranks in their own sessions, anything they started)."""
    for entry in processes_with_tag(tag):
        try:
            os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture
def run_inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Write ``source`` as a test module, run a real inner pytest in a subprocess, return Inner.
    Afterwards, no process of that inner session may be alive."""
    tags = []

    def run(source: str, *args: str, name: str = "test_inner", timeout: float = INNER_TIMEOUT) -> Inner:
        tag = uuid.uuid4().hex
        tags.append(tag)
        monkeypatch.setenv("PYTEST_NCCL_TEST_TAG", tag)
        pytester.makepyfile(**{name: textwrap.dedent(source)})
        t0 = time.monotonic()
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, timeout=timeout)
        inner = Inner(result, time.monotonic() - t0, tag)
        assert_no_leftovers(tag)
        return inner

    yield run
    for tag in tags:
        assert_no_leftovers(tag, wait=0.5)


def run_inner_once(tmp_path_factory, source: str, *args: str, name: str = "test_inner",
                   timeout: float = INNER_TIMEOUT) -> Inner:
    """As ``run_inner``, for a module-scoped fixture: one inner session whose outcome several tests
    check, one scenario each (so a failure names its scenario, and start-up is paid once)."""
    directory = tmp_path_factory.mktemp(name)
    (directory / f"{name}.py").write_text(textwrap.dedent(source).lstrip("\n"))  # as pytester writes it
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTEST_NCCL_TEST_TAG=tag)
    env.pop("PYTEST_ADDOPTS", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - t0
    result = pytest.RunResult(proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines(), elapsed)
    assert_no_leftovers(tag)
    return Inner(result, elapsed, tag)


def run_scenarios(tmp_path_factory, source: str, *args: str) -> tuple[Inner, dict, dict]:
    """One inner session of scenarios (``run_inner_once``), with what each test's JUnit properties
    say ((test, property) -> value: ``nccl_diagnosis``, ``nccl_exception``) and each call's duration
    (test -> seconds)."""
    junit_path = tmp_path_factory.mktemp("junit") / "junit.xml"
    inner = run_inner_once(tmp_path_factory, source, *args, f"--junitxml={junit_path}", "--durations=0",
                           "--durations-min=0", name="test_inner")
    junit = ET.parse(junit_path).getroot()
    props = {(case.get("name"), p.get("name")): p.get("value")
             for case in junit.iter("testcase") for p in case.iter("property")}
    durations = {m.group(2): float(m.group(1)) for line in inner.result.stdout.lines
                 for m in [re.match(r"\s*([\d.]+)s call\s+test_inner.py::(\w+)", line)] if m}
    return inner, props, durations


def run_fresh(code: str, timeout: float = 180) -> str:
    """``code`` in a fresh interpreter (installing the tracer patches torch.distributed for the whole
    process), without the launched-ranks hook this test's children get (docs/launched.md: it would
    install the tracer at torch's import, before the code under test does); its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# -- Tiers: every test is marked once, by what it starts (pyproject.toml declares the markers) ------
# fast: pure, on data: no process but pytest's own and no torch; groups: forked groups, adopted
# classes, SPMD, inner pytest sessions, any other process or torch; jobs: the watch over real
# launchers and libraries. Read from the code a test runs (its function, its fixtures, the helpers of
# tests/ they call, the first call into the package), so that a file nobody listed is classified
# too; the guard below fails a fast test that starts a process all the same (tests/test_tiers.py).
TIERS = ("fast", "groups", "jobs")
TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
PACKAGE_DIR = REPO_DIR / "pytest_nccl"
PROCESS_MODULES = {"subprocess", "multiprocessing", "torch.multiprocessing", "concurrent.futures.process"}
OS_PROCESS_CALLS = {"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen", "execv", "execve",
                    "execvp", "spawnv", "spawnl", "spawnlp", "spawnvp"}
# pytester's methods that run an inner pytest session (in this process or another)
PYTESTER_SESSIONS = {"runpytest", "runpytest_subprocess", "runpytest_inprocess", "inline_run", "inline_runsource",
                     "runpython", "runpython_c", "spawn_pytest"}
# what a job's code names: a library's own distributed code imported, a real launcher run, the watch
JOB_TEXT = re.compile(r"\b(?:import|from)\s+(?:accelerate|deepspeed|vllm|trl|verl|ray|openrlhf|swift)\b|"
                      r"\btorchrun\s|\bdebug_launcher\b|\btorch\.distributed\.(?:run|launch)\b")
LAUNCHERS = {"torchrun", "accelerate", "deepspeed", "srun", "ray"}  # a command's first word


@dataclass
class Reach:
    """What a test's code reaches: a process started (by the watch's helpers?), torch, a job named."""
    process: bool = False
    watch_job: bool = False
    torch: bool = False
    job_named: bool = False


def _in(path: str | None, folder: Path) -> bool:
    return bool(path) and ".venv" not in str(path) and Path(path).resolve().is_relative_to(folder)


def _module_file(name: str) -> Path | None:
    """The file of a module of this package or of tests/ (a helper), None for any other."""
    base = (REPO_DIR if name.split(".")[0] == "pytest_nccl" else TESTS_DIR) / name.replace(".", "/")
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


_IMPORTS_TORCH: dict = {}


def imports_torch(path: Path) -> bool:
    """Whether importing this file imports torch: its import statements run at import time (not in
    function bodies), followed into this package and the helpers of tests/."""
    if path not in _IMPORTS_TORCH:
        _IMPORTS_TORCH[path] = False  # an import cycle ends here
        _IMPORTS_TORCH[path] = any(_requires_torch(name.split(".")[0])
                                   or any(f is not None and f != path and imports_torch(f)
                                          for f in map(_module_file, _packages(name)))
                                   for name in _imported_at_import(path))
    return _IMPORTS_TORCH[path]


@functools.cache
def _requires_torch(top: str) -> bool:
    """torch itself, or an installed library that requires it (accelerate, transformers: importing them
    imports torch)."""
    if top == "torch":
        return True
    for dist in importlib.metadata.packages_distributions().get(top, ()):
        try:
            requires = importlib.metadata.requires(dist) or ()
        except importlib.metadata.PackageNotFoundError:
            continue
        if any(re.match(r"torch\b(?![-_.\w])", r) and "extra ==" not in r for r in requires):
            return True
    return False


def _packages(name: str) -> list:
    """A module and the packages importing it imports first: a.b.c -> a, a.b, a.b.c."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imported_at_import(path: Path) -> list:
    """Absolute names of the modules (and of the names, which may be modules) a file's import-time
    statements and ``pytest.importorskip`` calls import."""
    package = ""
    if _in(str(path), PACKAGE_DIR):
        package = ".".join(path.relative_to(REPO_DIR).with_suffix("").parts).removesuffix(".__init__")
        if path.name != "__init__.py":
            package = package.rpartition(".")[0]
    names, pending = [], list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            names.append(node.args[0].value)  # pytest.importorskip("accelerate") at import time
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
        pending += list(ast.iter_child_nodes(node))
    return names


def _reach(code, namespace: dict, reach: Reach, seen: set, *, follow: bool, own: bool, watch_support: bool,
           doc: str | None = None) -> None:
    """Reads ``code`` (and its nested functions): ``follow``, what it calls of tests/ and its first call
    into the package; ``own``, its strings (not its docstring ``doc``) may name a job; ``watch_support``,
    a process it starts is a watched job."""
    if id(code) in seen:
        return
    seen.add(id(code))
    names = set(code.co_names)
    consts = [c for const in code.co_consts for c in (const if isinstance(const, (tuple, frozenset)) else (const,))
              if isinstance(c, str) and c is not doc]  # a list of strings is one tuple constant
    reach.torch |= any(_imports_torch_named(name, names) for name in _imported_in(code)) \
        or ("importorskip" in names and any(_requires_torch(c.split(".")[0]) for c in consts))
    started = bool(names & PYTESTER_SESSIONS or names & {"subprocess", "multiprocessing"})  # imported in the function
    for name in names:
        obj = namespace.get(name)
        if obj is None:
            continue
        module = (obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)) or ""
        started |= module in PROCESS_MODULES or module.startswith("multiprocessing.") \
            or (module == "os" and bool(names & OS_PROCESS_CALLS))
        reach.torch |= module.split(".")[0] == "torch"
        if not follow:
            continue
        if isinstance(obj, types.ModuleType) and _in(getattr(obj, "__file__", None), REPO_DIR):
            for attribute in names & set(vars(obj)):  # module.function(...)
                _reach_object(getattr(obj, attribute), reach, seen, own=False)
        _reach_object(obj, reach, seen, own=own)
    reach.process |= started
    reach.watch_job |= started and watch_support
    watch_command = ("pytest_nccl", "watch") in zip(consts, consts[1:], strict=False)  # -m pytest_nccl watch
    reach.job_named |= own and (watch_command or any(JOB_TEXT.search(c) or c in LAUNCHERS for c in consts))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _reach(const, namespace, reach, seen, follow=follow, own=own, watch_support=watch_support)


def _imported_in(code) -> list:
    """The modules a function's own import statements name."""
    return [i.argval for i in dis.get_instructions(code) if i.opname == "IMPORT_NAME"]


def _imports_torch_named(name: str, names: set) -> bool:
    """Whether ``import name`` (or ``from name import ...`` of ``names``) in a function imports torch."""
    if _requires_torch(name.split(".")[0]):
        return True
    files = [_module_file(n) for n in _packages(name) + [f"{name}.{other}" for other in names]]
    return any(f is not None and imports_torch(f) for f in files)


def _reach_object(obj, reach: Reach, seen: set, own: bool) -> None:
    """Follows a function or class of tests/ (the helpers a test calls) and reads a function of the
    package or the benchmarks that tests/ calls, without following it further (a command's ``main``
    on fakes starts nothing, ``run_pytest`` does); a string of the test's own module may name a job."""
    if isinstance(obj, str):
        reach.job_named |= own and bool(JOB_TEXT.search(obj))
        return
    if isinstance(obj, type):
        if _in(getattr(sys.modules.get(obj.__module__), "__file__", None), TESTS_DIR):
            for member in vars(obj).values():
                _reach_object(member, reach, seen, own)
        return
    wrapped = getattr(obj, "_get_wrapped_function", None)  # a fixture's definition
    try:
        func = inspect.unwrap(wrapped() if callable(wrapped) else obj)
    except ValueError:  # a cycle of __wrapped__
        return
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    if code is None or not _in(code.co_filename, REPO_DIR):
        return
    filename = Path(code.co_filename).name
    of_tests = _in(code.co_filename, TESTS_DIR)
    _reach(code, func.__globals__, reach, seen, follow=of_tests, doc=getattr(func, "__doc__", None),
           own=own and of_tests and not filename.endswith("_support.py") and filename != "conftest.py",
           watch_support=filename == "watch_support.py")


def tier_of(item: pytest.Item) -> str:
    """The tier a test belongs to, from what its code and fixtures start."""
    reach, seen = Reach(), set()
    module = getattr(item, "module", None)
    if getattr(module, "__file__", None):
        reach.torch |= imports_torch(Path(module.__file__).resolve())
    info = getattr(item, "_fixtureinfo", None)
    for fixturedefs in (info.name2fixturedefs.values() if info else ()):
        for fixturedef in fixturedefs:
            _reach_object(fixturedef.func, reach, seen, own=True)
    if getattr(item, "function", None) is not None:
        _reach_object(item.function, reach, seen, own=True)
    if reach.process and (reach.watch_job or reach.job_named):
        return "jobs"
    return "groups" if reach.process or reach.torch else "fast"


def holds_no_fast_test(path: Path) -> bool:
    """A test file that cannot hold a fast test: importing it imports torch."""
    return path.name.startswith("test_") and path.suffix == ".py" and imports_torch(path.resolve())


_TIER_MARKS: dict = {}  # nodeid -> its tier marks, this session's


@pytest.hookimpl(tryfirst=True)  # before -m selects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        marked = [m.name for m in item.iter_markers() if m.name in TIERS]
        if not marked:
            item.add_marker(tier_of(item))
        elif len(set(marked)) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {marked}: a test belongs to one tier")
    _TIER_MARKS.update({item.nodeid: [m.name for m in item.iter_markers() if m.name in TIERS] for item in items})


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With PYTEST_NCCL_TIERS_REPORT, the session's tier marks, whether torch was imported and what
    fast tests started, into that file (tests/test_tiers.py)."""
    report = os.environ.get("PYTEST_NCCL_TIERS_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"tiers": _TIER_MARKS, "torch": "torch" in sys.modules, "started": _STARTED}, f)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m fast`` leaves out the files that import torch (none of their tests is fast): the fast tier
    imports no torch at all."""
    if config.getoption("markexpr", "") == "fast" and collection_path.is_file() \
            and _in(str(collection_path), TESTS_DIR) and holds_no_fast_test(collection_path):
        return True
    return None


# -- `pytest` runs the project's tests on 2 xdist workers, a file to a worker (module-scoped inner
# sessions stay shared): most of their time is waiting (ranks starting, bounds, launchers), not
# computing. Only when no path is named (pytest's testpaths): named files and tests, the fast tier,
# --pdb and a launched rank (SPMD mode refuses xdist) run in one process; -n N decides itself.
XDIST_WORKERS = 2


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own reads -n
def pytest_cmdline_main(config: pytest.Config) -> None:
    option = config.option
    if hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ:
        return  # an xdist worker runs its share itself: two workers of its own each would fork without end
    if getattr(option, "numprocesses", "") is not None or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return  # -n given, or pytest-xdist absent (-p no:xdist); paths named
    if config.getoption("markexpr", "") == "fast" or option.collectonly or config.getoption("usepdb", False) \
            or "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    option.numprocesses = min(XDIST_WORKERS, os.cpu_count() or 1)
    if option.dist == "no":
        option.dist = "loadfile"


# -- The fast tier's guard: a fast test that starts a process fails, naming it (the rule above missed
# what it starts). Only the test's own thread counts: a thread an earlier test left may fork.
_FAST_TEST: dict = {}  # thread ident -> the fast test running on it
_STARTED: dict = {}  # nodeid -> what it started


def _guarded(function, what: str):
    def start(*args, **kwargs):
        nodeid = _FAST_TEST.get(threading.get_ident())
        if nodeid is not None:
            _STARTED.setdefault(nodeid, what)
        return function(*args, **kwargs)
    start.__wrapped__ = function
    return start


def _install_guard() -> None:
    import _posixsubprocess  # subprocess's and multiprocessing's fork and exec
    _posixsubprocess.fork_exec = _guarded(_posixsubprocess.fork_exec, "a subprocess")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            setattr(os, name, _guarded(getattr(os, name), f"os.{name}"))


_install_guard()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    fast = item.get_closest_marker("fast") is not None
    if fast:
        _FAST_TEST[threading.get_ident()] = item.nodeid
    try:
        return (yield)
    finally:
        _FAST_TEST.pop(threading.get_ident(), None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    started = _STARTED.get(item.nodeid)
    if started and report.when == "teardown" and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is in the fast tier but started {started}: tests/conftest.py's "
                           "tier rule did not see what it starts")
    return report
