"""The few messages between the controller and a rank: plain picklable data, nothing else.

controller -> rank:  ("call", Call) | ("dump",) | ("exit",)
rank -> controller:  ("hello", rank, pid) | ("joined", rank) | ("setup-error", rank, text)
                     | ("ready", rank) | ("outcome", Outcome)
                     | ("dump", rank, stacks, fr_json, fr_pickle)

Standard library only: every rank imports it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

# What a call runs on the ranks.
KIND_TEST = "test"      # a test function marked nccl: its return value is ignored
KIND_FUNCTION = "fn"    # nccl_world.run(fn): the return value is sent back, pickled


@dataclass
class Call:
    call_id: int
    kind: str
    module: str = ""          # module name of the function, as the controller imported it
    path: str = ""            # its file, for ranks that have not imported it
    qualname: str = ""        # "test_x" or "TestClass.test_x"
    payload: bytes = b""      # pickle of (args, kwargs)
    journal_dir: str = ""     # where each rank writes journal-<rank>.txt for this call
    trace: bool = True
    sys_path: list = field(default_factory=list)
    nodeid: str = ""
    rank_args: list = field(default_factory=list)  # fixtures whose values only a rank has


# Outcome statuses of a rank for one call.
PASSED, FAILED, SKIPPED, XFAILED, ERROR = "passed", "failed", "skipped", "xfailed", "error"


@dataclass
class Outcome:
    call_id: int
    rank: int
    status: str                     # PASSED | FAILED | SKIPPED | XFAILED | ERROR (could not run)
    value: bytes = b""              # pickled return value (KIND_FUNCTION)
    exc_type: str = ""
    exc_text: str = ""              # formatted traceback
    message: str = ""               # one line: exception or skip reason
    digest: dict = field(default_factory=dict)  # pg -> (count, crc) of the call's collectives
    initialized: bool = True        # torch.distributed still initialized after the call
    dangling: int = 0               # async collectives still in flight when the call returned
    duration: float = 0.0


# How a test body that raised ends, the same in a forked rank (rank.py) and in SPMD mode (spmd.py).

def _classify(exc: BaseException) -> str:
    # pytest's outcome exceptions, recognized by name so that a rank never needs pytest imported
    name = type(exc).__name__
    if name == "Skipped":
        return SKIPPED
    if name == "XFailed":
        return XFAILED
    return FAILED


def exit_like_os_exit(exc: SystemExit):
    """sys.exit() in a test body ends the rank as os._exit would: it is reported as an exit."""
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def describe_exception(exc: BaseException, format_exception) -> tuple[str, str, str, str]:
    """(status, exception type, traceback text, one-line message) of a test body that raised."""
    status, exc_type = _classify(exc), type(exc).__name__
    exc_text = format_exception(exc) if status == FAILED else ""
    message = (str(getattr(exc, "msg", "")) or str(exc)).strip().split("\n")[0][:300]
    if status == FAILED:
        message = f"{exc_type}: {message}" if message else exc_type
    return status, exc_type, exc_text, message
