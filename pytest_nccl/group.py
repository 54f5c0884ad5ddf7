"""Controller side: start ranks, send them a call, watch them, enforce the bound, tear them down.

The shape follows xdist's ``workermanage.py`` (start and watch workers) and ``dsession.py`` (the
loop). One ``Zygote`` (fork server) per pytest process; one live ``RankGroup`` at a time, kept warm
after a passing call and replaced after a failed one.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from . import protocol
from .diagnose import digests_agree, stuck_on_mismatch, waits_for_a_finished_rank
from .flight import merge as merge_flight_recorder
from .flight import records_from_dump
from .errors import RankSetupError
from .journal import read_journal
from .protocol import Call, Outcome
from .records import (RANK_DEAD, RANK_FAILED, RANK_NOT_STARTED, RANK_PASSED, RANK_RUNNING,
                      RANK_SKIPPED, RANK_XFAILED, RankView)

# How long the controller gives ranks once the call is decided (a rank failed, or the bound hit)
GRACE_AFTER_FAILURE = 1.0     # for the other ranks to finish or report their own error
DUMP_WAIT = 1.0               # for stuck ranks to answer a stack / Flight Recorder request
TERM_WAIT = 0.5               # between SIGTERM and SIGKILL
POLL = 0.05                   # how often a call's journals are checked for an unmatchable wait
STALL_CHECK = 0.5             # no journal grew for this long: look for a mismatched collective
FR_POLL = 1.0                 # with a rank finished, how often the Flight Recorder is consulted
SETTLE = 0.3                  # once decided, for ranks outside any collective to finish too
ZYGOTE_START_TIMEOUT = 300.0
# The process group's own timeout is the test's bound plus this margin: no 30-minute default wait,
# and our bound (which started earlier) still fires first, so the report is ours, not gloo's
# "Timed out waiting 5000ms for send operation to complete".
PG_TIMEOUT_MARGIN = 10.0  # first start imports torch and every preloaded test module


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class Zygote:
    """Client of the fork server (``zygote.py``)."""

    def __init__(self, workdir: str, preload: list, env: dict, trace: bool, rank_start: str = "auto"):
        self.workdir = workdir
        self.exits: dict[int, int] = {}  # pid -> raw wait status, as the zygote reports them
        self.imported: set = {name for name, _ in preload}
        parent_sock, child_sock = socket.socketpair()
        self.log_path = os.path.join(workdir, "zygote.log")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_nccl.zygote", str(child_sock.fileno()), str(os.getpid())],
            pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=os.environ.copy())
        log.close()
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send({"sys_path": list(sys.path), "env": env, "trace": trace,
                        "preload": list(preload), "rank_start": rank_start})
        self.info = None  # set by ready(): the fork server imports torch meanwhile
        self.cuda_initialized_by: str | None = None  # the module that made forked ranks unusable
        self.start_mode = "fork"

    def ready(self) -> "Zygote":
        """Wait until the fork server has imported torch and the preloaded modules."""
        if self.info is None:
            self.info = self._reply("ready", ZYGOTE_START_TIMEOUT)[1]
            self._note(self.info)
        return self

    def _note(self, info: dict) -> None:
        self.cuda_initialized_by = info.get("cuda_initialized_by") or self.cuda_initialized_by
        self.start_mode = info.get("start", self.start_mode)

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def _reply(self, kind: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                raise RankSetupError(f"the fork server did not answer '{kind}' within {timeout:.0f} s"
                                     f"\n{self._log_tail()}")
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                raise RankSetupError(f"the fork server exited (code {self.proc.poll()}):\n"
                                     f"{self._log_tail()}") from None
            if msg[0] == "exited":
                self.exits[msg[1]] = msg[2]
            elif msg[0] == kind:
                return msg

    def drain(self) -> None:
        """Take in exit reports that arrived while nobody asked."""
        try:
            while self.conn.poll(0):
                msg = self.conn.recv()
                if msg[0] == "exited":
                    self.exits[msg[1]] = msg[2]
        except (EOFError, OSError):
            pass

    def import_modules(self, modules: list) -> list[str]:
        todo = [(n, p) for n, p in modules if n not in self.imported]
        if not todo:
            return []
        self.conn.send(("import", todo, list(sys.path)))
        self.imported.update(n for n, _ in todo)
        info = self._reply("imported", ZYGOTE_START_TIMEOUT)[1]
        self._note(info)
        return info["failures"]

    def fork(self, spec: dict) -> int:
        self.conn.send(("fork", spec))
        return self._reply("forked", 30)[1]

    def close(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class CallResult:
    """What the controller learned from one call on every rank."""
    ranks: list[RankView]
    reason: str                # "completed" | "decided" (failure seen, others given grace) | "timeout"
    outcomes: dict = field(default_factory=dict)  # rank -> Outcome
    elapsed: float = 0.0
    bound: float = 0.0
    fr_json: dict = field(default_factory=dict)   # rank -> Flight Recorder JSON text
    fr_pickle: dict = field(default_factory=dict)  # rank -> Flight Recorder dump (fr_trace's format)
    digests_agree: bool = True  # every group's members issued the same collectives

    @property
    def all_passed(self) -> bool:
        return all(v.status == RANK_PASSED for v in self.ranks)


_STATUS = {protocol.PASSED: RANK_PASSED, protocol.FAILED: RANK_FAILED, protocol.SKIPPED: RANK_SKIPPED,
           protocol.XFAILED: RANK_XFAILED, protocol.ERROR: RANK_FAILED}


def _journal_path(call: Call, rank: int) -> str:
    return os.path.join(call.journal_dir, f"journal-{rank}.txt")


class _CallState:
    """What the controller has learned so far about one call."""

    def __init__(self, call: Call, world: int, t0: float, since_ns: int):
        self.call, self.t0, self.since_ns = call, t0, since_ns
        self.views = {r: RankView(r) for r in range(world)}
        self.outcomes: dict[int, Outcome] = {}
        self.live: dict[int, Connection] = {}
        self.fr_json: dict[int, str] = {}
        self.fr_pickle: dict[int, bytes] = {}
        self.pending_dumps: set = set()
        self.want_stacks = False


class RankGroup:
    """N rank processes joined in one torch.distributed group."""

    _ids = itertools.count()

    def __init__(self, zygote: Zygote, world: int, backend: str, timeout: float, workdir: str,
                 gpu_ids: list | None = None, rank_env: dict | None = None):
        self.zygote, self.world, self.backend, self.timeout = zygote, world, backend, timeout
        self.key = (world, backend, timeout)
        self.gid = next(self._ids)
        self.dir = tempfile.mkdtemp(prefix=f"g{self.gid}-", dir=workdir)
        self.gpu_ids = gpu_ids  # physical device ids (the leaser maps them through CUDA_VISIBLE_DEVICES)
        self.pids: dict[int, int] = {}
        self.conns: dict[int, Connection] = {}
        self.calls = itertools.count(1)
        self.healthy = False
        self.used = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control_path = os.path.join(self.dir, "control.sock")
        self._listener.bind(self.control_path)
        self._listener.listen(world)
        self.rank_env = dict(rank_env or {})
        if gpu_ids is not None:
            self.rank_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
        self.joined: set = set()
        self.setup_errors: dict[int, str] = {}

    # -- files each rank writes, readable after it died --------------------------------------
    def output_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.out")

    def stack_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.stack")

    def start(self, deadline: float) -> None:
        """Fork the ranks and wait until every one joined the process group. Raise RankSetupError
        naming the ranks that did not join, and why, at the deadline at the latest."""
        master_port = _free_loopback_port()
        for rank in range(self.world):
            spec = {"rank": rank, "local_rank": rank, "world": self.world, "local_world": self.world,
                    "backend": self.backend, "pg_timeout": self.timeout + PG_TIMEOUT_MARGIN,
                    "store_path": os.path.join(self.dir, "store"), "control_path": self.control_path,
                    "output_path": self.output_path(rank), "stack_path": self.stack_path(rank),
                    "master_addr": "127.0.0.1", "master_port": master_port, "env": self.rank_env,
                    "run_id": f"pytest-nccl-{os.getpid()}-{self.gid}"}
            self.pids[rank] = self.zygote.fork(spec)
        pending_socks: list[socket.socket] = []
        hello: dict = {}
        while len(self.joined) + len(self.setup_errors) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables = [self._listener, *pending_socks, *hello, self.zygote.conn]
            for ready in wait(waitables, timeout=min(left, 0.5)):
                if ready is self._listener:
                    sock, _ = self._listener.accept()
                    hello[Connection(sock.detach())] = None
                elif ready is self.zygote.conn:
                    self.zygote.drain()
                else:
                    try:
                        msg = ready.recv()
                    except (EOFError, OSError):
                        hello.pop(ready, None)
                        continue
                    if msg[0] == "hello":
                        hello[ready] = msg[1]
                        self.conns[msg[1]] = ready
                    elif msg[0] == "joined":
                        self.joined.add(msg[1])
                    elif msg[0] == "setup-error":
                        self.setup_errors[msg[1]] = msg[2]
            if self._dead_ranks() - self.joined:
                # a rank died before joining: the others will wait for it until the bound
                time.sleep(0.05)
                self.zygote.drain()
                break
        if len(self.joined) == self.world:
            self.healthy = True
            return
        raise RankSetupError(self._join_failure())

    def _dead_ranks(self) -> set:
        return {r for r, pid in self.pids.items() if pid in self.zygote.exits}

    def _join_failure(self) -> str:
        self.zygote.drain()
        missing = []
        for rank in range(self.world):
            if rank in self.joined:
                continue
            why = self.setup_errors.get(rank)
            if why is None:
                status = self.zygote.exits.get(self.pids.get(rank, -1))
                why = describe_wait_status(status) if status is not None else "still waiting"
            tail = _tail(self.output_path(rank), 3)
            missing.append(f"rank {rank} ({why}{'; last output: ' + tail if tail else ''})")
        return (f"{len(self.joined)}/{self.world} ranks joined the {self.backend} group; "
                f"missing: {', '.join(missing)}")

    # -- one call -----------------------------------------------------------------------------
    def run(self, call: Call, bound: float) -> CallResult:
        self.used = True
        call.call_id = next(self.calls)
        state = _CallState(call, self.world, time.monotonic(), time.time_ns())
        deadline = state.t0 + bound
        offsets = {r: _size(self.output_path(r)) for r in range(self.world)}
        for conn in self.conns.values():
            try:
                conn.send(("call", call))
            except OSError:
                pass
        state.live = dict(self.conns)
        reason = "completed"
        decided_at = None
        next_check = state.t0 + POLL
        next_stall_check, last_sizes = state.t0 + STALL_CHECK, None
        next_fr_poll = state.t0 + FR_POLL
        while state.live:
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if decided_at is not None and now >= decided_at + GRACE_AFTER_FAILURE:
                reason = "decided"
                break
            ready = wait([*state.live.values(), self.zygote.conn],
                         timeout=max(0.0, min(deadline, next_check) - now))
            for obj in ready:
                if obj is self.zygote.conn:
                    self.zygote.drain()
                elif self._receive(obj, state) and decided_at is None:
                    decided_at = time.monotonic()
            if not (state.live and call.trace and time.monotonic() >= next_check):
                continue
            next_check = time.monotonic() + POLL
            finished_some = len(state.live) < self.world
            if finished_some and waits_for_a_finished_rank(self._journals(call), state.live):
                reason = "decided"
                self._settle(state)
                break
            if time.monotonic() >= next_stall_check:
                # no journal grew for a while: are the ranks stuck on a mismatched collective?
                next_stall_check = time.monotonic() + STALL_CHECK
                sizes = [_size(_journal_path(call, r)) for r in range(self.world)]
                if sizes == last_sizes and stuck_on_mismatch(self._journals(call), state.views, state.live):
                    reason = "decided"
                    break
                last_sizes = sizes
            if finished_some and time.monotonic() >= next_fr_poll:
                # a rank finished and the others are busy where the journal cannot see: collectives
                # issued from C++ (DDP's reducer) show in the Flight Recorder
                next_fr_poll = time.monotonic() + FR_POLL
                self._request_dumps(state, list(self.conns), 0.5)
                if len(state.fr_json) == self.world and waits_for_a_finished_rank(
                        self._journals(call, state.fr_json, state.since_ns), state.live):
                    reason = "decided"
                    break
        if state.live:
            # stacks of the ranks still running; Flight Recorder of every rank that can answer
            state.fr_json.clear()
            for rank in state.live:
                state.views[rank].status = RANK_RUNNING
            self._request_dumps(state, list(self.conns), DUMP_WAIT, want_stacks=True)
            self._faulthandler_stacks(state)
            self.healthy = False
        views, outcomes = state.views, state.outcomes
        result = CallResult(ranks=[views[r] for r in range(self.world)], reason=reason,
                            outcomes=outcomes, elapsed=time.monotonic() - state.t0, bound=bound)
        if reason != "completed" or any(v.status != RANK_PASSED for v in result.ranks):
            self.healthy = False
        for rank, view in views.items():
            out = outcomes.get(rank)
            if out is not None:
                view.exc_type, view.exc_text, view.message = out.exc_type, out.exc_text, out.message
                if not out.initialized or out.dangling:
                    # the test destroyed the default group, or left collectives in flight that
                    # would pair with the next test's: start afresh next time
                    self.healthy = False
        if not self.healthy:
            self.kill()
        for rank, view in views.items():
            if _size(self.output_path(rank)) > offsets[rank]:
                view.output = _read_from(self.output_path(rank), offsets[rank])
        result.digests_agree = digests_agree({r: o.digest for r, o in outcomes.items()}, self.world)
        clean = reason == "completed" and result.all_passed and result.digests_agree
        if call.trace and not clean:
            fr = state.fr_json if len(state.fr_json) == self.world else None
            for rank, records in self._journals(call, fr, state.since_ns).items():
                views[rank].records = records
        self._fill_exit_statuses(views)
        result.fr_json, result.fr_pickle = dict(state.fr_json), dict(state.fr_pickle)
        return result

    def _settle(self, state: "_CallState") -> None:
        """The call is decided; give ranks that are outside any collective a moment to finish too,
        so the report says "ranks 1,2 left the test" rather than catching one of them mid-return."""
        deadline = time.monotonic() + SETTLE
        while state.live and time.monotonic() < deadline:
            journals = self._journals(state.call)
            if all(RankView(r, records=journals[r]).current is not None for r in state.live):
                return  # everyone still running waits in a collective: nothing more will come
            for obj in wait(list(state.live.values()), timeout=max(0.0, min(POLL, deadline - time.monotonic()))):
                self._receive(obj, state)

    def _receive(self, conn: Connection, state: "_CallState") -> bool:
        """Take one message from a rank during a call. True when it decides the call failed."""
        rank = next(r for r, c in self.conns.items() if c is conn)
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            state.live.pop(rank, None)
            self.conns.pop(rank, None)
            state.views[rank].status = RANK_DEAD
            state.views[rank].finished_at = time.monotonic() - state.t0
            return True
        if msg[0] == "outcome" and msg[1].call_id == state.call.call_id:
            out = msg[1]
            state.outcomes[rank] = out
            state.views[rank].status = _STATUS[out.status]
            state.views[rank].finished_at = time.monotonic() - state.t0
            state.live.pop(rank, None)
            return out.status in (protocol.FAILED, protocol.ERROR)
        if msg[0] == "dump":
            state.pending_dumps.discard(rank)
            if state.want_stacks and rank in state.live:
                state.views[rank].stack = msg[2]
            if msg[3]:
                state.fr_json[rank] = msg[3]
            if len(msg) > 4 and msg[4]:
                state.fr_pickle[rank] = msg[4]
        return False

    def _request_dumps(self, state: "_CallState", ranks: list, timeout: float, want_stacks=False) -> None:
        """Ask ranks for stacks and Flight Recorder: their reader thread answers while the main
        thread waits in a collective, and idle ranks answer too."""
        state.want_stacks = want_stacks
        state.pending_dumps = set()
        for rank in ranks:
            conn = self.conns.get(rank)
            if conn is None:
                continue
            try:
                conn.send(("dump",))
                state.pending_dumps.add(rank)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while state.pending_dumps and time.monotonic() < deadline:
            conns = [self.conns[r] for r in state.pending_dumps if r in self.conns]
            if not conns:
                break
            for obj in wait(conns, timeout=max(0.0, deadline - time.monotonic())):
                self._receive(obj, state)
            state.pending_dumps &= set(self.conns)

    def _faulthandler_stacks(self, state: "_CallState") -> None:
        """Where a running rank could not answer (the GIL held in C code), faulthandler writes its
        stacks on SIGUSR1."""
        silent = [r for r in state.live if not state.views[r].stack]
        for rank in silent:
            pid = self.pids.get(rank)
            if pid:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except OSError:
                    pass
        if silent:
            time.sleep(0.2)
            for rank in silent:
                state.views[rank].stack = _read_from(self.stack_path(rank), 0)[-6000:]

    def _journals(self, call: Call, fr_json: dict | None = None, since_ns: int = 0) -> dict:
        journals = {r: read_journal(_journal_path(call, r), r) for r in range(self.world)}
        if fr_json:
            dumps = {r: records_from_dump(fr_json.get(r), r, since_ns) for r in journals}
            journals = merge_flight_recorder(journals, dumps)
        return journals

    def _fill_exit_statuses(self, views: dict) -> None:
        dead = [r for r, v in views.items() if v.status == RANK_DEAD]
        deadline = time.monotonic() + 1.0
        while dead and time.monotonic() < deadline:
            self.zygote.drain()
            if all(self.pids.get(r) in self.zygote.exits for r in dead):
                break
            time.sleep(0.01)
        for r in dead:
            status = self.zygote.exits.get(self.pids.get(r, -1))
            if status is None:
                continue
            if os.WIFSIGNALED(status):
                views[r].signal_name = signal_name(os.WTERMSIG(status))
            elif os.WIFEXITED(status):
                views[r].exit_code = os.WEXITSTATUS(status)

    def health_check(self) -> bool:
        """Reuse only a group whose last call passed everywhere (run() clears ``healthy``
        otherwise: a failure, a rank that destroyed the default group or left async work
        pending), whose ranks are all alive and connected. No collective: a round trip per test
        would double the warm overhead, and a passing call already proved the group works."""
        self.zygote.drain()
        return (self.healthy and len(self.conns) == self.world
                and not any(pid in self.zygote.exits for pid in self.pids.values()))

    def kill(self) -> None:
        """SIGTERM each rank's process group, then SIGKILL whatever is left."""
        self.healthy = False
        for conn in self.conns.values():
            try:
                conn.close()
            except OSError:
                pass
        self.conns.clear()
        pids = [pid for pid in self.pids.values() if pid not in self.zygote.exits]
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_WAIT
        while pids and time.monotonic() < deadline:
            self.zygote.drain()
            pids = [pid for pid in pids if pid not in self.zygote.exits]
            if pids:
                self.zygote.conn.poll(0.01)
        for pid in self.pids.values():
            _signal_group(pid, signal.SIGKILL)  # also reaches what a rank started (its session)
        # our own files are left to the session's work directory cleanup
        try:
            self._listener.close()
        except OSError:
            pass


