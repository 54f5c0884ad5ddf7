"""Both sides of ``pytest-nccl watch``: the files of one watched job and the environment that names
them. Standard library only (every rank imports it).

In ``$PYTEST_NCCL_WATCH_DIR`` (a private directory the watch creates per job):

    torch-PID        empty: process PID of the job imported torch (the hook is armed there)
    where.pid        the watch command's pid: SIGUSR1 to it writes where.txt (``pytest-nccl where``)
    where.txt        its last answer: where each rank is

and in the directory of each of the launcher's attempts (``attempt_dir``: the job directory for the
first, ``restart-N/`` for torchrun's N-th restart), per process PID and rank R:

    joining-PID.json while PID waits in ``init_process_group``: where, rank and world when known;
                     or in a side group's creation (``what`` "group": its name and store too)
    joinfailed-PID.json  PID's ``init_process_group`` raised: its joining note with ``error``
    member-PID       empty: PID created a side group (a group outside ``init_process_group``)
    sidecall-PID-N.json  PID's note of its N-th vLLM group (``core.sidecalls.SideCall``): where
                     it is in the group (``rank/trace_vllm.py``)

    journal-R.txt    the tracer's journal (journal.py), from the moment the default group exists;
                     rotated to journal-R.txt.1 past ``segment_bytes()`` (the last segment is kept)
    rank-R.json      written once the default group exists: rank, world, pid, host, backend; the
                     node's rank count and the job's store address (several nodes: channel.py)
    exit-R.json      written at exit: passed, or raised (exception line and traceback); absent
                     when the process was killed
    fatal-R.txt      faulthandler's output on a fatal signal (SIGSEGV, SIGABRT...)
    signal-R-SIG.txt faulthandler's stacks when SIGTERM or SIGHUP reached the rank (its launcher or a
                     scheduler ended it), written before the signal's own effect
    rank-R.sock      a unix socket the rank's agent thread answers on (stacks, Flight Recorder)
    world            the key of the attempt's first default world (``world_dir``)
    world-XXXXXX/    the same files, rank numbers from 0 again, for each other default world of the
                     attempt (a job that creates several: OpenRLHF's trainer beside its vLLM engines,
                     verl's worker groups on separate resource pools), with its own ``world`` key
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from enum import Enum

ENV_DIR = "PYTEST_NCCL_WATCH_DIR"        # the job's directory; its presence turns the hook on
ENV_PKG = "PYTEST_NCCL_WATCH_PKG"        # a directory pytest_nccl can be imported from
ENV_WATCHER = "PYTEST_NCCL_WATCH_PID"    # the watch process: ranks end themselves when it is gone
ENV_WATCHER_HOST = "PYTEST_NCCL_WATCH_HOST"  # ... when they run on its host (pids mean nothing elsewhere)
ENV_SEGMENT = "PYTEST_NCCL_WATCH_SEGMENT_MB"
# torchrun's, in every worker: which attempt this is (0 first), and how many restarts it allows
ENV_RESTART = "TORCHELASTIC_RESTART_COUNT"
ENV_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
DEFAULT_SEGMENT_MB = 16.0


def int_or(value, default=None):
    """``value`` as an int (from the environment or JSON), else ``default``."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default



def attempt_of(env) -> int:
    """The launcher's attempt this process belongs to (torchrun counts restarts; others: 0)."""
    return max(0, int_or(env.get(ENV_RESTART), 0))


def max_restarts_of(env) -> int:
    return max(0, int_or(env.get(ENV_MAX_RESTARTS), 0))


def attempt_dir(directory: str, attempt: int) -> str:
    return directory if attempt == 0 else os.path.join(directory, f"restart-{attempt}")


def attempts(directory: str) -> list[int]:
    """The attempts that have a directory (0 always)."""
    found = [0]
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if name.startswith("restart-"):
            n = int_or(name[8:])
            if n:
                found.append(n)
    return sorted(found)


WORLD = "world"
WORLD_PREFIX = "world-"


