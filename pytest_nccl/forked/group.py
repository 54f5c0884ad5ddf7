"""One group of rank processes joined in a torch.distributed group: start it, send it a call, feed
what the ranks report to the referee, collect stacks once it decides, tear the group down.

The shape follows xdist's ``workermanage.py`` (start and watch workers); the decisions are the
referee's (``core/referee.py``), what follows them the driver's (``core/call.py``): this module and
``call.py`` only move messages and files.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import cast

from ..core.call import CallDriver
from ..core.exits import decode_wait_status, describe_wait_status
from ..core.journal import read_journal
from ..core.messages import Call, CallDone, Dump, DumpRequest, Hello, Joined, RankSpec, RunCall, SetupFailed
from ..core.referee import TIMING as RULES
from ..core.referee import Referee
from ..core.reports import CallOutcome, RankReport
from ..core.states import RankState
from ..errors import RankSetupError
from ..memcg import OomWatch
from .call import CallState, ForkedCall, file_size, journal_path, read_from
from .timing import TIMING
from .zygote_client import Zygote


def _ready(conns: list[Connection], timeout: float) -> list[Connection]:
    """``wait`` on connections: it returns some of those it was given (its stub: any waitable)."""
    return cast("list[Connection]", wait(conns, timeout=timeout))


class RankGroup:
    """N rank processes joined in one torch.distributed group."""

    _ids = itertools.count()

    def __init__(self, zygote: Zygote, world: int, backend: str, timeout: float, workdir: str,
                 gpu_ids: list | None = None, rank_env: dict | None = None,
                 device_of: Callable[[int], int | None] | None = None, own_group: bool = False):
        self.zygote, self.world, self.backend, self.timeout = zygote, world, backend, timeout
        self.key: tuple = (world, backend, timeout)  # GroupPool sets its own lookup key
        self.gid = next(self._ids)
        self.dir = tempfile.mkdtemp(prefix=f"g{self.gid}-", dir=workdir)
        self.gpu_ids = gpu_ids  # physical device ids (the leaser maps them through CUDA_VISIBLE_DEVICES)
        self.device_of = device_of  # a rank's current CUDA device when the ranks share GPUs, else None
        self.pids: dict[int, int] = {}
        self.memory: dict[int, OomWatch] = {}  # each rank's memory cgroup: an OOM kill is said as such
        self.conns: dict[int, Connection] = {}
        self.calls = itertools.count(1)
        self.healthy = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control_path = os.path.join(self.dir, "control.sock")
        self._listener.bind(self.control_path)
        self._listener.listen(world)
        self.rank_env = dict(rank_env or {})
        if gpu_ids is not None:
            self.rank_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
        self.own_group = own_group  # adopted tests: the ranks join no group of ours
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
            spec = RankSpec(rank, rank, self.world, self.world, self.backend,
                            pg_timeout=self.timeout + RULES.pg_timeout_margin,
                            store_path=os.path.join(self.dir, "store"), control_path=self.control_path,
                            output_path=self.output_path(rank), stack_path=self.stack_path(rank),
                            master_addr="127.0.0.1", master_port=master_port, env=self.rank_env,
                            run_id=f"pytest-nccl-{os.getpid()}-{self.gid}",
                            cuda_device=self.device_of(rank) if self.device_of else None,
                            own_group=self.own_group)
            self.pids[rank] = self.zygote.fork(spec)
            self.memory[rank] = OomWatch(self.pids[rank])
        hello: dict = {}
        while len(self.joined) + len(self.setup_errors) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables = [self._listener, *hello, self.zygote.conn]
            for ready in wait(waitables, timeout=min(left, TIMING.join_poll)):
                if ready is self._listener:
                    sock, _ = self._listener.accept()
                    hello[Connection(sock.detach())] = None
                elif ready is self.zygote.conn:
                    self.zygote.drain()
                elif isinstance(ready, Connection):  # a rank's, saying hello
                    try:
                        msg = ready.recv()
                    except (EOFError, OSError):
                        hello.pop(ready, None)
                        continue
                    if isinstance(msg, Hello):
                        hello[ready] = msg.rank
                        self.conns[msg.rank] = ready
                    elif isinstance(msg, Joined):
                        self.joined.add(msg.rank)
                    elif isinstance(msg, SetupFailed):
                        self.setup_errors[msg.rank] = msg.error
            if self._dead_ranks() - self.joined:
                # a rank died before joining: the others will wait for it until the bound
                time.sleep(TIMING.dead_rank_drain)
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
    def run(self, call: Call, bound: float) -> CallOutcome:
        """One call on every rank, run by the driver (``core.call``) through ``ForkedCall``."""
        call.call_id = next(self.calls)
        t0 = time.monotonic()
        referee = Referee(self.world, bound, t0, trace=call.trace, flight_recorder=True)
        state = CallState(call, self.world, t0, time.time_ns(), referee, self.conns)
        transport = ForkedCall(self, state)
        for memory in self.memory.values():
            memory.restart()
        for conn in self.conns.values():
            try:
                conn.send(RunCall(call))
            except OSError:
                pass
        for rank in range(self.world):
            if rank not in self.conns:
                state.reports[rank] = RankReport(rank, RankState.DEAD, finished_at=0.0)
                referee.finished(rank, RankState.DEAD, t0)
        return CallDriver(referee, transport).run(backend=self.backend)

    def _receive(self, conn: Connection, state: "CallState") -> None:
        """Take one message from a rank during a call; outcomes and deaths go to the call's referee,
        wherever they arrive (also while a Flight Recorder or stack request waits for answers)."""
        referee = state.referee
        rank = next(r for r, c in self.conns.items() if c is conn)
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            self.conns.pop(rank, None)
            state.reports[rank] = RankReport(rank, RankState.DEAD, finished_at=time.monotonic() - state.t0)
            referee.finished(rank, RankState.DEAD, time.monotonic())
            return
        if isinstance(msg, CallDone) and msg.report.call_id == state.call.call_id:
            report = state.reports[rank] = msg.report
            report.finished_at = time.monotonic() - state.t0
            referee.finished(rank, report.state.judged, time.monotonic())
        elif isinstance(msg, Dump):
            state.pending_dumps.discard(rank)
            if state.want_stacks and rank in state.live:
                state.stacks[rank] = msg.stacks
            if msg.fr_json:
                state.fr_json[rank] = msg.fr_json
            if msg.fr_pickle:
                state.fr_pickle[rank] = msg.fr_pickle

    def _request_dumps(self, state: "CallState", ranks: list, timeout: float, want_stacks=False) -> None:
        """Ask ranks for stacks and Flight Recorder: their reader thread answers while the main
        thread waits in a collective, and idle ranks answer too."""
        state.want_stacks = want_stacks
        state.pending_dumps = set()
        for rank in ranks:
            conn = self.conns.get(rank)
            if conn is None:
                continue
            try:
                conn.send(DumpRequest())
                state.pending_dumps.add(rank)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while state.pending_dumps and time.monotonic() < deadline:
            conns = [self.conns[r] for r in state.pending_dumps if r in self.conns]
            if not conns:
                break
            for obj in _ready(conns, timeout=max(0.0, deadline - time.monotonic())):
                self._receive(obj, state)
            state.pending_dumps &= set(self.conns)

    def _faulthandler_stacks(self, state: "CallState") -> None:
        """Where a running rank could not answer (the GIL held in C code), faulthandler writes its
        stacks on SIGUSR1."""
        silent = [r for r in state.live if not state.stacks.get(r)]
        for rank in silent:
            pid = self.pids.get(rank)
            if pid:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except OSError:
                    pass
        if silent:
            time.sleep(TIMING.faulthandler_wait)
            for rank in silent:
                state.stacks[rank] = read_from(self.stack_path(rank), 0)[-6000:]

    def _journals(self, call: Call) -> dict:
        return {r: read_journal(journal_path(call, r), r) for r in range(self.world)}

    def _fill_exit_statuses(self, reports: dict) -> None:
        dead = [r for r, rep in reports.items() if rep.state == RankState.DEAD]
        deadline = time.monotonic() + TIMING.exit_status_wait
        while dead and time.monotonic() < deadline:
            self.zygote.drain()
            if all(self.pids.get(r) in self.zygote.exits for r in dead):
                break
            time.sleep(TIMING.exit_status_poll)
        for r in dead:
            status = self.zygote.exits.get(self.pids.get(r, -1))
            if status is not None:
                reports[r].exit_code, reports[r].signal_name = decode_wait_status(status)
            if r in self.memory:
                reports[r].oom = self.memory[r].killed(reports[r].signal_name, reports[r].exit_code)

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
        deadline = time.monotonic() + TIMING.term_wait
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


def _tail(path: str, lines: int) -> str:
    text = read_from(path, max(0, file_size(path) - 4000)).strip().splitlines()
    return " | ".join(text[-lines:])[:300]
