"""``pytest-nccl``'s command line: --version, one parser with one program name (the one the user
typed), errors on stderr with documented exit codes, --run-timeout (and --timeout's deprecation),
a heartbeat while long steps run."""

import io
import subprocess
import sys

import pytest
from fakes import FakeBuilder

from pytest_nccl import __version__
from pytest_nccl.__main__ import main, program_name
from pytest_nccl.bisect import cli, envs
from pytest_nccl.bisect.envs import BaseInfo, EnvCache
from pytest_nccl.bisect.heartbeat import Heartbeat, elapsed_text
from pytest_nccl.bisect.matrix import cli as matrix_cli
from pytest_nccl.bisect.runner import RunOutcome
from pytest_nccl.bisect.search import Verdict
from pytest_nccl.bisect.versions import StaticIndex

BISECT = ["bisect", "trl", "--good", "0.13.0", "--bad", "0.14.0", "--", "suites/trl"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pytest-nccl {__version__}"


def test_the_version_is_the_installed_metadata_or_says_unknown():
    import importlib.metadata as md
    try:
        expected = md.version("pytest-nccl")
    except md.PackageNotFoundError:
        expected = "0+unknown"
    assert __version__ == expected


@pytest.mark.parametrize("argv0, prog", [("/venv/bin/pytest-nccl", "pytest-nccl"),
                                         ("/src/pytest_nccl/__main__.py", "python -m pytest_nccl")])
def test_one_program_name_the_one_the_user_typed(argv0, prog, capsys):
    assert program_name(argv0) == prog
    assert main(["bisect", "trl"], prog=prog) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog} bisect: error: a bisect needs --good") and err.count("\n") == 1
    assert main(["matrix", "--help"], prog=prog) == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} matrix ")


def test_python_dash_m_names_itself(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest_nccl", "frobnicate"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "python -m pytest_nccl: error: argument COMMAND: invalid choice: 'frobnicate'" in proc.stderr


def test_no_command_is_a_usage_error(capsys):
    assert main([], prog="pytest-nccl") == 2
    assert "pytest-nccl: error: give a command: explain, bisect, matrix, watch" in capsys.readouterr().err


class Runner:
    def __call__(self, python, args, *, log, timeout, cwd, stream):
        return RunOutcome(0, 1.0, Verdict.GOOD, None, [], log)


def test_runtime_errors_go_to_stderr_progress_to_stdout(tmp_path):
    ns = cli.parse_args(BISECT[1:2] + ["--good", "0.13.0", "--bad", "9.9.9", "--", "x"])
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(ns, out, err=err, index=StaticIndex({"trl": ["0.13.0", "0.14.0"]}))
    assert code == cli.EXIT_INDEX and out.getvalue() == ""
    assert err.getvalue().startswith("pytest-nccl bisect: ") and "9.9.9" in err.getvalue()


def test_torch_not_installed_is_not_the_usage_code(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "detect_base", lambda: BaseInfo("python", "3.11.7", None, "/base"))
    for module, argv in ((cli, BISECT[1:-2]), (matrix_cli, ["trl", "--versions", "0.13.0", "--results",
                                                             str(tmp_path / "m.json")])):
        ns = module.parse_args(argv + ["--cache-dir", str(tmp_path), "--", "x"])
        out, err = io.StringIO(), io.StringIO()
        code = module.run(ns, out, err=err, index=StaticIndex({"trl": ["0.13.0", "0.14.0"]}))
        assert code == cli.EXIT_ENVIRONMENT == 6 != cli.EXIT_USAGE
        assert "torch is not installed in this interpreter" in err.getvalue()


@pytest.mark.parametrize("module, argv", [(cli, BISECT[1:-2]), (matrix_cli, ["trl", "--versions", "1.0",
                                                                               "--results", "m.json"])])
def test_run_timeout_and_the_deprecated_timeout(module, argv, capsys):
    assert module.parse_args(argv + ["--run-timeout", "60", "--", "x"]).run_timeout == 60
    assert capsys.readouterr().err == ""
    assert module.parse_args(argv + ["--", "x"]).run_timeout == cli.RUN_TIMEOUT
    ns = module.parse_args(argv + ["--timeout", "90", "--", "x"])
    assert ns.run_timeout == 90
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{module.PROG}: --timeout is deprecated and will be removed: use --run-timeout "
                   "(the bound of one whole pytest run)"]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Beats:
    """An Event whose wait() lets ``n`` intervals pass (on the fake clock), then reports the step done."""

    def __init__(self, clock, n):
        self.clock, self.left = clock, n

    def __call__(self):
        return self

    def wait(self, timeout):
        if self.left == 0:
            return True
        self.left -= 1
        self.clock.now += timeout
        return False

    def set(self):
        pass


def test_heartbeat_lines_while_a_step_runs():
    clock = FakeClock()
    out = io.StringIO()
    heartbeat = Heartbeat(out, every=60, clock=clock, event=Beats(clock, 2))
    with heartbeat.step("env of trl 0.15.0"):
        pass
    assert out.getvalue().splitlines()[1::2] == ["  ... env of trl 0.15.0: still running after 1m00s",
                                                 "  ... env of trl 0.15.0: still running after 2m00s"]
    assert [elapsed_text(s) for s in (5, 60, 61, 3600)] == ["5s", "1m00s", "1m01s", "60m00s"]


def test_every_env_build_and_pytest_run_has_a_heartbeat(tmp_path):
    steps = []

    class Recording(Heartbeat):
        def step(self, what):
            steps.append(what)
            return super().step(what)

    base = BaseInfo("python", "3.11.7", "2.13.0+cpu", "/base")
    cache = EnvCache(tmp_path / "cache", FakeBuilder(), base)
    ns = cli.parse_args(BISECT[1:])
    code = cli.run(ns, io.StringIO(), err=io.StringIO(), index=StaticIndex({"trl": ["0.13.0", "0.14.0"]}),
                   make_cache=lambda ns, out: (cache, "fake", [], [], []), run_tests=Runner(),
                   heartbeat=Recording(io.StringIO()))
    assert code in (cli.EXIT_BOUNDS, cli.EXIT_FOUND)
    assert steps[:4] == ["env of trl 0.13.0", "tests on trl 0.13.0", "env of trl 0.14.0", "tests on trl 0.14.0"]
