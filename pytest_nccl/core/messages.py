"""Every message that crosses a process boundary, named and typed: the one place that says what
travels where. Plain picklable data (standard library only: every rank imports it); each receiver
dispatches on the message's class to one handler.

Forked ranks: one unix socket per rank, pickled (``forked/group.py`` <-> ``rank/loop.py``)
    controller -> rank   RunCall(call)            run a test body, an ``nccl_world.run`` function, or an
                                                  adopted test (``AdoptedTest``: its class's own rank entry)
                         DumpRequest()            stacks and Flight Recorder, answered while stuck
    rank -> controller   Hello(rank, pid)         connected, before joining the process group
                         Joined(rank)             in the process group
                         SetupFailed(rank, error) could not join (then exits)
                         CallDone(report)         the call's ``reports.RankReport``
                         Dump(rank, stacks, fr_json, fr_pickle)

Fork server: a socketpair, pickled (``forked/zygote_client.py`` <-> ``rank/zygote.py``)
    controller -> server ZygoteConfig(...)        first: path, environment, what to preload
                         ImportModules(modules, sys_path, environ)
                         ForkRank(spec)           a ``RankSpec``; a spawned rank reads it from a file
    server -> controller Ready(info), Imported(info)   ``ZygoteInfo``
                         Forked(pid)
                         Exited(pid, status)      a rank ended (raw wait status): ranks are its children

SPMD: the launcher's c10d store (``spmd/store.py`` names the keys)
    collect/<rank>       ``Collected`` (JSON): the test ids this rank collected, or that it left
    t/.../out/<rank>     the rank's ``RankReport``, pickled, its journal inside
    t/.../snap/<rank>    a rank still in the test: ``RankReport`` (RUNNING, stacks, journal), or b"-"
    t/.../verdict        rank 0's ``Verdict``, pickled: the same outcome on every rank

Watch: files in the job's directory and each rank's agent socket (``core/jobdir.py`` names them)
    rank-<R>.json        ``core.jobdir`` rank info (JSON): pid, host, world, backend
    exit-<R>.json        the rank's ``RankReport`` (JSON form), written at exit
    agent socket         one ``AgentRequest`` word per connection, answered with one JSON object
    sidecall-<PID>-<N>.json  ``core.sidecalls.SideCall`` (JSON): a member of a group outside c10d
                         (vLLM's ``StatelessProcessGroup``, PyNccl), where it is in it

Ranks a test starts itself: a socketpair, pickled (``launched.py`` <-> ``watch/frontends/intest.py``, the
session's helper process, which follows each test's directory as the watch follows a job's)
    pytest -> helper     TestEnded(call, failed, until)  a test's call returned, when a process of
                                                  it made its directory (``TestCall``: nothing is sent
                                                  when a call begins); pytest waits for the answer
                         Quit()                   the session ends
    helper -> pytest     TestFollowed(n, verdict) done with test n: every process it started ended;
                                                  ``LaunchedVerdict`` or None
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from .reports import RankReport
from .states import Kind, RankState, Word


class CallKind(str, enum.Enum):
    """What a call runs on the ranks."""
    TEST = "test"          # a test function marked nccl: its return value is ignored
    FUNCTION = "fn"        # nccl_world.run(fn): the return value is sent back, pickled
    ADOPTED = "adopted"    # a test of torch's MultiProcessTestCase family: its class's own per-rank entry


class AgentRequest(Word):
    """What a watched rank's agent is asked (one word on its socket, or through the channel between
    watches for a rank of another node)."""
    STATUS = "status"   # the Flight Recorder's progress per group: {"fr": ...}
    DUMP = "dump"       # every thread's stack and the Flight Recorder, once a verdict is near
    FR = "fr"           # the Flight Recorder's JSON alone
    STACK = "stack"     # every thread's stack alone: where a rank is, asked while the job goes on


class Harness(str, enum.Enum):
    """Which of torch's harnesses an adopted test class uses (``adopt/``)."""
    PROCESS = "MultiProcessTestCase"        # fresh ranks per test, running ``cls._run``
    CONTINUOUS = "MultiProcContinuousTest"  # one group per class: ``_init_pg`` once, then each test
    THREADED = "MultiThreadedTestCase"      # ranks as threads: never adopted


