"""The call driver's transport for a job under ``pytest-nccl watch`` (``core.call.Transport``): what
the referee and the driver see of the ranks a ``Monitor`` follows (each rank's journal window, its
exit record or vanished process, its agent's answers). Apart from ``monitor.py``: that module
follows the files and processes; this one turns what it follows into the driver's view."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Protocol

from ...core.call import Dumps, flight_recorder_merged
from ...core.flight import with_flight_recorder
from ...core.messages import AgentRequest
from ...core.nccl_env import dump_env, dump_prefix
from ...core.records import RankView
from ...core.reports import RankReport
from ...core.states import RankState, Reason
from ...explain.load import InputError, parse_dump, read_bytes
from .follow import Followed, fr_progress
from .window import Window


class FollowedJob(Protocol):
    """What a ``JobView`` reads of the ``monitor.Monitor`` following the job (it does not import it:
    the monitor makes its view)."""
    ranks: dict[int, Followed]
    world: int
    window: Window
    dir: str

    def read(self, f: Followed) -> None: ...

    def finished(self, now: float) -> None: ...

    def report(self, r: int, answer: dict | None) -> RankReport: ...

    def fresh_records(self, ranks: list | None = None, every: bool = False) -> None: ...

    def ask_all(self, followed: list[Followed], request: AgentRequest) -> dict: ...


class JobView:
    """The driver's transport for a running job (``core.call.Transport``): the window of each rank's
    journal, its exit record or vanished process, and its agent's answers."""

    def __init__(self, monitor: FollowedJob):
        self.m = monitor
        self.answers: dict = {}   # rank -> its agent's answer to "dump", once decided

    # -- the referee's CallView --------------------------------------------------------------------------
    def journals(self) -> dict:
        self.m.fresh_records()  # another node's ranks: asked of their nodes when read
        return self._window()

    def _window(self) -> dict:
        """Every rank's records as the window holds them now."""
        ranks = self.m.ranks  # a rank this watch lost sight of is where it was last seen: no evidence
        return {r: ranks[r].records if r in ranks and not ranks[r].unseen else [] for r in range(self.m.world)}

    def journal_sizes(self) -> list:
        ranks = self.m.ranks
        return [(ranks[r].file.consumed, ranks[r].fr_progress) if r in ranks else None
                for r in range(self.m.world)]

    def flight_recorder_journals(self) -> dict | None:
        """The window merged with the Flight Recorder of the ranks that answer."""
        fr_json = {}
        live = [f for f in self.m.ranks.values() if f.state is None]
        for r, answer in self.m.ask_all(live, AgentRequest.FR).items():
            if answer and answer.get("fr_json"):
                fr_json[r] = answer["fr_json"]
                try:  # fresher than the last status poll
                    self.m.ranks[r].fr_progress = fr_progress(json.loads(answer["fr_json"]).get("pg_status"))
                except ValueError:
                    pass
        if not fr_json:
            return None
        return with_flight_recorder(self.journals(), fr_json)

    # -- the rest of the transport ---------------------------------------------------------------------
    def receive(self, until: float) -> None:
        time.sleep(max(0.0, until - time.monotonic()))
        for f in [f for f in self.m.ranks.values() if f.state is None]:
            self.m.read(f)
        self.m.finished(time.monotonic())

    def dumps(self, reason: Reason, live: list[int]) -> Dumps:
        followed = [f for f in self.m.ranks.values() if f.state is None]
        self.answers = answers = self.m.ask_all(followed, AgentRequest.DUMP)
        dumps = Dumps()
        for r, answer in answers.items():
            if not answer:
                continue
            dumps.stacks[r] = answer.get("stack") or ""
            if answer.get("fr_json"):
                dumps.fr_json[r] = answer["fr_json"]
            if answer.get("fr_pickle"):
                dumps.fr_pickle[r] = base64.b64decode(answer["fr_pickle"])
        self.timeout_dumps(dumps)
        return dumps

    def timeout_dumps(self, dumps: Dumps) -> None:
        """The dumps NCCL's watchdog wrote (dump-on-timeout) of the ranks that gave none: a rank it
        ended answers nothing, and its file is what its stream had completed."""
        prefix = dump_prefix({**os.environ, **dump_env(os.environ, self.m.dir)})
        if prefix is None:
            return
        for r in range(self.m.world):
            path = f"{prefix}{r}"
            if r in dumps.fr_json or not os.path.isfile(path):
                continue
            try:
                data = read_bytes(path)
                dump = parse_dump(data, path)
            except InputError:
                continue  # half written when the rank was killed: the verdict goes on without it
            dumps.fr_pickle[r], dumps.fr_json[r] = data, json.dumps(dump, default=str)

    def release(self, live: list[int]) -> None:
        pass  # the job is the watch's caller's to end (or to keep running)

    def reports(self, reason: Reason, running: dict[int, RankReport]) -> dict[int, RankReport]:
        return {r: self.m.report(r, self.answers.get(r)) for r in range(self.m.world)}

    def final_journals(self, reports: dict[int, RankReport], dumps: Dumps) -> dict:
        """The window of every rank; a rank still running that waits in no traced collective may wait
        in one issued from C++ (DDP's reducer): then, when every rank answered, with the Flight
        Recorder's entries merged in. Another node's ranks are asked for their records once more here,
        moved or not: its watch publishes what it read of them once a second, and a rank that entered
        a collective just before another rank's error decided the call would be missing from it."""
        self.m.fresh_records(every=True)
        journals = self._window()  # not journals(): a node that did not answer that is not asked twice
        running = [r for r, rep in reports.items() if rep.state == RankState.RUNNING]
        if not running or not all(_waits_nowhere(journals[r]) for r in running):
            return journals
        merged = flight_recorder_merged(journals, dumps, self.m.world)
        if merged is not journals:
            self.m.window.base = {}  # numbered by the Flight Recorder now
        return merged


def _waits_nowhere(records: list) -> bool:
    return RankView(0, records=records).current is None
