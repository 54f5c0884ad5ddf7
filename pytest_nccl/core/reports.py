"""The one report of a rank's part in a call, whatever carried it, and the outcome of a whole call.

Every transport produces a ``RankReport`` per rank and hands them to ``judge.judge``:

- a forked rank sends it over its socket when the call returns (``rank/loop.py``); the controller
  writes one itself for a rank that died (exit status) or is still running (its stacks);
- an SPMD rank publishes it, pickled, in the launcher's store (with its journal, which travels with
  it), and a snapshot of itself (state RUNNING, its stacks) when rank 0 decides before it finished;
- a watched job's rank writes its JSON form as its exit record (``to_json``), and the watch adds
  what it saw from outside (the process vanished, the signal that killed it, the stacks it asked for).

Standard library only: every rank imports it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from .agreement import Digest
from .oom import OomKill
from .records import RankView
from .states import RankState, Reason

if TYPE_CHECKING:  # the rank side imports this module: no diagnosis code at run time
    from .diagnosis.findings import Diagnosis


@dataclass
class RankReport:
    """How one rank ended a call, or where it is while the call runs."""
    rank: int
    state: RankState = RankState.RUNNING
    message: str = ""                    # one line: the exception, the skip or xfail reason
    exc_type: str = ""
    exc_text: str = ""                   # the formatted traceback of a rank that raised
    output: str = ""                     # what the rank printed during the call
    # group -> Digest of the collectives it issued; None: the transport does not know them (the
    # judge computes them from the journal instead). Empty when the call was not traced.
    digest: dict | None = None
    journal: str = ""                    # the journal's text, where it travels with the report (SPMD)
    stack: str = ""                      # a running rank's stacks, every thread
    exit_code: int | None = None         # DEAD: the process's exit status
    signal_name: str | None = None       # DEAD: the signal that ended it ("SIGABRT")
    oom: OomKill | None = None           # DEAD: the kernel's OOM killer took it (``core.oom``)
    initialized: bool = True             # the default group still exists after the call
    dangling: int = 0                    # async collectives still in flight when the call returned
    ended: float = 0.0                   # wall clock (time.time()) when the rank finished
    finished_at: float | None = None     # seconds since the call started, on the transport's clock
    duration: float = 0.0
    call_id: int = 0                     # forked: which call of the group this answers
    value: bytes = b""                   # forked nccl_world.run: the pickled return value
    unloadable: bool = False             # ERROR because the function could not be loaded (its module
                                         # or a library it imports fails): infrastructure for git bisect

    def view(self) -> RankView:
        """The analysis's view of this rank, without records (the judge adds them)."""
        return RankView(self.rank, status=self.state.judged, exit_code=self.exit_code,
                        signal_name=self.signal_name, oom=self.oom, exc_type=self.exc_type, exc_text=self.exc_text,
                        message=self.message, stack=self.stack, output=self.output,
                        finished_at=self.finished_at)

    # -- the JSON form (a watched job's exit record, the watch's reports across nodes) ---------------
    def to_json(self) -> str:
        data = asdict(self)
        data["value"] = base64.b64encode(self.value).decode() if self.value else ""
        if self.digest is not None:
            data["digest"] = {pg: list(d) for pg, d in self.digest.items()}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> "RankReport":
        """The report a JSON form describes; unknown keys are ignored, a state it does not know is a
        failure (a newer writer): never an exception for a well-formed object."""
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        report = cls(**{k: v for k, v in data.items() if k in known and k not in ("state", "value", "digest", "oom")})
        try:
            report.state = RankState(data.get("state", RankState.RUNNING))
        except ValueError:
            report.state = RankState.FAILED
        if data.get("oom") is not None:
            report.oom = OomKill.from_dict(data["oom"])
        if data.get("value"):
            report.value = base64.b64decode(data["value"])
        if data.get("digest") is not None:
            report.digest = {pg: Digest(d[0], d[1], tuple(tuple(s) for s in (d[2] if len(d) > 2 else ())))
                             for pg, d in data["digest"].items()}
        return report


@dataclass
class CallOutcome:
    """How one call ended on every rank, whatever front-end ran it (forked groups, SPMD, the watch):
    every rank's report, the analysis's view of each, the judge's diagnosis (None: clean), and what a
    view needs to show it (timing, backend, where the numbering of each group starts)."""
    views: list[RankView]
    reason: Reason
    reports: dict = field(default_factory=dict)   # rank -> RankReport
    elapsed: float = 0.0
    bound: float = 0.0
    diagnosis: Diagnosis | None = None             # None: the call is clean
    backend: str = ""
    fr_json: dict = field(default_factory=dict)   # rank -> Flight Recorder JSON text
    fr_pickle: dict = field(default_factory=dict)  # rank -> Flight Recorder dump (fr_trace's format)
    # a long job's window (the watch): group -> collectives before the first record kept, and
    # rank -> {group: collectives it entered}; empty: records are numbered from the call's start
    bases: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    interrupted: str = ""                          # Reason.INTERRUPTED: the signal that ended it ("SIGINT")

    @property
    def ranks(self) -> list[RankView]:
        """The views, by the name the test modes' callers read."""
        return self.views

    @property
    def clean(self) -> bool:
        return self.diagnosis is None

    @property
    def all_passed(self) -> bool:
        return all(v.status == RankState.PASSED for v in self.views)

    @property
    def verdict(self) -> Diagnosis:
        """The diagnosis of an outcome that has one (every outcome a failure report shows)."""
        if self.diagnosis is None:
            raise ValueError("pytest-nccl: a clean call has no verdict")
        return self.diagnosis


CallResult = CallOutcome  # the name the test modes used
