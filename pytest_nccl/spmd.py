"""SPMD mode: pytest itself runs under a launcher (``torchrun --nproc-per-node=4 -m pytest suites/``,
two torchrun launchers with a c10d rendezvous, or srun with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
exported): every launched process runs the same session and IS one rank. Nothing is forked.

The launcher's store (TCPStore at MASTER_ADDR:MASTER_PORT: the agent's under torchrun, else rank 0
hosts it, as ``env://`` would) carries what the plugin-mode controller learns over its sockets:

- after collection every rank publishes its test ids; a difference stops the session on every rank
  with the ranks and the first differing test named;
- the plugin creates the default process group over that store (prefix ``pg<gen>/``) in the set-up
  of the first marked test, on every rank, and creates it again under a new prefix after a failed
  test or a test that destroyed it;
- per marked test (keys ``t/<hash of nodeid>/<n>/``), from the start of its set-up (fixtures run on
  the ranks here, so the bound and the trace cover them) to the end of its body: the tracer records
  the rank's collectives; a watchdog thread appends the journal to the store; rank 0's decider thread
  applies the controller's rules (the bound; a rank failed, or finished while others wait in a
  collective it never completed; every rank stuck on a mismatch). When it decides, every rank still
  in the test publishes a snapshot (stacks of all threads, journal) taken while it is stuck; then
  every rank aborts: it shuts down its established TCP connections except those to the launcher's
  store (on gloo this releases a rank inside a collective or a TCPStore rendezvous at once; gloo's own
  ``abort()`` does not, measured on torch 2.13), calls ``_abort_process_group`` on NCCL, and
  interrupts its main thread with a signal when it runs a fixture or the body (a slow rank in
  ``time.sleep`` or a Python loop). Rank 0 diagnoses with ``diagnose()`` and publishes the verdict;
  every rank raises the same exception, rank 0 with the combined report, the others quietly;
- a rank that no abort releases (a C++ wait without a socket or a timeout) is reported as stuck,
  with its stack; the session stops after that test on every rank with rank 0's summary, and the
  stuck rank exits once rank 0 is done;
- a rank whose process dies (``os._exit``, a signal, gloo's SIGABRT on a size mismatch) ends the
  session: the launcher stops every rank, each says in one line which test it was in;
- ranks other than 0 are quiet (no terminal reporter, JUnit XML, gate report or trace dir). At the
  end rank 0 names tests that failed only on other ranks (tests without the marker run on each rank
  independently), and ranks leave together, rank 0 last, so that the launcher, which stops every rank
  when one exits with an error, never cuts rank 0's report short.

Fixtures of any kind work (they run in-process); ``rank``, ``world_size``, ``device`` and
``backend`` hold the real values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import pytest

from . import errors, protocol
from .diagnose import (Diagnosis, diagnose, digests_agree, members_of, stuck_on_mismatch,
                       waits_for_a_finished_rank)
from .settings import parse_marker
from .errors import DistributedTestFailure, NcclUsageError, RankSetupError
from .protocol import describe_exception, exit_like_os_exit
from .journal import parse_journal
from .records import (RANK_FAILED, RANK_NOT_STARTED, RANK_PASSED, RANK_RUNNING,
                      RANK_SKIPPED, RANK_XFAILED, RankView)

MODES = ("auto", "on", "off")
POLL_MAX = 0.05               # slowest store polling interval (starts at 2 ms, doubles)
JOURNAL_PUSH = 0.1            # how often a running rank appends its journal to the store
GRACE_AFTER_FAILURE = 1.0     # as group.py: for the other ranks to finish or fail on their own
STALL_CHECK = 0.5             # no journal grew for this long: look for a mismatched collective
DUMP_WAIT = 3.0               # for every rank still in the body to publish its snapshot
RELEASE_WAIT = 5.0            # after the abort, for every rank to leave the body
VERDICT_MARGIN = 30.0         # a rank gives rank 0 this long past the bound before giving up
COLLECT_WAIT = 600.0          # for the other ranks to finish collecting (imports can be slow)
FINISH_WAIT = 120.0           # at the end, for the other ranks to finish the session
GROUP_WAIT_MIN = 30.0         # for every rank to come to a (re-)created process group
PG_TIMEOUT_MARGIN = 10.0      # the process group's own timeout is the bound plus this
INTERRUPT_SIGNAL = signal.SIGUSR2
STUCK_EXIT_CODE = 1
_THREAD_PREFIX = "pytest-nccl-"
_STATUS = {protocol.PASSED: RANK_PASSED, protocol.FAILED: RANK_FAILED, protocol.SKIPPED: RANK_SKIPPED,
           protocol.XFAILED: RANK_XFAILED, protocol.ERROR: RANK_FAILED}
_HARNESS_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (pytest,) if m.__file__) + \
    tuple(os.sep + d + os.sep for d in ("_pytest", "pluggy"))
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TESTING_DIR = _PKG_DIR + "testing" + os.sep


class BoundReached(BaseException):
    """Raised in a rank's main thread when the test's bound was reached and the rank is still in
    the body outside any collective (a BaseException: ``except Exception`` in the test keeps it)."""


# -- detection ------------------------------------------------------------------------------------

@dataclass
class Launch:
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    agent_store: bool      # torchrun: the agent hosts the store, every rank is a client
    launcher: str          # "torchrun" | "srun" | "env"
    run_id: str
    attempt: int


def detect(mode: str, env=None) -> Launch | None:
    """The launch this pytest process belongs to, or None (plugin mode: the plugin forks ranks).
    auto: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are all set. on: they must be (SLURM_PROCID /
    SLURM_NTASKS stand in for RANK / WORLD_SIZE). off: never."""
    env = os.environ if env is None else env
    if mode == "off":
        return None
    rank, world = env.get("RANK"), env.get("WORLD_SIZE")
    local_rank, local_world = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
    if mode == "on" and rank is None and world is None and "SLURM_PROCID" in env:
        rank, world = env.get("SLURM_PROCID"), env.get("SLURM_NTASKS")
        local_rank = local_rank or env.get("SLURM_LOCALID")
        local_world = local_world or env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0] or None
    needed = {"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": env.get("MASTER_ADDR"),
              "MASTER_PORT": env.get("MASTER_PORT")}
    missing = [k for k, v in needed.items() if not v]
    if missing:
        if mode == "on":
            raise NcclUsageError("--nccl-spmd=on needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the "
                                 f"environment (torchrun sets them); missing: {', '.join(missing)}")
        return None
    try:
        rank_i, world_i = int(rank), int(world)
        port = int(needed["MASTER_PORT"])
        local_i = int(local_rank) if local_rank not in (None, "") else rank_i
        local_world_i = int(local_world) if local_world not in (None, "") else world_i
    except ValueError:
        raise NcclUsageError(f"SPMD mode: RANK={rank!r}, WORLD_SIZE={world!r}, MASTER_PORT="
                             f"{needed['MASTER_PORT']!r} must be whole numbers") from None
    if not 0 <= rank_i < world_i:
        raise NcclUsageError(f"SPMD mode: RANK={rank_i} is not within WORLD_SIZE={world_i}")
    if "TORCHELASTIC_RUN_ID" in env:
        launcher = "torchrun"
    elif "SLURM_JOB_ID" in env:
        launcher = "srun"
    else:
        launcher = "env"
    return Launch(rank_i, world_i, local_i, local_world_i, needed["MASTER_ADDR"], port,
                  env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true", launcher,
                  env.get("TORCHELASTIC_RUN_ID", env.get("SLURM_JOB_ID", "env")),
                  int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))


def configure(config: pytest.Config, nccl) -> "SpmdSession | None":
    """Called from the plugin's pytest_configure: SPMD mode or not; set this rank up."""
    value = config.getoption("nccl_spmd", None)
    if value is None:
        value = config.getini("nccl_spmd") or "auto"
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise pytest.UsageError(f"--nccl-spmd must be one of {', '.join(MODES)}, got {value!r}")
    if hasattr(config, "workerinput"):
        return None  # an xdist worker of a plain session
    try:
        launch = detect(mode)
    except NcclUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    if launch is None:
        return None
    if getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") not in ("no", None):
        raise pytest.UsageError("pytest-nccl SPMD mode (launched by torchrun/srun: RANK and WORLD_SIZE are "
                                "set) does not combine with pytest-xdist's -n/--dist; drop one of them")
    sp = SpmdSession(config, nccl, launch)
    config.pluginmanager.register(sp, "nccl-spmd")
    return sp


