"""Plain data shared by the journal reader, the diagnosis and the report: no torch, no processes.

Modelled on torch's flight_recorder ``components/types.py``: the analysis works on these records,
so it can be tested on hand-written data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Ops whose tensors must agree across ranks at the same sequence number (what NCCL and gloo need
# for the collective to complete). Others (gather/scatter lists, all_to_all, object collectives)
# legitimately carry per-rank shapes: only the op name is compared for them.
SHAPE_MATCHED_OPS = frozenset({
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_reduce_coalesced", "gather", "scatter", "all_gather_single", "reduce_scatter_single",
})
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list",
                     "batch_isend_irecv"})

ENTERED, COMPLETED, WAITING = "entered", "completed", "waiting"


@dataclass
class CollectiveRecord:
    """One collective as one rank issued it."""
    rank: int
    pg: str                 # process group label, "default" for the world group
    seq: int                # 1-based, per test and per process group, as this rank issued them
    op: str
    shapes: str = ""        # the tensors this rank contributes, e.g. "[2, 7, 32]" or "[3]x2"
    dtype: str = ""
    async_op: bool = False
    site: str = ""          # "file:line <- file:line", first frames outside torch and pytest_nccl
    state: str = ENTERED    # entered (pending), waiting (in Work.wait), completed
    t_start: float = 0.0    # seconds since the call started
    duration: float | None = None
    source: str = "python"  # python | flight-recorder (C++-issued: DDP reducer, functional collectives)
    fr_seq: int | None = None  # the process group's own sequence id (Flight Recorder's collective_seq_id)
    fr_seq_end: int | None = None  # last such id, for ops that run several (all_gather_object: two)

    @property
    def signature(self) -> tuple:
        """What must agree across ranks for this collective to complete."""
        if self.op in SHAPE_MATCHED_OPS:
            return (self.op, self.shapes, self.dtype)
        return (self.op,)

    @property
    def pending(self) -> bool:
        return self.state != COMPLETED


class RankState(str, enum.Enum):
    """Where a rank is when the call ends or is cut off (the same in every mode)."""
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    RUNNING = "running"          # still in the test: stuck, or busy
    DEAD = "dead"                # its process ended inside the test
    NOT_STARTED = "not-started"  # never reached the test (SPMD: still in an earlier one)

    __str__ = str.__str__        # prints as its value in reports and headlines
    __format__ = str.__format__

    @classmethod
    def of_outcome(cls, status: str) -> "RankState":
        """The state of a rank that sent an outcome (protocol.Status): one that could not run the
        call ("error") failed."""
        return cls.FAILED if status == "error" else cls(status)


@dataclass
class RankView:
    """Everything the controller knows about one rank after a call."""
    rank: int
    status: RankState = RankState.RUNNING
    records: list[CollectiveRecord] = field(default_factory=list)
    exit_code: int | None = None       # for dead ranks: the exit status
    signal_name: str | None = None     # for dead ranks killed by a signal, e.g. "SIGABRT"
    exc_type: str = ""
    exc_text: str = ""                 # formatted traceback of a failed rank
    message: str = ""                  # short message (skip reason, exception line)
    stack: str = ""                    # Python stack of all threads, when the rank was stuck
    output: str = ""                   # captured stdout/stderr of this call
    finished_at: float | None = None   # seconds since the call started
    joined: bool = True                # joined the process group (rendezvous)

    def records_in(self, pg: str) -> list[CollectiveRecord]:
        return [r for r in self.records if r.pg == pg]

    @property
    def current(self) -> CollectiveRecord | None:
        """The collective this rank sits in now (the last pending synchronous one, or the async one it
        waits on), or None when it is outside any collective."""
        for rec in reversed(self.records):
            if rec.state == WAITING or (rec.state == ENTERED and not rec.async_op):
                return rec
        # issued from C++ (DDP's reducer): the Flight Recorder's last unfinished entry
        for rec in reversed(self.records):
            if rec.source == "flight-recorder":
                return rec if rec.pending else None
        return None

    @property
    def exit_description(self) -> str:
        if self.signal_name:
            return f"killed by {self.signal_name}"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return self.status


@dataclass
class CallResult:
    """What a transport learned from one call on every rank (forked group or SPMD session)."""
    ranks: list[RankView]
    reason: str                # referee.Reason: completed | decided | timeout
    outcomes: dict = field(default_factory=dict)  # rank -> protocol.Outcome
    elapsed: float = 0.0
    bound: float = 0.0
    fr_json: dict = field(default_factory=dict)   # rank -> Flight Recorder JSON text
    fr_pickle: dict = field(default_factory=dict)  # rank -> Flight Recorder dump (fr_trace's format)
    digests_agree: bool = True  # every group's members issued the same collectives

    @property
    def all_passed(self) -> bool:
        return all(v.status == RankState.PASSED for v in self.ranks)


@dataclass
class Verdict:
    """Rank 0's decision on one test in SPMD mode, the same on every rank (it travels pickled
    through the launcher's store)."""
    status: RankState                 # PASSED, SKIPPED, XFAILED or FAILED
    message: str = ""                 # skip / xfail reason
    kind: str = ""                    # diagnosis kind of a failure
    headline: str = ""
    exception: str = ""               # the public exception's class name
    stuck: list = field(default_factory=list)   # ranks no abort released
    stop: str | None = None           # why the session stops after this test
    recreate: bool = False            # create the process group again before the next test

    @property
    def failed(self) -> bool:
        return self.status == RankState.FAILED
