"""Controller side of ``pytest-nccl watch``: follow the ranks' files and feed the referee.

``Monitor.poll(now)`` is one tick: new ``rank-R.json`` files (the world size is the one the ranks
saw), the bytes each journal gained since the last tick (read by offset, following the file across
rotations), exit records and vanished pids (``Referee.finished``), then ``Referee.step`` with a
``JobView``. Its cost per tick does not grow with the job: journals are read incrementally and the
records kept are a window (``KEEP`` per group and rank, renumbered from ``base``; ``present.py``
prints the numbers the ranks counted). ``conclude`` collects the stacks of the ranks still running
and returns the verdict the test modes would give (``referee.verdict``).
"""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from ..diagnose import Diagnosis, members_of
from ..flight import merge as merge_flight_recorder
from ..flight import records_from_dump
from ..journal import JournalTail
from ..records import RankState, RankView
from ..referee import TIMING, Reason, Referee, is_clean, verdict
from . import jobdir

KEEP = 1000               # records of a group kept per rank (the window holds KEEP to 2 * KEEP)
READ_CHUNK = 8 << 20      # bytes of one journal read in one tick at most
STATUS_EVERY = 1.0        # how often each rank's Flight Recorder progress is asked for
SCAN_EVERY = 0.05         # how often the directory is listed for ranks not seen yet
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def fr_progress(pg_status) -> tuple | None:
    """The Flight Recorder's per-group progress (last enqueued, last completed) in one comparable
    value: it moves with every collective, those issued from C++ (DDP's reducer) included."""
    if not pg_status:
        return None
    return tuple(sorted((pg, s.get("last_enqueued_collective"), s.get("last_completed_collective"))
                        for pg, s in pg_status.items()))


class JournalFile:
    """One rank's journal, followed by name: each read continues where the last one stopped; when
    the rank rotated the file (``agent.rotate``), the rest of the old one comes first, then the
    previous segment if two rotations happened in between (more would lose one: 16 MB of journal
    between two ticks of the watch)."""

    def __init__(self, path: str):
        self.path = path
        self.f = None
        self.ino = None
        self.consumed = 0      # bytes read in all: the measure of progress
        self.truncated = False  # the rank started the journal again (a restarted rank)

    def _open(self, path: str) -> bool:
        try:
            f = open(path, "rb")
        except OSError:
            return False
        if self.f is not None:
            self.f.close()
        self.f, self.ino = f, os.fstat(f.fileno()).st_ino
        return True

    def read(self) -> bytes:
        out = b""
        for _ in range(4):  # segments visited in one read
            if self.f is None and not self._open(self.path):
                break
            out += self.f.read(READ_CHUNK - len(out))
            if len(out) >= READ_CHUNK:
                break
            try:
                st = os.stat(self.path)
            except OSError:
                break  # between the rank's two renames
            if st.st_ino == self.ino:
                if st.st_size < self.f.tell():  # started again: a restarted rank
                    self.f.seek(0)
                    self.truncated = True
                break
            # rotated: the rank moved its descriptor before renaming, nothing more comes to this one
            out += self.f.read(READ_CHUNK - len(out))
            if len(out) >= READ_CHUNK:
                break
            try:
                skipped = os.stat(self.path + ".1").st_ino not in (self.ino, st.st_ino)
            except OSError:
                skipped = False
            if not (skipped and self._open(self.path + ".1")) and not self._open(self.path):
                break
        self.consumed += len(out)
        return out

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class Followed:
    """What the watch knows of one rank."""

    def __init__(self, rank: int, info: dict, directory: str):
        self.rank, self.info, self.directory = rank, info, directory
        self.file = JournalFile(jobdir.journal(directory, rank))
        self.tail = JournalTail(rank)
        self.records: list = []        # the window, in the order the rank entered them
        self.count: dict = {}          # group -> collectives entered since the journal started
        self.kept: dict = {}           # group -> records of it in the window
        self.state: RankState | None = None
        self.exit: dict = {}
        self.finished_at: float | None = None
        self.fr_progress = None        # the Flight Recorder's per-group progress, last asked
        self.local = info.get("host") == socket.gethostname()
        self.exit_code: int | None = None  # seen while the process was a zombie

    def ask(self, request: str, timeout: float) -> dict | None:
        if not self.local:
            return None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(jobdir.socket_path(self.directory, self.rank))
                s.sendall(request.encode() + b"\n")
                chunks = []
                while True:
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        break
                    chunks.append(chunk)
            return json.loads(b"".join(chunks))
        except (OSError, ValueError):
            return None

    def gone(self) -> bool:
        """The process ended (a zombie counts; its exit status is kept when readable)."""
        pid, start = self.info.get("pid"), self.info.get("start")
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            return True
        if start is not None and int(fields[19]) != start:
            return True  # the pid was reused
        if fields[0] in ("Z", "X"):
            try:
                self.exit_code = int(fields[49])
            except (IndexError, ValueError):
                pass
            return True
        return False


