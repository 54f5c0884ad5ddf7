"""One call on a forked group: what the controller has learned of it so far (``CallState``), and
the driver's transport for it (``ForkedCall``: journal files, rank messages and dumps over the
sockets, exit statuses from the fork server)."""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection, wait

from ..core.call import Dumps, flight_recorder_merged
from ..core.flight import with_flight_recorder
from ..core.messages import Call
from ..core.referee import Referee
from ..core.reports import RankReport
from ..core.states import RankState, Reason

# once decided, for the ranks' reader threads to answer with their stacks over the socket
STACKS_WAIT = 1.0
# a Flight Recorder poll while the call runs, for every rank's answer
FLIGHT_RECORDER_WAIT = 0.5


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


class ForkedCall:
    """The driver's transport for one call on a forked group (``core.call.Transport``): journal files,
    rank messages over the sockets, the Flight Recorder and stacks asked over them, faulthandler for
    a rank that cannot answer, the fork server's exit statuses."""

    def __init__(self, group, state: "CallState"):
        self.group, self.state = group, state
        self.offsets = {r: file_size(group.output_path(r)) for r in range(group.world)}

    # -- the referee's CallView --------------------------------------------------------------------------
    def journals(self) -> dict:
        return self.group._journals(self.state.call)

    def journal_sizes(self) -> list:
        return [file_size(journal_path(self.state.call, r)) for r in range(self.group.world)]

    def flight_recorder_journals(self) -> dict | None:
        state = self.state
        self.group._request_dumps(state, list(self.group.conns), FLIGHT_RECORDER_WAIT)
        if len(state.fr_json) != self.group.world:
            return None
        return with_flight_recorder(self.journals(), state.fr_json, state.since_ns)

    # -- the rest of the transport ---------------------------------------------------------------------
    def receive(self, until: float) -> None:
        group, state = self.group, self.state
        ready = wait([*state.live.values(), group.zygote.conn], timeout=max(0.0, until - time.monotonic()))
        for obj in ready:
            if obj is group.zygote.conn:
                group.zygote.drain()
            elif isinstance(obj, Connection):
                group._receive(obj, state)

    def dumps(self, reason: Reason, live: list[int]) -> Dumps:
        """Stacks of the ranks still running; Flight Recorder of every rank that can answer."""
        group, state = self.group, self.state
        state.fr_json.clear()
        group._request_dumps(state, list(group.conns), STACKS_WAIT, want_stacks=True)
        group._faulthandler_stacks(state)
        return Dumps(stacks=dict(state.stacks), fr_json=dict(state.fr_json), fr_pickle=dict(state.fr_pickle))

    def release(self, live: list[int]) -> None:
        self.group.healthy = False  # killed below, with the reports in

    def reports(self, reason: Reason, running: dict[int, RankReport]) -> dict[int, RankReport]:
        group, reports = self.group, self.state.reports
        reports.update(running)
        if reason != Reason.COMPLETED or any(rep.state != RankState.PASSED for rep in reports.values()):
            group.healthy = False
        if any(not rep.initialized or rep.dangling for rep in reports.values()):
            # the test destroyed the default group, or left collectives in flight that would pair
            # with the next test's: start afresh next time
            group.healthy = False
        if not group.healthy:
            group.kill()
        for rank, rep in reports.items():
            if file_size(group.output_path(rank)) > self.offsets[rank]:
                rep.output = read_from(group.output_path(rank), self.offsets[rank])
        group._fill_exit_statuses(reports)
        return reports

    def final_journals(self, reports: dict[int, RankReport], dumps: Dumps) -> dict:
        return flight_recorder_merged(self.journals(), dumps, self.group.world, self.state.since_ns)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(200_000).decode("utf-8", errors="replace")
    except OSError:
        return ""