@dataclass
class AdoptedTest:
    """What a rank needs to run one adopted test (the payload of a ``CallKind.ADOPTED`` call):
    the class's own per-rank entry, with what torch's harness would have given a spawned rank."""
    harness: Harness
    class_name: str           # the class's name in its module (the name pytest collected it by)
    test_name: str            # the method
    test_id: str              # unittest's id() (MultiProcContinuousTest's workers are sent it)
    world: int
    file_name: str = ""       # MultiProcessTestCase: the file the controller's setUp made
    rdvz_file: str = ""       # MultiProcContinuousTest: the class's rendezvous file
    environ: dict = field(default_factory=dict)   # the controller's environment when ranks started
    kwargs: dict = field(default_factory=dict)    # more arguments of ``_run`` (fake_pg)


@dataclass
class Call:
    call_id: int
    kind: CallKind
    module: str = ""          # module name of the function, as the controller imported it
    path: str = ""            # its file, for ranks that have not imported it
    qualname: str = ""        # "test_x" or "TestClass.test_x"
    payload: bytes = b""      # pickle of (args, kwargs)
    journal_dir: str = ""     # where each rank writes journal-<rank>.txt for this call
    trace: bool = True
    sys_path: list = field(default_factory=list)
    nodeid: str = ""
    rank_args: list = field(default_factory=list)  # fixtures whose values only a rank has
    adopted: AdoptedTest | None = None             # CallKind.ADOPTED: what to run


# -- forked ranks ----------------------------------------------------------------------------------

@dataclass
class RunCall:
    call: Call


@dataclass
class DumpRequest:
    pass


@dataclass
class Hello:
    rank: int
    pid: int


@dataclass
class Joined:
    rank: int


@dataclass
class SetupFailed:
    rank: int
    error: str


@dataclass
class CallDone:
    report: RankReport


@dataclass
class Dump:
    rank: int
    stacks: str
    fr_json: str | None
    fr_pickle: bytes | None


@dataclass
class RankSpec:
    """Everything a rank needs to start: its place in the world, where to meet the others, its files."""
    rank: int
    local_rank: int
    world: int
    local_world: int
    backend: str
    pg_timeout: float          # the process group's own timeout, seconds
    store_path: str            # the FileStore the group rendezvous over
    control_path: str          # the controller's unix socket
    output_path: str           # the rank's stdout and stderr
    stack_path: str            # faulthandler's stacks (SIGUSR1, fatal signals)
    master_addr: str
    master_port: int
    env: dict = field(default_factory=dict)   # more environment (CUDA_VISIBLE_DEVICES, ...)
    run_id: str = "pytest-nccl"
    cuda_device: int | None = None             # the current CUDA device of a rank that shares GPUs
    own_group: bool = False    # adopted tests: the test creates its process group itself, not the rank


# -- the fork server ----------------------------------------------------------------------------------

class RankStart(str, enum.Enum):
    """How the fork server starts ranks (``--nccl-rank-start``)."""
    AUTO = "auto"      # fork, until a test module initializes CUDA: then spawn
    FORK = "fork"
    SPAWN = "spawn"


@dataclass
class ZygoteConfig:
    sys_path: list
    env: dict
    trace: bool
    preload: list               # (module, path) pairs to import before the first fork
    rank_start: RankStart = RankStart.AUTO


@dataclass
class ZygoteInfo:
    torch: str = ""
    failures: list = field(default_factory=list)    # "module: error" of imports that failed
    cuda_initialized_by: str | None = None          # the module after whose import CUDA was initialized
    start: RankStart = RankStart.FORK               # how the next rank starts


