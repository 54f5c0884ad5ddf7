"""Every command of ``pytest-nccl`` (the program, bisect, matrix, watch) given bad or missing
arguments says so in one line on stderr, ``PROG: error: MESSAGE (see PROG --help)``, and exits 2:
never argparse's usage block, never a traceback (pytest_nccl/usage.py)."""

import subprocess
import sys

import pytest

from pytest_nccl.__main__ import main

SELECTION = ["--", "suites/trl"]
CASES = [
    # (arguments, the command that says it, what the line says)
    ([], "pytest-nccl", "give a command: explain, bisect, matrix, watch"),
    (["--bogus"], "pytest-nccl", "unrecognized arguments: --bogus"),
    (["frobnicate"], "pytest-nccl", "invalid choice: 'frobnicate'"),
    (["bisect"], "pytest-nccl bisect", "give the PACKAGE and its releases, e.g. trl --good"),
    (["bisect", "--bogus"], "pytest-nccl bisect", "unrecognized arguments: --bogus"),
    (["bisect", "trl", "--bogus", *SELECTION], "pytest-nccl bisect", "unrecognized arguments: --bogus"),
    (["bisect", "trl"], "pytest-nccl bisect", "a bisect needs --good V and --bad V"),
    (["bisect", "trl", "--good", "1.0", "--bad", "2.0"], "pytest-nccl bisect", "give the pytest selection after '--'"),
    (["bisect", "trl", "--good", "banana", "--bad", "2.0", *SELECTION], "pytest-nccl bisect",
     "'banana' is not a version"),
    (["bisect", "trl", "--installer", "conda"], "pytest-nccl bisect", "argument --installer: invalid choice"),
    (["bisect", "trl", "--good", "1", "--bad", "2", "--run-timeout", "0", *SELECTION], "pytest-nccl bisect",
     "--run-timeout must be positive"),
    (["bisect", "trl", "--run-timeout"], "pytest-nccl bisect", "argument --run-timeout: expected one argument"),
    (["matrix"], "pytest-nccl matrix", "the following arguments are required: --results"),
    (["matrix", "trl", "--results", "m.json", *SELECTION], "pytest-nccl matrix", "give the releases"),
    (["matrix", "trl", "--versions", "1.0", "--world", "two", "--results", "m.json", *SELECTION],
     "pytest-nccl matrix", "argument --world: invalid int value: 'two'"),
    (["matrix", "trl", "--versions", "1.0", "--results", "m.json", "--bogus", *SELECTION], "pytest-nccl matrix",
     "unrecognized arguments: --bogus"),
    (["explain"], "pytest-nccl explain", "the following arguments are required: PATH"),
    (["explain", "--world", "0", "dumps/"], "pytest-nccl explain", "--world must be a positive number of ranks"),
    (["explain", "--jobs", "x", "dumps/"], "pytest-nccl explain", "argument --jobs: invalid int value"),
    (["explain", "--jobs", "0", "dumps/"], "pytest-nccl explain", "--jobs must be a positive number of processes"),
    (["watch"], "pytest-nccl watch", "no command to watch: give it after --"),
    (["watch", "--timeout", "0", "--", "true"], "pytest-nccl watch", "--timeout must be a positive number"),
    (["watch", "--timeout", "x", "--", "true"], "pytest-nccl watch", "argument --timeout: invalid float value"),
    (["watch", "--timeout"], "pytest-nccl watch", "argument --timeout: expected one argument"),
    (["watch", "--bogus", "--", "true"], "pytest-nccl watch", "unrecognized arguments: --bogus"),
]


def assert_one_line(err: str, command: str, message: str) -> None:
    assert "Traceback" not in err and "usage:" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{command}: error: ") and message in lines[0], lines[0]
    assert lines[0].endswith(f"(see {command} --help)"), lines[0]


@pytest.mark.parametrize("argv, command, message", CASES, ids=[" ".join(c[0]) or "(none)" for c in CASES])
def test_a_usage_error_is_one_line_and_exit_2(argv, command, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # nothing a command might write lands in the checkout
    assert main(argv, prog="pytest-nccl") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line(err, command, message)


@pytest.mark.parametrize("argv, command", [([], "python -m pytest_nccl"),
                                           (["bisect"], "python -m pytest_nccl bisect"),
                                           (["matrix", "trl"], "python -m pytest_nccl matrix"),
                                           (["watch", "--timeout", "-1", "--", "true"], "pytest-nccl watch")])
def test_the_process_exits_2_with_one_line(argv, command, tmp_path):
    """The same through a real process (``python -m pytest_nccl``): the exit status is the process's."""
    proc = subprocess.run([sys.executable, "-m", "pytest_nccl", *argv], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert_one_line(proc.stderr, command, "")


def test_help_still_prints_the_usage_and_exits_0(capsys):
    assert main(["bisect", "--help"], prog="pytest-nccl") == 0
    assert capsys.readouterr().out.startswith("usage: pytest-nccl bisect ")