def describe_wait_status(status: int) -> str:
    if status < 0:
        return "exited"
    if os.WIFSIGNALED(status):
        return f"killed by {signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _free_loopback_port() -> int:
    # MASTER_PORT for code that reads it (extra groups a test creates); nothing of ours listens
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(200_000).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _tail(path: str, lines: int) -> str:
    text = _read_from(path, max(0, _size(path) - 4000)).strip().splitlines()
    return " | ".join(text[-lines:])[:300]


class GroupPool:
    """One fork server and at most one live group per pytest process."""

    def __init__(self, workdir_parent: str | None, preload: list, trace: bool, gpu_leaser=None,
                 rank_start: str = "auto"):
        # journals and outputs on tmpfs where there is one: a journal line is a syscall per collective
        if workdir_parent is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            workdir_parent = "/dev/shm"
        self.workdir = tempfile.mkdtemp(prefix="pytest-nccl-", dir=workdir_parent)
        self.preload = list(preload)
        self.trace = trace
        self.zygote: Zygote | None = None
        self.group: RankGroup | None = None
        self.gpu_leaser = gpu_leaser
        self.lease = None
        self.calls = 0
        self.rank_start = rank_start
        self.spawned_group_starts: list[float] = []  # seconds, of groups started as fresh interpreters

    def ensure_zygote(self, wait: bool = True) -> Zygote:
        """The fork server, started if needed. ``wait=False`` only starts it: the plugin does so
        right after collection, so torch is imported while pytest gets to the first test."""
        if self.zygote is None or self.zygote.proc.poll() is not None:
            env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                   "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "false"),
                   # every socket a rank opens stays on the loopback interface
                   "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                   "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo"),
                   # torch.cuda.is_available() at a test module's import asks NVML, not the CUDA
                   # driver: the fork server stays fork-safe
                   "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK", "1")}
            if self.trace:
                env.setdefault("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_FR_BUFFER_SIZE", "2000"))
            if self.group is not None:
                self.group.kill()
                self.group = None
            self.zygote = Zygote(self.workdir, self.preload, env, self.trace, self.rank_start)
        return self.zygote.ready() if wait else self.zygote

    def get(self, world: int, placement, timeout: float, deadline: float) -> RankGroup:
        """A healthy group of this shape: the warm one after a health check, else a fresh one.
        ``placement`` (settings.Placement): the backend, and whether each rank gets a GPU of its
        own (leased) or sees no CUDA at all."""
        zygote = self.ensure_zygote()
        key = (world, placement.backend, placement.gpus, timeout)
        if self.group is not None:
            if self.group.key == key and self.group.healthy:
                if self.group.health_check():
                    return self.group
            self.release()
        gpu_ids = None
        rank_env = {}
        if placement.gpus and self.gpu_leaser is not None:
            try:
                self.lease = self.gpu_leaser.acquire(world, deadline)
            except TimeoutError as exc:
                raise RankSetupError(str(exc)) from None
            gpu_ids = self.lease.ids
        elif not placement.gpus:
            rank_env["CUDA_VISIBLE_DEVICES"] = ""  # gloo without a GPU per rank: the CPU path
        self.group = RankGroup(zygote, world, placement.backend, timeout, self.workdir, gpu_ids, rank_env)
        self.group.key = key
        started = time.monotonic()
        try:
            self.group.start(deadline)
        except BaseException:
            self.release()
            raise
        if zygote.start_mode == "spawn":
            self.spawned_group_starts.append(time.monotonic() - started)
        return self.group

    def release(self) -> None:
        if self.group is not None:
            self.group.kill()
            shutil.rmtree(self.group.dir, ignore_errors=True)
            self.group = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def new_call_dir(self) -> str:
        self.calls += 1
        path = os.path.join(self.workdir, f"call{self.calls}")
        os.makedirs(path, exist_ok=True)
        return path

    def close(self) -> None:
        self.release()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        shutil.rmtree(self.workdir, ignore_errors=True)