def _claim(path: str, key: str) -> str:
    """The key in ``path``, which this call writes when no process did before (whole or not at all:
    a reader never sees an empty claim)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(key)
    try:
        os.link(tmp, path)
        return key
    except FileExistsError:
        with open(path) as f:
            return f.read()
    finally:
        os.unlink(tmp)


def world_dir(directory: str, key: str) -> str:
    """Where a rank of the default world ``key`` (its store and size: ``worlds_rank.world_key``) writes its
    files in the attempt's ``directory``: there for the attempt's first world, else in
    ``world-XXXXXX/`` (a hash of the key), so that the ranks of two worlds never share a file."""
    if _claim(os.path.join(directory, WORLD), key) == key:
        return directory
    sub = os.path.join(directory, WORLD_PREFIX + hashlib.sha1(key.encode()).hexdigest()[:6])
    os.makedirs(sub, exist_ok=True)
    _claim(os.path.join(sub, WORLD), key)
    return sub


def other_worlds(directory: str) -> list[str]:
    """The directories of the attempt's default worlds beside its first (``world_dir``)."""
    return sorted(os.path.join(directory, n) for n in listdir(directory) if n.startswith(WORLD_PREFIX))


def world_key(directory: str) -> str:
    """The key a world's directory was claimed with ("" when unknown)."""
    try:
        with open(os.path.join(directory, WORLD)) as f:
            return f.read()
    except OSError:
        return ""


def torch_marker(directory: str, pid: int) -> str:
    return os.path.join(directory, f"torch-{pid}")


def ending(directory: str) -> str:
    """Present once the watch ends the job (its SIGTERM): the launcher folds its own report of it."""
    return os.path.join(directory, "ending")


def joining(directory: str, pid: int) -> str:
    return os.path.join(directory, f"joining-{pid}.json")


def join_failed(directory: str, pid: int) -> str:
    return os.path.join(directory, f"joinfailed-{pid}.json")


def note_join_failed(joining_path: str | None, error: str) -> None:
    """``init_process_group`` raised ``error``: the process's joining note, with it, stays as
    joinfailed-PID.json (the joining note itself goes, as after every wait)."""
    try:
        note = read_json(joining_path) if joining_path else None
        if joining_path and note is not None:
            note["error"] = error[:300]
            write_json(join_failed(os.path.dirname(joining_path), os.getpid()), note)
    except Exception:  # a note for the watch, never an error of the user's call
        pass


def listdir(directory: str) -> list[str]:
    """The names in ``directory``; none when it cannot be read (gone with its job)."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def member(directory: str, pid: int) -> str:
    return os.path.join(directory, f"member-{pid}")


def journal(directory: str, rank: int) -> str:
    return os.path.join(directory, f"journal-{rank}.txt")


def rank_info(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.json")


def exit_record(directory: str, rank: int) -> str:
    return os.path.join(directory, f"exit-{rank}.json")


def fatal(directory: str, rank: int) -> str:
    return os.path.join(directory, f"fatal-{rank}.txt")


#: the signals by which another hand ends a rank (its launcher, a scheduler, a closed terminal)
ENDING_SIGNALS = ("SIGTERM", "SIGHUP")


def ended_by(directory: str, rank: int, signal_name: str) -> str:
    """faulthandler's stacks of the rank when ``signal_name`` (SIGTERM, SIGHUP) reached it: where it
    was when its launcher (or a scheduler) ended it."""
    return os.path.join(directory, f"signal-{rank}-{signal_name}.txt")


def where_answer(directory: str) -> str:
    """The watch's last answer to "where is each rank?" (SIGUSR1), for ``pytest-nccl where``."""
    return os.path.join(directory, "where.txt")


def where_pid(directory: str) -> str:
    """The pid of the watch that answers "where is each rank?" in this directory (the command only:
    a test's follower shares pytest's pid, whose SIGUSR1 is not ours)."""
    return os.path.join(directory, "where.pid")


def socket_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.sock")


def rank_of(name: str) -> int | None:
    """The rank of a ``rank-R.json`` file name, else None."""
    if name.startswith("rank-") and name.endswith(".json"):
        try:
            return int(name[5:-5])
        except ValueError:
            return None
    return None