# -- the TCP connections a rank aborts ------------------------------------------------------------

def _tcp_table() -> dict:
    """socket inode -> (local port, remote port, state) for every TCP socket on this host."""
    table = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            p = line.split()
            try:
                table[int(p[9])] = (int(p[1].rsplit(":", 1)[1], 16), int(p[2].rsplit(":", 1)[1], 16), p[3])
            except (IndexError, ValueError):
                continue
    return table


def abort_connections(keep_ports: set) -> int:
    """Shut down every established TCP connection of this process except those to or from the
    ports in ``keep_ports`` (the launcher's store). A peer or this rank blocked on such a connection
    (a gloo collective, a TCPStore rendezvous) gets an error at once. Listening sockets are left
    alone (gloo aborts the process when its listener fails)."""
    table = _tcp_table()
    count = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        entry = table.get(int(target[8:-1]))
        if entry is None:
            continue
        local, remote, state = entry
        if state != "01" or local in keep_ports or remote in keep_ports:  # 01 = ESTABLISHED
            continue
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
            try:
                s.shutdown(socket.SHUT_RDWR)
                count += 1
            finally:
                s.close()
        except OSError:
            continue
    return count


# -- stacks ---------------------------------------------------------------------------------------

def _is_harness(path: str) -> bool:
    return (any(d in path for d in _HARNESS_DIRS) or path.startswith("<") or path.endswith(os.sep + "runpy.py")
            or (path.startswith(_PKG_DIR) and not path.startswith(_TESTING_DIR)))


def _user_frames(frames: list) -> list:
    """From the first frame that is not the launcher's, pytest's, pluggy's or ours: the test body,
    or the fixture being set up."""
    for i, f in enumerate(frames):
        if not _is_harness(f.filename):
            return frames[i:]
    return frames


def format_stacks() -> str:
    """Python stacks of every thread but ours, innermost last (like a traceback); the main thread
    first and cut to the test body."""
    from . import tracer
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] != main):
        name = names.get(ident, str(ident))
        if ident == threading.get_ident() or name.startswith(_THREAD_PREFIX):
            continue
        frames = traceback.extract_stack(frame)
        if ident == main:
            frames = _user_frames(frames)
        frames = [f for f in frames if f.filename != tracer.__file__]
        parts.append(f"Thread {name}:\n" + "".join(traceback.format_list(frames)))
    return "\n".join(parts)


def _format_exception(exc: BaseException) -> str:
    frames = _user_frames(traceback.extract_tb(exc.__traceback__))
    from . import tracer
    frames = [f for f in frames if f.filename not in (tracer.__file__, __file__)]
    return "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames),
                    *traceback.format_exception_only(type(exc), exc)])


def _strip_harness_sites(records) -> list:
    """Call sites end at the test body: drop pytest's and pluggy's frames above it."""
    for rec in records:
        if rec.site:
            rec.site = " <- ".join(s for s in rec.site.split(" <- ") if not any(d in s for d in _HARNESS_DIRS))
    return records


def _records(text: str, rank: int) -> list:
    return _strip_harness_sites(parse_journal(text or "", rank))


def _sleeper():
    """Polling intervals: 2 ms, doubling up to POLL_MAX."""
    interval = 0.002
    while True:
        yield interval
        interval = min(POLL_MAX, interval * 2)


def _read(path: str, offset: int = 0) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


# -- one marked test on this rank -----------------------------------------------------------------

