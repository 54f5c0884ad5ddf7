"""One rank of a watched job as the watch follows it (``Followed``): its journal read by offset
across the rank's rotations (``JournalFile``), its info, exit record and process, and the questions
asked of its agent; for a rank of this watch's node from its files and socket (``LocalRank``), for a
rank of another node through the channel its node's watch publishes in (``RemoteRank``)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import BinaryIO

from ...core import jobdir
from ...core.jobdir import RankInfo
from ...core.journal import JournalTail
from ...core.messages import AgentRequest
from ...core.reports import RankReport
from ...core.states import RankState
from ...memcg import OomWatch
from .channel import RankSummary

READ_CHUNK = 8 << 20      # bytes of one journal read in one tick at most


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
        self.f: BinaryIO | None = None
        self.ino: int | None = None
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
            assert self.f is not None  # opened just now, or before
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


class LocalRank:
    """A rank of this watch's node: its files in the job's directory, its agent's socket, its process."""

    remote = False

    def __init__(self, rank: int, info: RankInfo, directory: str):
        self.rank, self.info, self.directory = rank, info, directory
        self.journal = JournalFile(jobdir.journal(directory, rank))
        self.exit_code: int | None = None  # seen while the process was a zombie
        self.memory = OomWatch(info.pid)   # its memory cgroup's OOM kills, from now on

    def ask(self, request: AgentRequest, timeout: float) -> dict | None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(jobdir.socket_path(self.directory, self.rank))
                s.sendall(request.value.encode() + b"\n")
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
        """The process ended (a zombie counts; its exit status is kept when readable, and its memory
        cgroup's OOM kills are counted then)."""
        if self._gone():
            self.memory.ended()
            return True
        self.memory.refresh()  # a rank moved into another cgroup is followed there
        return False

    def _gone(self) -> bool:
        pid, start = self.info.pid, self.info.start
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            return True
        if start is not None and int(fields[19]) != start:
            return True  # the pid was reused
        if fields[0] in (jobdir.ProcState.ZOMBIE, jobdir.ProcState.DEAD):
            try:
                self.exit_code = int(fields[49])
            except (IndexError, ValueError):
                pass
            return True
        return False

    def exit_report(self) -> RankReport | None:
        """Its exit record; None while there is none (or it is being written)."""
        text = read_text(jobdir.exit_record(self.directory, self.rank))
        if not text:
            return None
        try:
            return RankReport.from_json(text)
        except (ValueError, TypeError):
            return None

    def fatal(self) -> str:
        """What faulthandler wrote when a fatal signal ended it."""
        return read_text(jobdir.fatal(self.directory, self.rank))

    def ended_by(self) -> tuple[str, str] | None:
        """(signal name, its stacks) when SIGTERM or SIGHUP reached it (``inrank.endsignals``)."""
        for name in jobdir.ENDING_SIGNALS:
            text = read_text(jobdir.ended_by(self.directory, self.rank, name))
            if text.strip():
                return name, text
        return None


class RemoteJournal:
    """A rank's journal on another node, as the deciding watch knows it: how much of it its node's
    watch read (its summary); its records come as ``Details``, when a rule reads them."""

    truncated = False  # a restarted rank is followed by its watch under a new attempt: never here

    def __init__(self):
        self.consumed = 0

    def read(self) -> bytes:
        return b""

    def close(self) -> None:
        pass


class RemoteRank:
    """A rank of another node, as that node's watch summarizes it (``summary``) and answers for it
    (``nodes``: ``Nodes.ask``): its process is not this watch's to see, so how it ended is what its
    watch says (``exit_report``)."""

    remote = True
    exit_code = None

    def __init__(self, rank: int, info: RankInfo, nodes):
        self.rank, self.info, self.nodes = rank, info, nodes
        self.journal = RemoteJournal()
        self.summary = RankSummary()
        self.fetched: RankSummary | None = None   # the summary its records were last asked at

    @property
    def stale(self) -> bool:
        """Its records are older than its summary."""
        return self.fetched != self.summary

    def ask(self, request: AgentRequest, timeout: float) -> dict | None:
        return self.nodes.ask_agents([self.rank], request).get(self.rank)

    def gone(self) -> bool:
        return False

    def exit_report(self) -> RankReport | None:
        try:
            return RankReport.from_json(self.summary.exit) if self.summary.exit else None
        except (ValueError, TypeError):
            return None

    def fatal(self) -> str:
        return ""  # in its exit report already

    def ended_by(self) -> tuple[str, str] | None:
        return None  # in its exit report already


class Followed:
    """What the watch knows of one rank, wherever it runs (``source``: a ``LocalRank`` or a
    ``RemoteRank``)."""

    def __init__(self, rank: int, source: LocalRank | RemoteRank):
        self.rank, self.source, self.info = rank, source, source.info
        self.file = source.journal
        self.tail = JournalTail(rank)
        self.records: list = []        # the window, in the order the rank entered them
        self.count: dict = {}          # group -> collectives entered since the journal started
        self.kept: dict = {}           # group -> records of it in the window
        self.state: RankState | None = None
        self.exit: RankReport | None = None   # its exit record, or what the watch saw it end as
        self.finished_at: float | None = None
        self.fr_progress: tuple | None = None  # the Flight Recorder's per-group progress, last asked
        self.unseen = False            # another node's rank this watch lost sight of (the channel ended)

    @property
    def local(self) -> bool:
        return not self.source.remote

    def ask(self, request: AgentRequest, timeout: float) -> dict | None:
        return self.source.ask(request, timeout)


def ask_all(followed: list, request: AgentRequest, timeout: float) -> dict:
    """Ask several ranks at once; rank -> answer (None when it did not answer in time)."""
    answers: dict = {}
    all_at_once([lambda f=f: answers.__setitem__(f.rank, f.ask(request, timeout)) for f in followed],
                timeout + 0.5)
    return answers


def all_at_once(jobs: list, wait: float) -> None:
    """Run ``jobs`` each on a thread of its own; return once all ended, or ``wait`` passed."""
    threads = [threading.Thread(target=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + wait
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
