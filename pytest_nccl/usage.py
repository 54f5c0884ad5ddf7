"""How every command of ``pytest-nccl`` (bisect, matrix, watch, and the program itself) says that its
arguments are wrong: one line on stderr, ``PROG: error: MESSAGE (see PROG --help)``, and exit 2;
never argparse's usage block, never a traceback."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, TextIO

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad or missing arguments; ``prog`` is the command they were given to, where known."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors raise :class:`UsageError` instead of printing the usage block
    and exiting (argparse makes subcommand parsers of their parent's class, so theirs do too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)


def line(prog: str, message: str) -> str:
    """The one line a usage error is: the command, the message, where to read more."""
    return f"{prog}: error: {message} (see {prog} --help)"


def report(exc: UsageError, prog: str, err: TextIO | None = None) -> int:
    """Write ``exc`` as its one line (under its own command's name when it has one); EXIT_USAGE."""
    (err or sys.stderr).write(line(exc.prog or prog, str(exc)) + "\n")
    return EXIT_USAGE
