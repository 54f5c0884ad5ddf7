"""The records the analysis works on: one collective as one rank issued it (``CollectiveRecord``, with
its point-to-point transfers, ``P2P``), and everything known about one rank after a call
(``RankView``). Plain data, no torch, no processes.

Modelled on torch's flight_recorder ``components/types.py``: the analysis works on these records,
so it can be tested on hand-written data (``tests/records.py`` builds them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .oom import OomKill
from .ops import ROOT_ARG, SHAPE_MATCHED_OPS
from .states import WAITED_ON, RankState, RecordState, Source


@dataclass
class P2P:
    """One point-to-point transfer of a record: send, isend, recv, irecv, each of a batch_isend_irecv,
    send_object_list / recv_object_list (``obj``: they only pair with each other)."""
    send: bool
    peer: int | None        # GLOBAL rank of the other side; None: a receive from any source
    tag: int = 0
    state: RecordState = RecordState.ENTERED
    obj: bool = False
    shape: str = ""         # the tensor sent or received into, as a record's shapes ("[4, 8]"); "": not known
    dtype: str = ""

    def call(self, op: str) -> str:
        """As the user wrote it: 'send(dst=1, tag=1)', 'irecv(src=*, tag=0)'."""
        if op == "batch_isend_irecv":
            op = "isend" if self.send else "irecv"
        peer = "*" if self.peer is None else self.peer
        return f"{op}({'dst' if self.send else 'src'}={peer}, tag={self.tag})"


@dataclass
class CollectiveRecord:
    """One collective as one rank issued it."""
    rank: int
    pg: str                 # process group label: "default", "tp[2,3]" (user's name), "pg4[2,3]"
    seq: int                # 1-based, per test and per process group, as this rank issued them
    op: str
    shapes: str = ""        # the tensors this rank contributes, e.g. "[2, 7, 32]" or "[3]x2"
    dtype: str = ""
    async_op: bool = False
    site: str = ""          # "file:line <- file:line", first frames outside torch and pytest_nccl
    thread: str = ""        # the issuing thread's name; "": the rank's main thread
    state: RecordState = RecordState.ENTERED
    t_start: float = 0.0    # seconds since the call started
    duration: float | None = None
    source: Source = Source.PYTHON
    fr_seq: int | None = None  # the process group's own sequence id (Flight Recorder's collective_seq_id)
    fr_seq_end: int | None = None  # last such id, for ops that run several (all_gather_object: two)
    # what every rank must agree on, besides op, shapes and dtype (journal format v2)
    reduce_op: str = ""     # "SUM", "MAX", ... for REDUCING_OPS
    root: int | None = None  # GLOBAL rank of the root, for ROOT_ARG ops
    splits: str = ""        # SPLIT_OPS: "<sent to each group rank>/<expected from each>", e.g. "2,2/1,3"
    p2p: list = field(default_factory=list)  # P2P transfers of a point-to-point record
    group: str = ""         # the c10d group name ("0": the default group), for the Flight Recorder
    detail: dict = field(default_factory=dict)  # OUTSIDE: store, n, r, role, name, key, joined (journal v3)
    # collectives of this group before the first one kept: a long job's window numbers the records it
    # keeps from 1 (the rules compare positions), a person reads the rank's own count (``number``)
    before: int = 0

    @property
    def number(self) -> int:
        """The number a report shows: the rank's own count in its group."""
        return self.seq + self.before

    @property
    def signature(self) -> tuple:
        """What must be equal across ranks for this collective to complete (splits are checked
        for consistency instead, see ``split_disagreement``)."""
        if self.op in SHAPE_MATCHED_OPS:
            return (self.op, self.shapes, self.dtype, self.reduce_op, self.root)
        return (self.op, self.reduce_op, self.root)

    @property
    def pending(self) -> bool:
        return self.state != RecordState.COMPLETED

    @property
    def root_text(self) -> str:
        return f"{ROOT_ARG.get(self.op, 'root')}={'?' if self.root is None else self.root}"

    def split_lists(self) -> tuple[list, list] | None:
        sent, _, expected = self.splits.partition("/")
        try:
            return [int(x) for x in sent.split(",") if x], [int(x) for x in expected.split(",") if x]
        except ValueError:
            return None

    def blocking_p2p(self) -> list:
        """The transfers this rank waits on now in this record (all of a synchronous send/recv,
        those whose Work.wait it is in, or that returned incomplete, for async ones)."""
        if self.async_op:
            return [p for p in self.p2p if p.state in WAITED_ON]
        return [p for p in self.p2p if p.state != RecordState.COMPLETED]


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
    oom: OomKill | None = None         # for dead ranks the kernel's OOM killer took (``core.oom``)

    def __post_init__(self):
        self.status = RankState(self.status)  # a state given by its word ("passed") is the member

    def records_in(self, pg: str) -> list[CollectiveRecord]:
        return [r for r in self.records if r.pg == pg]

    def count_in(self, pg: str) -> int:
        """Collectives this rank entered in ``pg``, those before a long job's window included."""
        records = self.records_in(pg)
        return len(records) + (records[0].before if records else 0)

    @property
    def current(self) -> CollectiveRecord | None:
        """The collective this rank sits in now (the last pending synchronous one, or the async one it
        waits on), else the first it waits for at a sync point (returned, not completed: NCCL runs
        them in order on its stream), or None when it is outside any collective."""
        in_flight = None
        for rec in reversed(self.records):
            if rec.source == Source.OUTSIDE:
                continue
            if rec.state == RecordState.WAITING or (rec.state == RecordState.ENTERED and not rec.async_op):
                return rec
            if rec.state == RecordState.IN_FLIGHT:
                in_flight = rec
        if in_flight is not None:
            return in_flight
        # issued from C++ (DDP's reducer): the Flight Recorder's last unfinished entry
        for rec in reversed(self.records):
            if rec.source == Source.FLIGHT_RECORDER:
                return rec if rec.pending else None
        return None

    @property
    def outside_wait(self) -> CollectiveRecord | None:
        """The wait outside any collective this rank is in (a store or a group being created, a
        store read), when it is in no collective."""
        for rec in reversed(self.records):
            if rec.source == Source.OUTSIDE and rec.pending:
                return rec if self.current is None else None
        return None

    @property
    def finished(self) -> bool:
        """Out of the test for good: passed, failed, skipped, xfailed or dead."""
        return self.status.finished

    @property
    def exit_description(self) -> str:
        """How a finished rank went: 'killed by SIGKILL', 'exited with code 3', ..."""
        if self.oom is not None:
            return self.oom.describe()
        if self.signal_name:
            return f"killed by {self.signal_name}"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        if self.status == RankState.DEAD:  # neither a status nor a record says how
            return "ended without an exit record (killed by a signal, or os._exit)"
        return self.status