class _TestRun:
    """One marked test on this rank: its store keys, the watchdog thread, and on rank 0 the decider."""

    def __init__(self, sp: "SpmdSession", nodeid: str, key: str, bound: float):
        self.sp, self.nodeid, self.key, self.bound = sp, nodeid, key, bound
        self.rank, self.world = sp.launch.rank, sp.launch.world
        # the journal lives in memory (memfd): nothing is left behind by a rank that dies or is stuck
        self.journal_fd = os.memfd_create(f"pytest-nccl-journal-{self.rank}")
        self.journal_path = f"/proc/self/fd/{self.journal_fd}"
        self.running = False                   # in the test's set-up or body on this rank
        self.user_depth = 0                    # > 0 while a fixture or the body runs (may be interrupted)
        self.tracing = False
        self.interrupt = False
        self.finished = threading.Event()      # the main thread has the verdict
        self.t0_wall = time.time()
        self.result = None                     # rank 0: (CallResult, Diagnosis | None, report)
        self.threads: list[threading.Thread] = []

    def k(self, name: str) -> str:
        return f"{self.key}/{name}"

    def start(self, decider: bool = True) -> None:
        self.t0_wall = time.time()
        self.sp.store.set(self.k(f"start/{self.rank}"), repr(self.t0_wall))
        watch = threading.Thread(target=self._guard, args=(self._watch,), name=_THREAD_PREFIX + "watchdog",
                                 daemon=True)
        self.threads.append(watch)
        if self.rank == 0 and decider:
            self.threads.append(threading.Thread(target=self._guard, args=(self._decide,),
                                                 name=_THREAD_PREFIX + "decider", daemon=True))
        for t in self.threads:
            t.start()

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException:  # never let a harness thread die silently: rank 0 must publish a verdict
            text = traceback.format_exc()
            self.sp.debug(f"{threading.current_thread().name} failed:\n{text}")
            if fn == self._decide:
                try:
                    self.sp.dstore.set(self.k("verdict"), pickle.dumps(
                        {"status": "failed", "kind": "setup", "exception": "RankSetupError",
                         "headline": f"pytest-nccl: rank 0's decider failed: {text.strip().splitlines()[-1]}",
                         "stuck": [], "stop": None, "recreate": True}))
                except Exception:
                    pass

    # -- every rank: push the journal, snapshot and abort on request -------------------------------
    def _watch(self) -> None:
        store = self.sp.wstore
        pushed = 0
        snapped = aborted = False
        next_push = 0.0
        verdict_seen = False
        while not self.finished.is_set():
            now = time.monotonic()
            if now >= next_push:
                next_push = now + JOURNAL_PUSH
                data = _read(self.journal_path, pushed)
                if data:
                    # whole lines only: the decider parses what it has
                    cut = data.rfind(b"\n") + 1
                    if cut:
                        store.append(self.k(f"journal/{self.rank}"), data[:cut])
                        pushed += cut
                        store.set(self.k(f"jlen/{self.rank}"), str(pushed))
            if not snapped and store.check([self.k("decision")]):
                snapped = True
                snap = b"-"
                if self.running:
                    snap = pickle.dumps({"stack": format_stacks(),
                                         "journal": _read(self.journal_path).decode("utf-8", "replace")})
                store.set(self.k(f"snap/{self.rank}"), snap)
            if snapped and not aborted and store.check([self.k("abort")]):
                aborted = True
                self.sp.abort(self)
            if aborted and not verdict_seen and store.check([self.k("verdict")]):
                verdict_seen = True
                verdict = pickle.loads(store.get(self.k("verdict")))
                if self.rank in verdict.get("stuck", []) and not self.finished.is_set():
                    self.sp.abandon(self, verdict)  # does not return while the main thread is stuck
            self.finished.wait(0.02 if not snapped else 0.05)

    # -- rank 0: decide, gather, diagnose, publish the verdict --------------------------------------
    def _decide(self) -> None:
        store, world = self.sp.dstore, self.world
        t0 = time.monotonic()
        deadline = t0 + self.bound
        outs: dict[int, dict] = {}
        decided_at = None
        reason = "completed"
        next_check = t0 + POLL_MAX
        next_stall, last_sizes = t0 + STALL_CHECK, None
        trace = self.sp.nccl.trace
        naps = _sleeper()
        while True:
            for r in range(world):
                if r not in outs and store.check([self.k(f"out/{r}")]):
                    outs[r] = pickle.loads(store.get(self.k(f"out/{r}")))
                    if outs[r]["status"] in (protocol.FAILED, protocol.ERROR):
                        decided_at = decided_at or time.monotonic()
            now = time.monotonic()
            if len(outs) == world:
                break
            if now >= deadline:
                reason = "timeout"
                break
            if decided_at is not None and now >= decided_at + GRACE_AFTER_FAILURE:
                reason = "decided"
                break
            if trace and now >= next_check:
                next_check = now + 2 * POLL_MAX
                live = {r: None for r in range(world) if r not in outs}
                if outs:
                    if waits_for_a_finished_rank(self._journals(outs), live):
                        reason = "decided"
                        break
                if now >= next_stall:
                    # no journal grew for a while: are the ranks stuck on a mismatched collective?
                    next_stall = now + STALL_CHECK
                    sizes = [self._journal_length(r, outs) for r in range(world)]
                    if sizes == last_sizes:
                        journals = self._journals(outs)
                        views = {r: RankView(r, status=_STATUS[outs[r]["status"]] if r in outs else RANK_RUNNING)
                                 for r in range(world)}
                        if stuck_on_mismatch(journals, views, live):
                            reason = "decided"
                            break
                    last_sizes = sizes
            time.sleep(min(next(naps), max(0.0, deadline - now)))
        live = [r for r in range(world) if r not in outs]
        snaps: dict[int, dict] = {}
        stuck: list[int] = []
        if live:
            store.set(self.k("decision"), reason)
            until = time.monotonic() + DUMP_WAIT
            waiting = set(live)
            naps = _sleeper()
            while waiting and time.monotonic() < until:
                for r in sorted(waiting):
                    if store.check([self.k(f"snap/{r}")]):
                        raw = store.get(self.k(f"snap/{r}"))
                        if raw != b"-":
                            snaps[r] = pickle.loads(raw)
                        waiting.discard(r)
                time.sleep(next(naps))
            store.set(self.k("abort"), "1")
            until = time.monotonic() + RELEASE_WAIT
            naps = _sleeper()
            while time.monotonic() < until:
                for r in live:
                    if r not in outs and store.check([self.k(f"out/{r}")]):
                        outs[r] = pickle.loads(store.get(self.k(f"out/{r}")))
                if all(r in outs for r in live):
                    break
                time.sleep(next(naps))
            stuck = [r for r in live if r not in outs]
        elapsed = time.monotonic() - t0
        self._conclude(outs, snaps, live, stuck, reason, elapsed)

    def _journal_length(self, r: int, outs: dict) -> int:
        if r in outs:
            return len(outs[r]["journal"]) + 1
        store = self.sp.dstore
        return int(store.get(self.k(f"jlen/{r}"))) if store.check([self.k(f"jlen/{r}")]) else 0

    def _journals(self, outs: dict) -> dict:
        """Every rank's records so far: from its outcome, else from what its watchdog appended
        (read again only when it grew)."""
        store = self.sp.dstore
        cache = self.__dict__.setdefault("_journal_cache", {})
        journals = {}
        for r in range(self.world):
            length = self._journal_length(r, outs)
            if cache.get(r, (None,))[0] != length:
                if r in outs:
                    text = outs[r]["journal"]
                elif length:
                    text = store.get(self.k(f"journal/{r}")).decode("utf-8", "replace")
                else:
                    text = ""
                cache[r] = (length, _records(text, r))
            journals[r] = cache[r][1]
        return journals

    def _views(self, outs, snaps, live) -> list[RankView]:
        store = self.sp.dstore
        views = []
        for r in range(self.world):
            view = RankView(r)
            out = outs.get(r)
            snap = snaps.get(r)
            if snap is not None:
                view.status = RANK_RUNNING
                view.stack = snap["stack"]
                view.records = _records(snap["journal"], r)
            elif out is not None:
                view.status = _STATUS[out["status"]]
                view.records = _records(out["journal"], r)
                view.finished_at = max(0.0, out["t_end"] - self.t0_wall)
                view.exc_type, view.exc_text, view.message = out["exc_type"], out["exc_text"], out["message"]
            else:
                started = store.check([self.k(f"start/{r}")])
                view.status = RANK_RUNNING if started else RANK_NOT_STARTED
                if store.check([self.k(f"journal/{r}")]):
                    view.records = _records(store.get(self.k(f"journal/{r}")).decode("utf-8", "replace"), r)
                view.message = "" if started else "never started this test (still in an earlier one, or exited)"
            if out is not None:
                view.output = out.get("output", "")
            views.append(view)
        return views

    def _conclude(self, outs, snaps, live, stuck, reason, elapsed) -> None:
        from .group import CallResult
        views = self._views(outs, snaps, live)
        statuses = {v.status for v in views}
        clean = reason == "completed" and statuses <= {RANK_PASSED, RANK_SKIPPED, RANK_XFAILED} \
            and len(statuses) == 1 and (not self.sp.nccl.trace
                                        or digests_agree({r: o.get("digest", {}) for r, o in outs.items()}, self.world))
        result = CallResult(ranks=views, reason=reason, outcomes=outs, elapsed=elapsed, bound=self.bound)
        recreate = any(not o.get("initialized", True) for o in outs.values())
        if clean:
            status = {RANK_PASSED: "passed", RANK_SKIPPED: "skipped", RANK_XFAILED: "xfailed"}[statuses.pop()]
            verdict = {"status": status, "message": views[0].message, "stuck": [], "stop": None,
                       "recreate": recreate}
            self.result = (result, None, "")
        else:
            for r in stuck:
                views[r].message = "could not be released from the test after the bound"
            diag = diagnose(views, reason, self.bound)
            if diag is None:
                diag = Diagnosis("rank-raised", "the ranks disagree on the outcome: "
                                 + ", ".join(f"rank {v.rank} {v.status}" for v in views))
            from .report import format_report
            report = format_report(views, diag, elapsed, self.bound, self.sp.backend)
            stop = None
            if stuck:
                where = "; ".join(f"rank {r} at {_top(views[r].stack) or 'unknown'}" for r in stuck)
                stop = (f"pytest-nccl: {'ranks' if len(stuck) > 1 else 'rank'} {','.join(map(str, stuck))} "
                        f"could not be released from {self.nodeid} within {RELEASE_WAIT:g} s after its "
                        f"bound (stuck outside Python: {where}); the session stops here")
                report += "\n\n" + stop
            verdict = {"status": "failed", "kind": diag.kind, "headline": diag.headline,
                       "exception": diag.exception_name, "stuck": stuck, "stop": stop, "recreate": True}
            self.result = (result, diag, report)
        self.sp.dstore.set(self.k("verdict"), pickle.dumps(verdict))

    # -- main thread ---------------------------------------------------------------------------------
    def wait_verdict(self) -> dict:
        store = self.sp.store
        limit = self.bound + DUMP_WAIT + RELEASE_WAIT + VERDICT_MARGIN
        until = time.monotonic() + limit
        naps = _sleeper()
        while True:
            if store.check([self.k("verdict")]):
                return pickle.loads(store.get(self.k("verdict")))
            if time.monotonic() >= until:
                return {"status": "failed", "kind": "setup", "exception": "RankSetupError",
                        "headline": f"pytest-nccl: rank {self.rank} got no verdict from rank 0 for "
                                    f"{self.nodeid} within {limit:.0f} s",
                        "stuck": [], "stop": "pytest-nccl: rank 0 does not answer; the session stops",
                        "recreate": True}
            time.sleep(next(naps))

    def close(self) -> None:
        self.finished.set()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=RELEASE_WAIT + DUMP_WAIT + 2)