@dataclass
class WatchRankView(RankView):
    """A rank of a job: one that ended without a record and without a status the watch could read
    says so (a forked rank's status always comes from its parent)."""

    @property
    def exit_description(self) -> str:
        if self.signal_name or self.exit_code is not None or self.status != RankState.DEAD:
            return super().exit_description
        return "ended without an exit record (killed by a signal, or os._exit)"


@dataclass
class Finding:
    """What the watch concluded."""
    reason: Reason
    views: list
    diagnosis: Diagnosis | None
    elapsed: float
    backend: str
    bases: dict                      # group -> collectives before the window (renumbering)
    counts: dict                     # rank -> {group: collectives entered}
    fr_pickles: dict = field(default_factory=dict)


class JobView:
    """The referee's CallView of a running job."""

    def __init__(self, monitor: "Monitor"):
        self.m = monitor

    def journals(self) -> dict:
        ranks = self.m.ranks
        return {r: ranks[r].records if r in ranks else [] for r in range(self.m.world)}

    def journal_sizes(self) -> list:
        ranks = self.m.ranks
        return [(ranks[r].file.consumed, ranks[r].fr_progress) if r in ranks else None
                for r in range(self.m.world)]

    def flight_recorder_journals(self) -> dict | None:
        """The window merged with the Flight Recorder of the ranks that answer (copies: merging
        renumbers)."""
        dumps = {}
        live = [f for f in self.m.ranks.values() if f.state is None]
        for r, answer in _ask_all(live, "fr", TIMING.stacks_wait).items():
            if answer and answer.get("fr_json"):
                dumps[r] = records_from_dump(answer["fr_json"], r)
                try:  # fresher than the last status poll
                    self.m.ranks[r].fr_progress = fr_progress(json.loads(answer["fr_json"]).get("pg_status"))
                except ValueError:
                    pass
        if not dumps:
            return None
        journals = {r: [copy.copy(rec) for rec in recs] for r, recs in self.journals().items()}
        return merge_flight_recorder(journals, dumps)


