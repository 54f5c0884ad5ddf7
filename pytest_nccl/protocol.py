"""The few messages between the controller and a rank: plain picklable data, nothing else.

controller -> rank:  ("call", Call) | ("dump",)
rank -> controller:  ("hello", rank, pid) | ("joined", rank) | ("setup-error", rank, text)
                     | ("outcome", Outcome) | ("dump", rank, stacks, fr_json, fr_pickle)

Standard library only: every rank imports it.
"""

from __future__ import annotations

import enum
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


class Status(str, enum.Enum):
    """How one call ended on one rank."""
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    ERROR = "error"      # the call could not run (the function cannot be loaded, the result pickled)

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass
class Outcome:
    call_id: int
    rank: int
    status: Status
    value: bytes = b""              # pickled return value (KIND_FUNCTION)
    exc_type: str = ""
    exc_text: str = ""              # formatted traceback
    message: str = ""               # one line: exception or skip reason
    digest: dict = field(default_factory=dict)  # pg -> (count, crc) of the call's collectives
    initialized: bool = True        # torch.distributed still initialized after the call
    dangling: int = 0               # async collectives still in flight when the call returned
    duration: float = 0.0
    unloadable: bool = False        # ERROR because the function could not be loaded (its module or a
                                    # library it imports fails): infrastructure for git bisect