def _top(stack: str) -> str:
    from .diagnose import _stack_top
    return _stack_top(stack or "")


# -- the session on this rank ---------------------------------------------------------------------

class SpmdSession:
    """Per launched pytest process: the store, the process group, the per-test protocol. Registered
    as a plugin object named ``nccl-spmd``."""

    def __init__(self, config: pytest.Config, nccl, launch: Launch):
        self.config, self.nccl, self.launch = config, nccl, launch
        self.rank, self.world = launch.rank, launch.world
        self.backend, self.backend_why = self._choose_backend()
        self.store = self.wstore = self.dstore = None
        self._base = None                      # the main thread's TCPStore client (under self.store)
        self.gen = 0                           # process group generation: its store prefix pg<gen>/
        self.need_group = True                 # (re)create the default group at the next marked test
        self.pg_timeout = 0.0
        self.run: _TestRun | None = None       # the marked test in progress on this rank
        self.last_run: _TestRun | None = None
        self.last_nodeid: str | None = None
        self.counts: dict[str, int] = {}
        self.collected = False
        self.done_published = False
        self.finishing = False                 # the session is over here: SIGTERM is ignored
        self.sigterm_seen = False
        self.failed_here: list[str] = []       # unmarked tests that failed on this rank
        self.elsewhere: dict[str, list[int]] = {}  # rank 0: nodeid -> ranks where only they failed
        self.debug_on = os.environ.get("PYTEST_NCCL_DEBUG", "") not in ("", "0")
        self._err_fd = os.dup(2)               # the real stderr, also while pytest captures
        if nccl.trace:
            from . import tracer
            tracer.install()  # before the test modules bind the collectives
        if self.rank != 0:
            self._quiet()
        self._install_signal()

    def _choose_backend(self) -> tuple[str, str]:
        """Like plugin mode's auto: NCCL when this node has a CUDA device for every local rank."""
        from .settings import place
        try:
            p = place(self.nccl.requested_backend, self.launch.local_world, self.nccl.devices())
            return p.backend, p.why
        except NcclUsageError as exc:
            raise pytest.UsageError(f"pytest-nccl SPMD mode: {exc}") from None

    def _quiet(self) -> None:
        """Ranks other than 0 show nothing: rank 0 reports for every rank. No terminal reporter (the
        name is blocked before pytest registers it), JUnit XML, gate report or trace dir."""
        config = self.config
        config.pluginmanager.set_blocked("terminalreporter")
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # registered already (another plugin order)
            config.pluginmanager.unregister(reporter)
            config.pluginmanager.set_blocked("terminalreporter")
        for name in ("xmlpath", "nccl_report"):
            if hasattr(config.option, name):
                setattr(config.option, name, None)
        self.nccl.settings = dataclasses.replace(self.nccl.settings, trace_dir=None, report=None)
        try:
            from _pytest.junitxml import xml_key
            xml = config.stash.get(xml_key, None)
            if xml is not None:
                del config.stash[xml_key]
                config.pluginmanager.unregister(xml)
        except Exception:
            pass

    def _install_signal(self) -> None:
        try:
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            signal.signal(INTERRUPT_SIGNAL, self._on_interrupt)
        except ValueError:  # not the main thread
            pass

    def _on_sigterm(self, signum, frame):
        """The launcher stops every rank when one exits with an error (or died): say in one line
        which test this rank was in, then go. Once the session is over here, ignore it: this rank
        leaves on its own, with its own exit code."""
        self.sigterm_seen = True
        if self.finishing:
            return
        run = self.run
        if run is not None:
            where = f"during {run.nodeid}"
            try:
                left = [r for r in range(self.world) if not self.store.check([run.k(f"out/{r}")])]
                where += (" (another rank's process ended, or the job was cancelled); ranks that had not "
                          f"finished it: {','.join(map(str, left)) or 'none'}")
            except Exception:
                where += " (another rank's process ended, or the job was cancelled)"
        elif self.last_nodeid is not None:
            where = f"after {self.last_nodeid}"
        else:
            where = "before its first distributed test"
        try:
            capman = self.config.pluginmanager.get_plugin("capturemanager")
            if capman is not None:
                capman.suspend_global_capture(in_=True)
        except Exception:
            pass
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        self.say(f"the launcher stopped this rank (SIGTERM) {where}")
        os._exit(128 + signum)

    def _on_interrupt(self, signum, frame):
        """INTERRUPT_SIGNAL: the bound was reached and the decider aborted the test. Raise in the main
        thread only while a fixture or the body runs (elsewhere pytest would see an INTERNALERROR)."""
        run = self.run
        if run is None or not run.interrupt or run.user_depth <= 0 or not run.running:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        run.interrupt = False  # once: the test may go on to clean up
        run.bound_reached = True
        raise BoundReached(f"pytest-nccl: the test's {run.bound:g} s bound was reached on rank {self.rank} "
                           "(it was interrupted outside any collective)")

    @contextlib.contextmanager
    def _user_code(self, run: _TestRun):
        """Marks fixture set-up and the body: the only places the interrupt signal may raise."""
        if getattr(run, "bound_reached", False) or run.interrupt:
            run.interrupt = False
            raise BoundReached(f"pytest-nccl: the test's {run.bound:g} s bound was reached on rank {self.rank}")
        run.user_depth += 1
        try:
            yield
        finally:
            run.user_depth -= 1

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        run = self.run
        if run is None or not run.running:
            return (yield)
        with self._user_code(run):
            return (yield)

    def debug(self, text: str) -> None:
        if self.debug_on:
            self._write(f"[pytest-nccl rank {self.rank} debug] {text}")

    def say(self, text: str) -> None:
        self._write(f"[pytest-nccl rank {self.rank}] {text}")

    def _write(self, line: str) -> None:
        try:
            os.write(self._err_fd, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def fixture_value(self, name: str):
        """The rank-side fixtures, with their real values: this process is the rank."""
        if name == "rank":
            return self.rank
        if name == "world_size":
            return self.world
        if name == "backend":
            return self.backend
        if name == "device":
            import torch
            if self.backend == "nccl":
                return torch.device("cuda", self.launch.local_rank)
            return torch.device("cpu")
        raise KeyError(name)

    def header(self) -> str:
        l = self.launch
        return (f"nccl: SPMD mode: rank {l.rank} of {l.world} launched by {l.launcher}, backend {self.backend} "
                f"({self.backend_why}), timeout {self.nccl.timeout:g} s, trace {'on' if self.nccl.trace else 'off'}")

    def connect(self) -> None:
        """The launcher's store: torchrun's agent hosts it (every rank is a client); without an agent
        rank 0 hosts it, as ``env://`` would. One client per thread that waits on it."""
        import torch.distributed as dist
        l = self.launch
        timeout = datetime.timedelta(seconds=COLLECT_WAIT)
        host = l.rank == 0 and not l.agent_store

        def client(master: bool = False):
            return dist.TCPStore(l.master_addr, l.master_port, l.world, master, timeout=timeout,
                                 wait_for_workers=False)

        try:
            self._base = client(host)
            prefix = f"pytest-nccl/{l.run_id}/{l.attempt}/"
            self.store = dist.PrefixStore(prefix, self._base)
            self.wstore = dist.PrefixStore(prefix, client())
            self.dstore = dist.PrefixStore(prefix, client()) if l.rank == 0 else None
        except Exception as exc:
            self.store = self.wstore = self.dstore = None
            raise pytest.UsageError(f"pytest-nccl SPMD mode: rank {l.rank} cannot reach the launcher's store at "
                                    f"{l.master_addr}:{l.master_port}: {type(exc).__name__}: {exc}") from None

    def pytest_sessionstart(self, session) -> None:
        self.connect()
        self.debug(f"connected to {self.launch.master_addr}:{self.launch.master_port} ({self.launch.launcher})")

    def pytest_collection_finish(self, session) -> None:
        """Every rank must run the same tests in the same order: publish this rank's test ids, compare;
        a difference stops the session on every rank (exit code 4, a usage error)."""
        if self.store is None:
            return
        ids = [item.nodeid for item in session.items]
        self.store_safe_set(f"collect/{self.rank}", json.dumps({"ids": ids, "errors": session.testsfailed}))
        self.collected = True
        lists: dict[int, dict] = {}
        gone: list[int] = []
        waiting = set(range(self.world))
        until = time.monotonic() + COLLECT_WAIT
        naps = _sleeper()
        while waiting and time.monotonic() < until:
            for r in sorted(waiting):
                if self.store.check([f"collect/{r}"]):
                    data = json.loads(self.store.get(f"collect/{r}"))
                    if data.get("gone"):
                        gone.append(r)
                    else:
                        lists[r] = data
                    waiting.discard(r)
            if waiting:
                time.sleep(next(naps))
        message = collection_difference(lists, self.world, sorted(gone))
        if message:
            if self.rank != 0:
                self.say(message)
            pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)

    def pytest_runtest_setup(self, item):
        """A marked test starts here, before its fixtures: the group exists, the trace and the bound
        cover the set-up."""
        if item.get_closest_marker("nccl") is None or not isinstance(item, pytest.Function):
            return
        try:
            reason = self._runs_here(item)
            bound = _bound_of(item)
        except NcclUsageError:
            return  # the plugin's pytest_pyfunc_call reports it, on every rank alike
        if reason:
            raise pytest.skip.Exception(reason, _use_item_location=True)
        self.ensure_group(bound)
        self._begin(item, bound)

    def _runs_here(self, item) -> str | None:
        """Why this test cannot run on the launched group (its world or backend differ), or None."""
        args = parse_marker(item)
        if args.world is not None:
            world = args.world
            if world != self.world:
                return (f"pytest-nccl: {item.name} needs world {world}; the launched group has {self.world} "
                        f"rank{'s' if self.world != 1 else ''}")
        if args.backend is not None:
            backend = args.backend
            if backend != "auto" and backend != self.backend:
                return f"pytest-nccl: {item.name} needs backend {backend}; the launched group runs {self.backend}"
        return None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        run = self.run
        if run is not None and run.running and run.nodeid == item.nodeid and call.when in ("setup", "call"):
            if not (call.when == "setup" and rep.passed):
                # this rank will not run the body (its set-up failed or skipped): it still takes part
                self._join_without_body(item, rep, call)
        return rep

    def _setup_failure_report(self, item, rep, verdict: dict) -> None:
        """The report of a rank that did not run the body, from the verdict: rank 0's carries the
        combined report, the others' stays quiet."""
        if verdict["status"] != "failed":
            return
        if verdict.get("stop"):
            item.session.shouldstop = verdict["stop"]
        rep.outcome = "failed"
        run = self.last_run
        if self.rank != 0 or run is None or run.result is None or run.result[1] is None:
            rep.longrepr = verdict["headline"] if self.rank != 0 else f"pytest-nccl: {verdict['headline']}"
            return
        from .plugin import NcclLongRepr
        result, diag, report = run.result
        props = self._record_failure(item, result, diag, verdict)
        rep.user_properties.extend(props)
        rep.longrepr = NcclLongRepr(diag.headline, report, str(item.path), (item.location[1] or 0) + 1)
        for view in result.ranks:
            if view.output.strip():
                rep.sections.append((f"Captured output rank {view.rank}", view.output))

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and "nccl" not in report.keywords and report.nodeid not in self.failed_here:
            self.failed_here.append(report.nodeid)
        if report.when == "teardown":
            self.last_nodeid = report.nodeid

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        """Publish what failed here; rank 0 waits for every rank to finish, to name in its summary the
        tests that failed only on other ranks."""
        if self.store is None:
            return
        self.finishing = True
        self._publish_done()
        if self.rank != 0:
            return
        done = self._wait_others_done(FINISH_WAIT)
        mine = set(self.failed_here)
        for r, failed in sorted(done.items()):
            for nodeid in failed:
                if nodeid not in mine:
                    self.elsewhere.setdefault(nodeid, []).append(r)
        if self.elsewhere and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _publish_done(self) -> None:
        if not self.done_published:
            self.done_published = True
            self.store_safe_set(f"end/done/{self.rank}", json.dumps(self.failed_here))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        """Rank 0 names the tests that failed only on other ranks (unmarked tests run on every rank
        on their own; only rank 0 reports)."""
        if self.rank != 0 or not self.elsewhere:
            return
        terminalreporter.write_sep("=", "pytest-nccl: failed on other ranks only", red=True, bold=True)
        for nodeid, ranks in self.elsewhere.items():
            terminalreporter.write_line(f"FAILED {nodeid} on {'ranks' if len(ranks) > 1 else 'rank'} "
                                        f"{','.join(map(str, ranks))} (their output is not shown: run that "
                                        "test on its own to see it)")

    def pytest_unconfigure(self, config) -> None:
        """Ranks leave together, rank 0 last: the others wait until rank 0 has written its report
        (the launcher stops every rank when one exits with an error), rank 0 until they have left.
        SIGTERM from the launcher is ignored from here on, so that every rank's exit code is its own."""
        self.finishing = True
        try:
            # ignored in C: Python's own handlers are reset while the interpreter shuts down
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except ValueError:
            pass
        if self.store is None:
            return
        if not self.collected:
            self.store_safe_set(f"collect/{self.rank}", json.dumps({"gone": True}))
            self.collected = True
        self._publish_done()
        if self.rank == 0:
            self.store_safe_set("end/bye", "1")
            waiting = set(range(1, self.world))
            until = time.monotonic() + FINISH_WAIT
            naps = _sleeper()
            while waiting and time.monotonic() < until:
                try:
                    waiting = {r for r in waiting if not self.store.check([f"end/left/{r}"])}
                except Exception:
                    break  # the store is gone (its host left): nobody to wait for
                if waiting:
                    time.sleep(next(naps))
        else:
            until = time.monotonic() + FINISH_WAIT
            naps = _sleeper()
            while time.monotonic() < until:
                try:
                    if self.store.check(["end/bye"]):
                        break
                except Exception:
                    break
                time.sleep(next(naps))
            self.store_safe_set(f"end/left/{self.rank}", "1")
        if not self.need_group:
            try:
                import torch.distributed as dist
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass

    def _wait_others_done(self, limit: float, store=None) -> dict:
        """rank -> the unmarked tests that failed there, for every rank that finished within ``limit``."""
        store = store or self.store
        done: dict[int, list] = {}
        until = time.monotonic() + limit
        naps = _sleeper()
        while len(done) < self.world and time.monotonic() < until:
            for r in range(self.world):
                try:
                    if r not in done and store.check([f"end/done/{r}"]):
                        done[r] = json.loads(store.get(f"end/done/{r}"))
                except Exception:
                    return done
            if len(done) < self.world:
                time.sleep(next(naps))
        return done

    def ensure_group(self, bound: float) -> None:
        """The default process group, over the launcher's store (prefix ``pg<gen>/``), with the bound
        plus a margin as its timeout (so our bound fires first); created again after a failed test,
        after a test that destroyed it, or when a test needs a longer timeout. Every rank decides alike
        (the verdicts and bounds are the same everywhere), so they meet under the same prefix."""
        import torch
        import torch.distributed as dist
        want = bound + PG_TIMEOUT_MARGIN
        initialized = dist.is_initialized()
        if initialized and not self.need_group and self.pg_timeout >= want:
            return
        if initialized:
            try:
                dist.destroy_process_group()
            except Exception as exc:
                self.debug(f"destroy_process_group: {type(exc).__name__}: {exc}")
        self.gen += 1
        store = dist.PrefixStore(f"pg{self.gen}/", self.store)
        kwargs = {}
        if self.backend == "nccl":
            torch.cuda.set_device(self.launch.local_rank)
            kwargs["device_id"] = torch.device("cuda", self.launch.local_rank)
        t0 = time.monotonic()
        try:
            self._base.set_timeout(datetime.timedelta(seconds=max(GROUP_WAIT_MIN, bound)))
            dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world,
                                    timeout=datetime.timedelta(seconds=want), **kwargs)
        except Exception as exc:
            self.need_group = True
            raise RankSetupError(f"pytest-nccl: rank {self.rank} could not create the {self.backend} process group "
                                 f"(generation {self.gen}): {type(exc).__name__}: {exc}") from None
        finally:
            try:
                self._base.set_timeout(datetime.timedelta(seconds=COLLECT_WAIT))
            except Exception:
                pass
        self.need_group = False
        self.pg_timeout = want
        self.debug(f"process group pg{self.gen}/ ({self.backend}, timeout {want:g} s) in "
                   f"{time.monotonic() - t0:.2f} s")

    def abort(self, run: _TestRun) -> None:
        """Release this rank from the test: shut down its established TCP connections except those
        to the launcher's store (gloo collectives, TCPStore rendezvous), abort NCCL's communicators,
        interrupt the main thread when it runs a fixture or the body."""
        count = abort_connections({self.launch.master_port})
        self.debug(f"abort {run.nodeid}: shut down {count} connections")
        if self.backend == "nccl":
            try:
                from torch.distributed.distributed_c10d import _abort_process_group
                _abort_process_group()
            except Exception as exc:
                self.debug(f"_abort_process_group: {type(exc).__name__}: {exc}")
        if run.running:
            run.interrupt = True
            if run.user_depth > 0:
                try:
                    signal.pthread_kill(threading.main_thread().ident, INTERRUPT_SIGNAL)
                except (OSError, ValueError):
                    pass

    def abandon(self, run: _TestRun, verdict: dict) -> None:
        """This rank's main thread could not be released (a C++ wait without a socket or a timeout):
        the session stops after this test on every rank. Leave once rank 0 is done with its report."""
        self.say(f"could not be released from {run.nodeid} within {RELEASE_WAIT:g} s after its bound; this "
                 "rank leaves once rank 0 has written its report")
        store = self.wstore
        self.finishing = True
        self.done_published = True
        try:
            store.set(f"end/done/{self.rank}", json.dumps(self.failed_here))
        except Exception:
            pass
        until = time.monotonic() + FINISH_WAIT + VERDICT_MARGIN
        naps = _sleeper()
        while time.monotonic() < until:
            try:
                if store.check(["end/bye"]):
                    break
            except Exception:
                break
            if run.finished.is_set():
                return  # the main thread came back after all
            time.sleep(next(naps))
        try:
            store.set(f"end/left/{self.rank}", "1")
        except Exception:
            pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(STUCK_EXIT_CODE)

    def store_safe_set(self, key: str, value) -> None:
        try:
            self.store.set(key, value)
        except Exception as exc:
            self.debug(f"store set {key}: {type(exc).__name__}: {exc}")

    def _key(self, nodeid: str) -> str:
        n = self.counts[nodeid] = self.counts.get(nodeid, 0) + 1
        digest = hashlib.sha1(nodeid.encode("utf-8", "replace")).hexdigest()[:16]
        return f"t/{digest}/{n}"

    def _begin(self, item, bound: float) -> None:
        run = _TestRun(self, item.nodeid, self._key(item.nodeid), bound)
        run.bound_reached = False
        run.running = True
        if self.nccl.trace:
            from . import tracer
            tracer.start(run.journal_path)
            run.tracing = True
        self.run = run
        self.last_run = run
        try:
            run.start()
        except Exception:
            self._end_trace(run)
            run.running = False
            self.run = None
            run.close()
            raise

    def _end_trace(self, run: _TestRun) -> tuple[dict, int]:
        if not run.tracing:
            return {}, 0
        run.tracing = False
        from . import tracer
        try:
            return tracer.stop()
        except Exception as exc:
            self.debug(f"tracer.stop: {type(exc).__name__}: {exc}")
            return {}, 0

    def _end(self, run: _TestRun, outcome: dict) -> dict:
        """This rank is done with the test: publish its outcome, wait for rank 0's verdict."""
        import torch.distributed as dist
        run.running = False
        digest, dangling = self._end_trace(run)
        outcome.update(digest=digest, dangling=dangling, t_end=time.time(),
                       journal=_read(run.journal_path).decode("utf-8", "replace"),
                       initialized=dist.is_initialized())
        outcome.setdefault("output", "")
        self.store_safe_set(run.k(f"out/{self.rank}"), pickle.dumps(outcome))
        verdict = run.wait_verdict()
        run.close()
        try:
            os.close(run.journal_fd)
        except OSError:
            pass
        self.run = None
        if verdict.get("recreate") or verdict.get("status") == "failed" or dangling:
            self.need_group = True
        return verdict

    def run_test(self, item: pytest.Function) -> bool:
        """The body of a marked test on this rank (from the plugin's pytest_pyfunc_call)."""
        __tracebackhide__ = True
        from .plugin import RESULT_KEY
        run = self.run
        if run is None or run.nodeid != item.nodeid or not run.running:
            raise RankSetupError(f"pytest-nccl: rank {self.rank} has no distributed run for {item.nodeid} "
                                 "(its set-up did not start one)")
        stash: dict = {}
        item.stash[RESULT_KEY] = stash
        outcome, exc = self._call_body(run, item)
        verdict = self._end(run, outcome)
        return self._apply(item, run, verdict, stash, exc)

    def _call_body(self, run: _TestRun, item: pytest.Function) -> tuple[dict, BaseException | None]:
        """Run the test function here; classify how it ended as a rank does (rank.py)."""
        testfunction = item.obj
        funcargs = item.funcargs
        kwargs = {arg: funcargs[arg] for arg in item._fixtureinfo.argnames}
        status, exc_type, exc_text, message = protocol.PASSED, "", "", ""
        error = None
        try:
            with self._user_code(run):
                testfunction(**kwargs)
        except SystemExit as exc:
            exit_like_os_exit(exc)  # as in plugin mode
        except BaseException as exc:
            error = exc
            status, exc_type, exc_text, message = describe_exception(exc, _format_exception)
        outcome = {"status": status, "exc_type": exc_type, "exc_text": exc_text, "message": message,
                   "output": self._captured_output()}
        return outcome, error

    def _captured_output(self) -> str:
        """What the body printed on this rank (pytest's capture, taken so that rank 0 shows it)."""
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        if capman is None:
            return ""
        try:
            if not capman.is_globally_capturing():
                return ""
            out, err = capman.read_global_capture()
            return (out or "") + (err or "")
        except Exception:
            return ""

    def _record_failure(self, item, result, diag, verdict: dict) -> list:
        """Rank 0: headline for the JUnit XML, the gate report and --nccl-trace-dir."""
        from .plugin import RESULT_KEY
        from .report import trace_json, write_trace_dir
        stash = item.stash.get(RESULT_KEY, None)
        if stash is None:
            stash = item.stash[RESULT_KEY] = {}
        stash.update(result=result, headline=diag.headline, kind=diag.kind, exception=verdict["exception"])
        props = [("nccl_diagnosis", diag.headline), ("nccl_diagnosis_kind", diag.kind),
                 ("nccl_exception", verdict["exception"])]
        item.user_properties.extend(props)
        if self.nccl.trace_dir:
            try:
                text = trace_json(item.nodeid, result.ranks, diag, result.elapsed, result.bound, self.backend)
                write_trace_dir(self.nccl.trace_dir, item.nodeid, text, {})
            except OSError as exc:
                self.say(f"cannot write the trace of {item.nodeid}: {exc}")
        return props

    def _apply(self, item, run: _TestRun, verdict: dict, stash: dict, raise_failure) -> bool:
        """The same outcome on every rank: pass, skip, xfail, or the one exception of the verdict
        (rank 0 with the combined report, the others quietly). ``raise_failure``: this rank's own
        exception, re-raised when it already is the verdict (a skip, an xfail)."""
        __tracebackhide__ = True
        status = verdict["status"]
        if run.result is not None:
            stash["result"] = run.result[0]
        if status == "passed":
            return True
        if status == "skipped":
            if raise_failure is not None and type(raise_failure).__name__ == "Skipped":
                raise raise_failure
            raise pytest.skip.Exception(verdict.get("message") or "skipped on every rank", _use_item_location=True)
        if status == "xfailed":
            if raise_failure is not None and type(raise_failure).__name__ == "XFailed":
                raise raise_failure
            pytest.xfail(verdict.get("message") or "xfail on every rank")
        if verdict.get("stop"):
            item.session.shouldstop = verdict["stop"]
        exc_class = getattr(errors, verdict.get("exception") or "", None)
        if not (isinstance(exc_class, type) and issubclass(exc_class, DistributedTestFailure)):
            exc_class = DistributedTestFailure
        if self.rank == 0 and run.result is not None and run.result[1] is not None:
            result, diag, report = run.result
            self._record_failure(item, result, diag, verdict)
            raise exc_class(diag.headline, diag, report)
        diag = Diagnosis(verdict.get("kind") or "setup", verdict["headline"])
        if self.rank == 0:
            stash.update(headline=diag.headline, kind=diag.kind, exception=exc_class.__name__)
            item.user_properties.extend([("nccl_diagnosis", diag.headline), ("nccl_diagnosis_kind", diag.kind),
                                         ("nccl_exception", exc_class.__name__)])
        raise exc_class(verdict["headline"], diag, "")

    def _join_without_body(self, item, rep, call=None) -> None:
        """This rank's set-up failed or skipped (or the body was never called): publish that as its
        outcome, wait for the verdict like the ranks that run the body, and report it."""
        run = self.run
        status, exc_type, exc_text, message = protocol.FAILED, "", "", ""
        if rep.skipped:
            if hasattr(rep, "wasxfail"):
                status, message = protocol.XFAILED, str(rep.wasxfail)
            else:
                status = protocol.SKIPPED
                message = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr or "")
                message = message.removeprefix("Skipped: ")
        else:
            exc = call.excinfo.value if call is not None and call.excinfo is not None else None
            where = " (in the test's setup)" if rep.when == "setup" else ""
            if exc is not None:
                exc_type = type(exc).__name__
                text = (str(getattr(exc, "msg", "")) or str(exc)).strip().split("\n")[0][:300]
                message = f"{exc_type}: {text}{where}" if text else f"{exc_type}{where}"
                exc_text = _format_exception(exc)
            else:
                message = f"failed{where}"
        output = "".join(content for when, _, content in getattr(item, "_report_sections", [])
                         if when == rep.when)
        outcome = {"status": status, "exc_type": exc_type, "exc_text": exc_text, "message": message,
                   "output": output}
        verdict = self._end(run, outcome)
        self._setup_failure_report(item, rep, verdict)