def segment_bytes() -> int:
    try:
        mb = float(os.environ.get(ENV_SEGMENT, DEFAULT_SEGMENT_MB))
    except ValueError:
        mb = DEFAULT_SEGMENT_MB
    return max(1 << 16, int(mb * (1 << 20)))


def touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def write_text(path: str, text: str) -> None:
    """Whole or not at all: the reader never sees half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, data: dict) -> None:
    write_text(path, json.dumps(data))


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@dataclass
class RankInfo:
    """``rank-R.json``: what a rank says of itself once its default group exists (written by
    inject.py, read by its node's watch, published as written to the other nodes' watches)."""

    rank: int = 0
    world: int = 0
    local_rank: str | None = None    # the launcher's LOCAL_RANK, as the environment has it
    pid: int | None = None
    start: int | None = None         # ``process_start(pid)``
    host: str = ""
    backend: str = ""
    t0: float = 0.0
    argv: list = field(default_factory=list)
    attempt: int = 0                 # torchrun's restart count
    max_restarts: int = 0
    local_world: str | None = None   # the launcher's LOCAL_WORLD_SIZE, as the environment has it
    node: str | None = None          # the launcher's GROUP_RANK
    master_addr: str | None = None   # the job's store (several nodes: channel.py)
    master_port: str | None = None
    run_id: str | None = None
    # a rank of a pytest-nccl session (its forked or adopted ranks, SPMD mode): that session bounds
    # and judges its collectives test by test; the watch follows its process only
    self_judged: bool = False

    @property
    def local_ranks(self) -> int | None:
        """The node's rank count (``local_world`` as a number), None when not known."""
        return int_or(self.local_world)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def decode(cls, data) -> RankInfo | None:
        """From the JSON object of the file or the channel; None when it is not an object. Keys it
        lacks keep their defaults, keys it does not know are left out; numbers written as text read."""
        return _decode(cls, data, ints=("rank", "world", "attempt", "max_restarts"), optional=("pid", "start"))


@dataclass
class JoiningNote:
    """``joining-PID.json``: a process waiting in ``init_process_group`` (``what``), for its peers
    in a launcher's rendezvous ("rendezvous": ``rank``/``world`` count nodes then), or for the other
    members of a side group ("group": ``rank``/``world`` in that group, ``group`` its name, ``store``
    its store's host:port)."""

    pid: int | None = None
    start: int | None = None         # ``process_start(pid)``
    host: str = ""
    t: float = 0.0
    rank: int | None = None
    world: int | None = None
    site: str = ""
    what: str = ""
    local_world: int | None = None
    group: str = ""
    store: str = ""
    error: str = ""                  # joinfailed-PID.json: what init_process_group raised

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def decode(cls, data) -> JoiningNote | None:
        return _decode(cls, data, ints=(), optional=("pid", "start", "rank", "world", "local_world"))


def _decode(cls, data, ints: tuple, optional: tuple):
    """The one decoder of the watch's JSON files: ``cls`` from ``data`` (a dict), ``ints`` read as
    numbers (else 0), ``optional`` as numbers or None."""
    if not isinstance(data, dict):
        return None
    known = {f.name for f in fields(cls)}
    values = {k: v for k, v in data.items() if k in known}
    for name in ints:
        if name in values:
            values[name] = int_or(values[name], 0)
    for name in optional:
        if name in values:
            values[name] = int_or(values[name])
    for name in ("host", "backend", "site", "what", "group", "store", "error"):
        if name in values and values[name] is None:
            values[name] = ""
    return cls(**values)


def read_rank_info(path: str) -> RankInfo | None:
    """A ``rank-R.json`` file; None when it is absent or not yet whole."""
    return RankInfo.decode(read_json(path))


def read_joining(path: str) -> JoiningNote | None:
    """A ``joining-PID.json`` file; None when it is gone or unreadable."""
    return JoiningNote.decode(read_json(path))


class ProcState(str, Enum):
    """A process's state in ``/proc/PID/stat`` (the field after its name), where an ended one shows."""
    ZOMBIE = "Z"
    DEAD = "X"


def process_start(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot): with the pid, it names one
    process even after the pid is reused. None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
