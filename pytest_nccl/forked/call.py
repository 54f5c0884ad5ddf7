"""One call on a forked group: what the controller has learned of it so far (``CallState``), and
what the referee reads of it while it runs (``ForkedCallView``: journal files, and the Flight
Recorder asked of every rank over its socket)."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

from ..core.messages import Call
from ..core.referee import TIMING, Referee
from ..core.reports import RankReport


def journal_path(call: Call, rank: int) -> str:
    return os.path.join(call.journal_dir, f"journal-{rank}.txt")


class CallState:
    """What the controller has learned so far about one call."""

    def __init__(self, call: Call, world: int, t0: float, since_ns: int, referee: Referee,
                 conns: dict[int, Connection]):
        self.call, self.t0, self.since_ns = call, t0, since_ns
        self.referee = referee
        self.conns = conns            # the group's connections: a rank's is dropped when it dies
        self.reports: dict[int, RankReport] = {}   # ranks that finished (or died)
        self.stacks: dict[int, str] = {}           # ranks still running, once asked
        self.fr_json: dict[int, str] = {}
        self.fr_pickle: dict[int, bytes] = {}
        self.pending_dumps: set = set()
        self.want_stacks = False

    @property
    def live(self) -> dict[int, Connection]:
        """Ranks still in the call: connected, and not finished for the referee (one source of truth,
        whichever read of a rank's messages saw its outcome)."""
        return {r: c for r, c in self.conns.items() if r not in self.referee.states}


class ForkedCallView:
    """What the referee reads of a running forked call: journal files, and the Flight Recorder
    asked of every rank over its socket."""

    def __init__(self, group, state: "CallState"):
        self.group, self.state = group, state

    def journals(self) -> dict:
        return self.group._journals(self.state.call)

    def journal_sizes(self) -> list:
        return [file_size(journal_path(self.state.call, r)) for r in range(self.group.world)]

    def flight_recorder_journals(self) -> dict | None:
        state = self.state
        self.group._request_dumps(state, list(self.group.conns), TIMING.flight_recorder_wait)
        if len(state.fr_json) != self.group.world:
            return None
        return self.group._journals(state.call, state.fr_json, state.since_ns)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