def _bound_of(item) -> float:
    """The test's bound as the plugin computes it (marker timeout, session timeout, pytest-timeout)."""
    from .plugin import SESSION_KEY, item_budget
    timeout = item.config.stash[SESSION_KEY].timeout
    try:
        args = parse_marker(item)
    except NcclUsageError:
        args = None
    if args is not None and args.timeout is not None:
        timeout = args.timeout
    return item_budget(item, timeout).bound()


def collection_difference(lists: dict, world: int, gone: list) -> str | None:
    """One message naming the ranks and the first differing test, or None when they all agree."""
    head = "pytest-nccl SPMD mode: every rank must collect the same tests in the same order"
    if gone:
        return f"{head}; {'ranks' if len(gone) > 1 else 'rank'} {','.join(map(str, gone))} ended before collecting"
    missing = [r for r in range(world) if r not in lists]
    if missing:
        return (f"{head}; {'ranks' if len(missing) > 1 else 'rank'} {','.join(map(str, missing))} did not finish "
                f"collecting within {COLLECT_WAIT:g} s")
    ref = lists[0]["ids"]
    parts = []
    for r in range(1, world):
        ids = lists[r]["ids"]
        if ids == ref:
            continue
        i = next((i for i, (a, b) in enumerate(zip(ref, ids)) if a != b), min(len(ref), len(ids)))
        mine = ref[i] if i < len(ref) else "(nothing)"
        theirs = ids[i] if i < len(ids) else "(nothing)"
        parts.append(f"rank {r} collected {len(ids)} tests, rank 0 {len(ref)}; first difference at test "
                     f"#{i + 1}: rank 0 {mine!r}, rank {r} {theirs!r}")
    errors_by_rank = {r: lists[r].get("errors", 0) for r in range(world) if lists[r].get("errors", 0)}
    if parts:
        extra = ""
        if errors_by_rank:
            extra = "; collection errors on " + ", ".join(f"rank {r} ({n})" for r, n in errors_by_rank.items())
        return f"{head}: " + "; ".join(parts[:3]) + extra
    return None