@dataclass
class ImportModules:
    modules: list               # (module, path) pairs
    sys_path: list
    environ: dict | None = None  # the controller's environment after collection (conftest files set some)


@dataclass
class ForkRank:
    spec: RankSpec


@dataclass
class Ready:
    info: ZygoteInfo


@dataclass
class Imported:
    info: ZygoteInfo


@dataclass
class Forked:
    pid: int


@dataclass
class Exited:
    pid: int
    status: int                 # raw wait status; -1 when it could not be read


@dataclass
class SpawnedRank:
    """What a rank started as a fresh interpreter reads from its spec file."""
    spec: RankSpec
    modules: list
    sys_path: list
    trace: bool


# -- SPMD ---------------------------------------------------------------------------------------------

@dataclass
class Collected:
    """What one launched rank collected (JSON in the store), or that it left before collecting."""
    ids: list = field(default_factory=list)
    errors: int = 0
    gone: bool = False

    def to_json(self) -> str:
        return json.dumps({"gone": True} if self.gone else {"ids": self.ids, "errors": self.errors})

    @classmethod
    def from_json(cls, text) -> "Collected":
        data = json.loads(text)
        return cls(ids=list(data.get("ids", [])), errors=int(data.get("errors", 0)), gone=bool(data.get("gone")))


@dataclass
class Verdict:
    """Rank 0's decision on one test in SPMD mode, the same on every rank (it travels pickled
    through the launcher's store)."""
    status: RankState                 # PASSED, SKIPPED, XFAILED or FAILED
    message: str = ""                 # skip / xfail reason
    kind: Kind | None = None          # diagnosis kind of a failure
    headline: str = ""
    exception: str = ""               # the public exception's class name
    stuck: list = field(default_factory=list)   # ranks no abort released
    stop: str | None = None           # why the session stops after this test
    recreate: bool = False            # create the process group again before the next test

    @property
    def failed(self) -> bool:
        return self.status == RankState.FAILED


# -- ranks a test starts itself ---------------------------------------------------------------------------

@dataclass
class TestCall:
    """A test's call, as its directory's name says it (``t<n>-<since>-<bound in 0.1 s>``): pytest sends
    nothing when a call begins; the helper learns of it when a process of the test makes the directory."""
    __test__ = False          # not a test class, whatever pytest's name rules say
    n: int
    directory: str
    since: int                # clock ticks since boot (``/proc/PID/stat``'s start time) at the call's start
    bound: float              # seconds without progress that make a hang (--nccl-timeout)

    @property
    def name(self) -> str:
        return f"t{self.n}-{self.since}-{round(self.bound * 10)}"

    @classmethod
    def from_name(cls, base: str, name: str) -> "TestCall | None":
        try:
            n, since, bound = name[1:].split("-")
            return cls(int(n), f"{base}/{name}", int(since), int(bound) / 10) if name[0] == "t" else None
        except (ValueError, IndexError):
            return None


@dataclass
class TestEnded:
    __test__ = False
    call: TestCall
    failed: bool              # the test itself raised (its own failure, before any verdict of ours)
    until: int                # clock ticks since boot at the call's end: what started later is another test's
    interrupted: str = ""     # the signal that interrupted pytest during the call (SIGINT...): where the ranks are


@dataclass
class Quit:
    pass


@dataclass
class LaunchedVerdict:
    """What the helper concluded of a test's ranks."""
    headline: str
    exception: str            # the public exception's class name
    report: str               # the report text (headline, collective table, stacks)
    live: bool                # decided while the test ran: the helper ended the test's processes
    launcher_sees: bool       # a rank raised or died: the launcher tells the test itself
    finding: object = None    # the watch's ``Finding`` (views and diagnosis), for the trace; None: no diagnosis
    backend: str = ""


@dataclass
class TestFollowed:
    __test__ = False
    n: int
    verdict: LaunchedVerdict | None = None
