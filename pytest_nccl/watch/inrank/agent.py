"""Rank side of ``pytest-nccl watch``: the agent thread of one rank.

A daemon thread (``pytest-nccl-watch-agent``: never shown in stacks) serves a unix socket,
``rank-R.sock``, one request a connection, a line in and a JSON object out:

    status   {"fr": the Flight Recorder's per-group progress (pg_status), or null}   (cheap)
    fr       {"fr_json": the Flight Recorder's dump (JSON text), or null}
    stack    {"stack": Python stacks of every thread}                               (where a rank is)
    dump     {"stack": Python stacks of every thread, "fr_json": ..., "fr_pickle": base64 or null}

It answers while the main thread waits inside a collective (gloo and NCCL release the GIL there).
Once a second it also bounds the journal (past ``jobdir.segment_bytes()`` the tracer's descriptor is
pointed at a fresh file with ``dup2``; the previous segment is kept as ``journal-R.txt.1``) and checks
that the watch process still exists: a rank never outlives it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import threading
import time

from ...core import jobdir
from ...core.messages import AgentRequest
from ...rank import flight_api, tracer
from ...rank.stacks import THREAD_PREFIX, format_stacks
from ..timing import TIMING


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def fr_status():
    try:
        text = flight_api.dump_json(False, True)
        return json.loads(text.decode()).get("pg_status")
    except Exception:  # no Flight Recorder in this build or version, whatever it raises
        return None


def dump() -> dict:
    pickled = tracer.flight_recorder_pickle()
    return {"stack": format_stacks(cut_main_to_user=True), "fr_json": tracer.flight_recorder_json(),
            "fr_pickle": base64.b64encode(pickled).decode() if pickled else None}


def rotate(path: str, fd: int) -> None:
    """Point the journal's descriptor at a fresh file, then give it the journal's name, the old one
    becoming ``path.1``: the watch follows the file by name, so it sees the new one only once nothing
    more goes to the old one (``follow.JournalFile``)."""
    fresh = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.dup2(fresh, fd)
    os.close(fresh)
    os.replace(path, path + ".1")
    os.replace(path + ".new", path)


class Agent:
    def __init__(self, directory: str, rank: int):
        self.path = jobdir.socket_path(directory, rank)
        self.journal = jobdir.journal(directory, rank)
        self.segment = jobdir.segment_bytes()
        watcher = int(os.environ.get(jobdir.ENV_WATCHER) or 0)
        # only a watch on this host that this process can see (not one outside its pid namespace)
        same_host = os.environ.get(jobdir.ENV_WATCHER_HOST) == socket.gethostname()
        self.watcher = watcher if watcher and same_host and alive(watcher) else 0
        self.rotations = 0
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.sock.settimeout(1.0)
        self.thread = threading.Thread(target=self._run, name=THREAD_PREFIX + "watch-agent", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """At the rank's exit: no more questions, and the one being answered finished first. An answer
        runs torch's C++ (the Flight Recorder's dump) without the GIL; a daemon thread that takes the
        GIL back in a finalizing interpreter is ended there by ``pthread_exit``, whose unwinding
        through C++ aborts the process ("terminate called without an active exception"), which
        fails a healthy job (``trace_core.close`` has the same reason)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept at once (close alone does not:
        except OSError:                           # the rank's exit waited up to a second for its timeout)
            pass
        try:
            self.sock.close()
            os.unlink(self.path)
        except OSError:
            pass
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=TIMING.agent_close_wait)

    def _run(self) -> None:
        next_chores = time.monotonic() + 1.0
        while True:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                conn = None
            except OSError:
                return  # closed at exit
            if conn is not None:
                try:
                    self._answer(conn)
                except Exception:  # a thread in the user's rank: one answer failed, it goes on
                    pass
                finally:
                    conn.close()
            if time.monotonic() >= next_chores:
                next_chores = time.monotonic() + 1.0
                try:
                    self._chores()
                except Exception:  # a thread in the user's rank: a chore failed, it goes on
                    pass

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        request = b""
        while not request.endswith(b"\n") and len(request) < 64:
            chunk = conn.recv(64)
            if not chunk:
                break
            request += chunk
        what = request.strip().decode(errors="replace")
        asked = AgentRequest.read(what)
        if asked is AgentRequest.STATUS:
            reply = {"fr": fr_status()}
        elif asked is AgentRequest.DUMP:
            reply = dump()
        elif asked is AgentRequest.FR:
            reply = {"fr_json": tracer.flight_recorder_json()}
        elif asked is AgentRequest.STACK:
            reply = {"stack": format_stacks(cut_main_to_user=True)}
        else:
            reply = {"error": f"unknown request {what!r}"}
        conn.sendall(json.dumps(reply).encode())

    def _chores(self) -> None:
        fd = tracer.journal_fd(self.journal)
        if fd >= 0 and os.fstat(fd).st_size > self.segment:
            rotate(self.journal, fd)
            self.rotations += 1
        if self.watcher and not alive(self.watcher):
            self._orphaned()

    def _orphaned(self) -> None:
        try:
            os.write(2, b"pytest-nccl watch: the watch process is gone; this rank ends too\n")
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(TIMING.orphan_kill_after)
        os.kill(os.getpid(), signal.SIGKILL)