class Monitor:
    def __init__(self, directory: str, timeout: float):
        self.dir, self.timeout = directory, timeout
        self.ranks: dict[int, Followed] = {}
        self.world = 0
        self.referee: Referee | None = None
        self.t0 = 0.0
        self.base: dict[str, int] = {}
        self.view = JobView(self)
        self._next_scan = 0.0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_status, name="pytest-nccl-watch-status", daemon=True)
        self._poller.start()

    # -- one tick ------------------------------------------------------------------------------------
    def poll(self, now: float) -> Reason | None:
        if now >= self._next_scan and (self.referee is None or len(self.ranks) < self.world):
            self._next_scan = now + SCAN_EVERY
            self._discover(now)
        if self.referee is None:
            return None
        for f in list(self.ranks.values()):
            self._read(f)
        self._trim()
        self._finished(now)
        reason = self.referee.step(now, self.view)
        if reason is not None:
            _debug(f"referee: {reason}")
        return reason

    def wake_at(self, now: float) -> float:
        return self.referee.wake_at() if self.referee is not None else now + SCAN_EVERY

    def _discover(self, now: float) -> None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            rank = jobdir.rank_of(name)
            if rank is None or rank in self.ranks:
                continue
            info = jobdir.read_json(os.path.join(self.dir, name))
            if info is None:
                continue
            self.ranks[rank] = Followed(rank, info, self.dir)
            _debug(f"rank {rank} joined: pid {info.get('pid')}")
            if self.referee is None:
                self.world = int(info.get("world") or 0)
                self.t0 = now
                self.referee = Referee(self.world, self.timeout, now, trace=True, rolling=True)

    def _read(self, f: Followed) -> None:
        data = f.file.read()
        if f.file.truncated:  # a new incarnation of the rank: follow it from scratch
            f.file.truncated = False
            f.tail, f.records, f.count, f.kept = JournalTail(f.rank), [], {}, {}
        if not data:
            return
        for rec in f.tail.feed(data):
            f.count[rec.pg] = rec.seq
            f.kept[rec.pg] = f.kept.get(rec.pg, 0) + 1
            if not rec.pg.endswith(":p2p"):
                rec.seq -= self.base.get(rec.pg, 0)
            f.records.append(rec)

    def _trim(self) -> None:
        """Keep a window. A collective group's records are dropped from the front on every rank at
        once and renumbered (the rules compare positions); a point-to-point group's, which are not
        aligned across ranks, are dropped rank by rank and keep their numbers."""
        for f in self.ranks.values():
            for pg, kept in list(f.kept.items()):
                if pg.endswith(":p2p") and kept >= 2 * KEEP:
                    self._drop(f, pg, kept - KEEP, renumber=0)
        groups = {pg for f in self.ranks.values() for pg in f.count if not pg.endswith(":p2p")}
        for pg in groups:
            members = set(members_of(pg, self.world))
            entered = [f.count[pg] for r, f in self.ranks.items() if r in members and pg in f.count]
            base = self.base.get(pg, 0)
            if not entered or min(entered) - base < 2 * KEEP:
                continue
            shift = min(entered) - KEEP - base
            for f in self.ranks.values():
                if pg in f.kept:
                    self._drop(f, pg, shift, renumber=shift)
            self.base[pg] = base + shift

    def _drop(self, f: Followed, pg: str, n: int, renumber: int) -> None:
        """Drop ``n`` records of ``pg`` from the front of the rank's window, renumbering the rest."""
        base = 0 if pg.endswith(":p2p") else self.base.get(pg, 0)
        out, dropped, last = [], 0, 0
        for rec in f.records:
            if rec.pg == pg and dropped < n:
                dropped += 1
                last = rec.seq + base
                continue
            if rec.pg == pg and renumber:
                rec.seq -= renumber
            out.append(rec)
        f.records = out
        f.kept[pg] -= dropped
        f.tail.forget(pg, last)

    def _finished(self, now: float) -> None:
        for f in self.ranks.values():
            if f.state is not None:
                continue
            record = jobdir.read_json(jobdir.exit_record(self.dir, f.rank))
            if record is None and f.local and f.gone():
                record = jobdir.read_json(jobdir.exit_record(self.dir, f.rank))  # written just before
                if record is None:
                    record = {"status": "dead"}
            if record is None:
                continue
            _debug(f"rank {f.rank} finished: {record.get('status')}")
            f.exit = record
            f.state = {"passed": RankState.PASSED, "failed": RankState.FAILED}.get(record.get("status"),
                                                                                 RankState.DEAD)
            f.finished_at = now
            self.referee.finished(f.rank, f.state, now)

    def _poll_status(self) -> None:
        while not self._stop.wait(STATUS_EVERY):
            for f in list(self.ranks.values()):
                if f.state is None:
                    answer = f.ask("status", 1.0)
                    if answer is not None and answer.get("fr"):
                        f.fr_progress = fr_progress(answer["fr"])

    def close(self) -> None:
        self._stop.set()
        for f in self.ranks.values():
            f.file.close()

    # -- the verdict ------------------------------------------------------------------------------------
    def conclude(self, reason: Reason, now: float) -> Finding:
        """Stacks of the ranks still running, then the same diagnosis as the test modes."""
        if reason == Reason.DECIDED and self.referee.settle:
            self._settle()
        live = [f for f in self.ranks.values() if f.state is None]
        answers = _ask_all(live, "dump", TIMING.stacks_wait)
        views = [self._view(r, answers.get(r)) for r in range(self.world)]
        fr_pickles = {}
        for r, answer in answers.items():
            if answer and answer.get("fr_pickle"):
                import base64
                fr_pickles[r] = base64.b64decode(answer["fr_pickle"])
        self._merge_flight_recorder(views, answers)
        diagnosis = None
        if not (reason == Reason.COMPLETED and is_clean(views, reason, _digests(views))):
            diagnosis = verdict(views, reason, self.timeout)
        backend = next((f.info.get("backend", "") for f in self.ranks.values()), "")
        return Finding(reason, views, diagnosis, now - self.t0, backend, dict(self.base),
                       {r: dict(f.count) for r, f in self.ranks.items()}, fr_pickles)

    def after_exit(self, now: float, launcher_ok: bool = False) -> Finding | None:
        """The job ended on its own: what the journals say, when the ranks did not all pass.
        ``launcher_ok``: the launcher reported success; a rank that vanished without an exit record
        and without a fatal signal (faulthandler's record) was ended by it with the job, whatever
        status the watch saw it end with: Ray ends its actors so once the driver is done (SIGTERM,
        which Ray's handler turns into status 1, or a quick exit from C++), and a script may end
        with ``os._exit(0)``. Not a rank that died."""
        if self.referee is None:
            return None
        for f in self.ranks.values():
            self._read(f)
        self._finished(now)
        for f in self.ranks.values():
            if f.state is None:  # on another host, or it outlived the launcher
                f.state = RankState.DEAD
                self.referee.finished(f.rank, f.state, now)
            if launcher_ok and f.state == RankState.DEAD and not _read_text(jobdir.fatal(self.dir, f.rank)):
                f.state = RankState.PASSED
        finding = self.conclude(Reason.COMPLETED, now)
        return finding if finding.diagnosis is not None else None

    def _settle(self) -> None:
        """Decided: give ranks outside any collective a moment to finish, as the forked mode does."""
        deadline = time.monotonic() + TIMING.settle
        while time.monotonic() < deadline:
            live = [f for f in self.ranks.values() if f.state is None]
            for f in live:
                self._read(f)
            if all(RankView(f.rank, records=f.records).current is not None for f in live):
                return
            time.sleep(TIMING.poll)
            self._finished(time.monotonic())

    def _view(self, r: int, answer: dict | None) -> WatchRankView:
        f = self.ranks.get(r)
        view = WatchRankView(r)
        if f is None:
            view.status = RankState.NOT_STARTED
            view.message = "never created the default process group"
            return view
        view.records = f.records
        view.status = f.state or RankState.RUNNING
        if f.finished_at is not None:
            view.finished_at = f.finished_at - self.t0
        view.exc_type = f.exit.get("exc_type", "")
        view.exc_text = f.exit.get("exc_text", "")
        view.message = f.exit.get("message", "")
        if answer:
            view.stack = answer.get("stack") or ""
        if view.status == RankState.DEAD:
            fatal = _read_text(jobdir.fatal(self.dir, r))
            if fatal:
                view.stack = fatal[-6000:]
                view.signal_name = next((sig for text, sig in FATAL_SIGNALS.items()
                                         if f"Fatal Python error: {text}" in fatal), None)
            if f.exit_code is not None and view.signal_name is None:
                status = f.exit_code
                if os.WIFSIGNALED(status):
                    import signal
                    view.signal_name = signal.Signals(os.WTERMSIG(status)).name
                elif os.WIFEXITED(status):
                    view.exit_code = os.WEXITSTATUS(status)
        return view

    def _merge_flight_recorder(self, views: list, answers: dict) -> None:
        """A rank still running that waits in no traced collective may wait in one issued from C++
        (DDP's reducer): then, when every rank answered, show the Flight Recorder's entries too."""
        running = [v for v in views if v.status == RankState.RUNNING]
        if not running or any(v.current is not None for v in running):
            return
        if len(answers) != self.world or not all(a and a.get("fr_json") for a in answers.values()):
            return
        dumps = {r: records_from_dump(a["fr_json"], r) for r, a in answers.items()}
        merged = merge_flight_recorder({v.rank: [copy.copy(x) for x in v.records] for v in views}, dumps)
        for v in views:
            v.records = merged[v.rank]
        self.base = {}  # numbered by the Flight Recorder now


def _digests(views: list) -> dict:
    """Per rank and group, the collectives it issued (count, signatures), as the ranks' own digests
    would say: ranks that all exited normally but left a collective unmatched are not clean."""
    digests: dict = {}
    for v in views:
        sigs: dict = {}
        for rec in v.records:
            if not rec.pg.endswith(":p2p"):
                sigs.setdefault(rec.pg, []).append(rec.signature)
        digests[v.rank] = {pg: (len(s), hash(tuple(s))) for pg, s in sigs.items()}
    return digests


def _debug(text: str) -> None:
    if os.environ.get("PYTEST_NCCL_WATCH_DEBUG"):
        import sys
        sys.stderr.write(f"[watch {time.time():.3f}] {text}\n")


def _ask_all(followed: list, request: str, timeout: float) -> dict:
    """Ask several ranks at once; rank -> answer (None when it did not answer in time)."""
    answers: dict = {}
    threads = [threading.Thread(target=lambda f=f: answers.__setitem__(f.rank, f.ask(request, timeout)),
                                daemon=True) for f in followed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 0.5)
    return answers


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
