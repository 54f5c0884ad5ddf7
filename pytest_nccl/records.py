"""Plain data shared by the journal reader, the diagnosis and the report: no torch, no processes.

Modelled on torch's flight_recorder ``components/types.py``: the analysis works on these records,
so it can be tested on hand-written data. Besides the records, what both the diagnosis and the
referee read off them (the layout rules let pure modules import only each other):

- group labels and their ranks (``members_of``, ``rank_ranges``);
- the cross-rank checks of arguments that must pair up (``split_disagreement``, ``digests_agree``);
- who waits for whom (``P2PIndex``: point-to-point pairing; ``stuck_ranks``: certain deadlocks);
- how a call site and a rank's stack read in a headline (``headline_site``, ``stack_top``).
"""

from __future__ import annotations

import enum
import os
import re
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
# A record's source: the Python tracer, the Flight Recorder (issued from C++), or a wait outside any
# collective the tracer journaled (a store or a group being created, a store read: journal v3)
PYTHON, FLIGHT_RECORDER, OUTSIDE = "python", "flight-recorder", "outside"

# Ops with a root, and the name of the argument that sets it (always shown as a GLOBAL rank).
ROOT_ARG = {"broadcast": "src", "scatter": "src", "broadcast_object_list": "src", "scatter_object_list": "src",
            "reduce": "dst", "gather": "dst", "gather_object": "dst"}
# Ops with a reduce op (ReduceOp): every rank must pass the same one.
REDUCING_OPS = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
                          "all_reduce_coalesced", "reduce_scatter_single"})
# Ops whose per-peer sizes ("splits") must be consistent across ranks: what rank i sends to rank j is
# what rank j expects from rank i.
SPLIT_OPS = frozenset({"all_to_all_single", "all_to_all"})


@dataclass
class P2P:
    """One point-to-point transfer of a record: send, isend, recv, irecv, each of a batch_isend_irecv,
    send_object_list / recv_object_list (``obj``: they only pair with each other)."""
    send: bool
    peer: int | None        # GLOBAL rank of the other side; None: a receive from any source
    tag: int = 0
    state: str = ENTERED
    obj: bool = False

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
    state: str = ENTERED    # entered (pending), waiting (in Work.wait), completed
    t_start: float = 0.0    # seconds since the call started
    duration: float | None = None
    source: str = "python"  # python | flight-recorder (C++-issued: DDP's reducer) | outside (not a collective)
    fr_seq: int | None = None  # the process group's own sequence id (Flight Recorder's collective_seq_id)
    fr_seq_end: int | None = None  # last such id, for ops that run several (all_gather_object: two)
    # what every rank must agree on, besides op, shapes and dtype (journal format v2)
    reduce_op: str = ""     # "SUM", "MAX", ... for REDUCING_OPS
    root: int | None = None  # GLOBAL rank of the root, for ROOT_ARG ops
    splits: str = ""        # SPLIT_OPS: "<sent to each group rank>/<expected from each>", e.g. "2,2/1,3"
    p2p: list = field(default_factory=list)  # P2P transfers of a point-to-point record
    group: str = ""         # the c10d group name ("0": the default group), for the Flight Recorder
    detail: dict = field(default_factory=dict)  # OUTSIDE: store, n, r, role, name, key, joined (journal v3)

    @property
    def signature(self) -> tuple:
        """What must be equal across ranks for this collective to complete (splits are checked
        for consistency instead, see ``split_disagreement``)."""
        if self.op in SHAPE_MATCHED_OPS:
            return (self.op, self.shapes, self.dtype, self.reduce_op, self.root)
        return (self.op, self.reduce_op, self.root)

    @property
    def pending(self) -> bool:
        return self.state != COMPLETED

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
        those whose Work.wait it is in for async ones)."""
        if self.async_op:
            return [p for p in self.p2p if p.state == WAITING]
        return [p for p in self.p2p if p.state != COMPLETED]


def rank_ranges(ranks) -> str:
    """'0-14,16' for ranks 0..14 and 16: runs of three or more as ranges."""
    ranks = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i:j + 1])
        i = j + 1
    return ",".join(parts)


def parse_ranges(text: str) -> list[int] | None:
    """The inverse of ``rank_ranges`` (also 'a-b:s' for a stride); None when it is not one."""
    out = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, _, rest = part.partition("-")
                hi, _, step = rest.partition(":")
                out.extend(range(int(lo), int(hi) + 1, int(step) if step else 1))
            else:
                out.append(int(part))
    except ValueError:
        return None
    return out


def label_ranks(pg: str) -> list[int] | None:
    """The ranks of a group label ("tp[2,3]", "pg4[0-15]") in group rank order; None for the
    default group or a label without its ranks."""
    if "[" not in pg or "]" not in pg:
        return None
    inside = pg[pg.find("[") + 1: pg.find("]")]
    if ",+" in inside:  # "weights[0,+1]": a side group; its other members are not ranks of this world
        inside = inside.split(",+", 1)[0]
    return parse_ranges(inside) if inside and "..." not in inside else None


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
            if rec.source == OUTSIDE:
                continue
            if rec.state == WAITING or (rec.state == ENTERED and not rec.async_op):
                return rec
        # issued from C++ (DDP's reducer): the Flight Recorder's last unfinished entry
        for rec in reversed(self.records):
            if rec.source == "flight-recorder":
                return rec if rec.pending else None
        return None

    @property
    def outside_wait(self) -> CollectiveRecord | None:
        """The wait outside any collective this rank is in (a store or a group being created, a
        store read), when it is in no collective."""
        for rec in reversed(self.records):
            if rec.source == OUTSIDE and rec.pending:
                return rec if self.current is None else None
        return None

    @property
    def finished(self) -> bool:
        """Out of the test for good: passed, failed, skipped, xfailed or dead."""
        return self.status not in (RankState.RUNNING, RankState.NOT_STARTED)

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


# -- who waits for whom: what the diagnosis and the referee's deadlock rule read off the records ----

def members_of(pg: str, world: int) -> list[int]:
    """Ranks of a group, from its label ("default", "tp[2,3]", "pg1[0-15]"), in group rank order."""
    ranks = label_ranks(pg) if pg != "default" else None
    return [r for r in ranks if r < world] if ranks is not None else list(range(world))


def group_base(pg: str) -> str:
    """The name of a label without its ranks: "tp[2,3]" -> "tp" (a mesh dimension, any of its groups)."""
    return pg.split("[", 1)[0].removesuffix(":p2p")


def split_disagreement(records: dict, pg: str, world: int) -> list[tuple]:
    """(sender, receiver, sent, expected) for every pair where what one rank sends the other is not
    what the other expects, sorted; ranks are global."""
    order = members_of(pg, world)
    lists = {r: rec.split_lists() for r, rec in records.items()}
    out = []
    for sender, sl in sorted(lists.items()):
        if not sl or len(sl[0]) != len(order) or sender not in order:
            continue
        for j, receiver in enumerate(order):
            rl = lists.get(receiver)
            if rl and len(rl[1]) == len(order) and sl[0][j] != rl[1][order.index(sender)]:
                out.append((sender, receiver, sl[0][j], rl[1][order.index(sender)]))
    return out


def digests_agree(digests: dict, world: int) -> bool:
    """Every member of every group issued the same collectives (count, and what all must agree on:
    op, shapes, dtype, reduce op, root), with consistent all_to_all split sizes, from the per-rank
    digests (rank -> {group: (count, crc[, splits])}) the ranks send with their outcomes: no journal
    needs reading for a clean pass."""
    per_pg: dict[str, dict] = {}
    for rank, by_pg in digests.items():
        for pg, digest in by_pg.items():
            per_pg.setdefault(pg, {})[rank] = tuple(digest)
    for pg, by_rank in per_pg.items():
        members = members_of(pg, world)
        if len({by_rank.get(r, (0, 0))[:2] for r in members}) > 1:
            return False
        splits = {r: dict(by_rank[r][2]) for r in members if r in by_rank and len(by_rank[r]) > 2}
        for seq in set().union(*splits.values()) if splits else ():
            at = {r: CollectiveRecord(r, pg, seq, "all_to_all", splits=s[seq]) for r, s in splits.items() if seq in s}
            if split_disagreement(at, pg, world):
                return False
    return True


class P2PIndex:
    """Every rank's point-to-point transfers, per channel (group, source, destination, tag), in issue
    order: a send from A to B with tag T pairs with the next receive on B from A (or from any
    source) with tag T, whatever the records' states."""

    def __init__(self, views: dict):
        self.sends: dict[tuple, list] = {}
        self.recvs: dict[tuple, list] = {}      # receives from a named source
        self.any: dict[tuple, list] = {}        # receives from any source: (group, dst, tag, obj)
        for r, view in views.items():
            for rec in view.records:
                for p in rec.p2p:
                    if p.send:
                        self.sends.setdefault((rec.pg, r, p.peer, p.tag, p.obj), []).append(id(p))
                    elif p.peer is None:
                        self.any.setdefault((rec.pg, r, p.tag, p.obj), []).append(id(p))
                    else:
                        self.recvs.setdefault((rec.pg, p.peer, r, p.tag, p.obj), []).append(id(p))

    def has_counterpart(self, rank: int, rec: CollectiveRecord, p: P2P) -> bool:
        """Has the other side issued the transfer this one pairs with? (Receives from any source
        count for every sender: a yes can be generous, a no is certain.)"""
        if p.send:
            key = (rec.pg, rank, p.peer, p.tag, p.obj)
            k = self.sends[key].index(id(p)) + 1
            return len(self.recvs.get(key, ())) + len(self.any.get((rec.pg, p.peer, p.tag, p.obj), ())) >= k
        if p.peer is not None:
            key = (rec.pg, p.peer, rank, p.tag, p.obj)
            return len(self.sends.get(key, ())) >= self.recvs[key].index(id(p)) + 1
        k = self.any[(rec.pg, rank, p.tag, p.obj)].index(id(p)) + 1
        return sum(len(v) for key, v in self.sends.items()
                   if key[0] == rec.pg and key[2] == rank and key[3:] == (p.tag, p.obj)) >= k


def stuck_ranks(views: dict) -> dict:
    """Running ranks that can never go on: rank -> (the record it waits in, what it needs: lists of
    ranks, any one of which would do). A rank waits for the members missing from its collective, or
    for the peer of a transfer nobody issued the counterpart of; it is stuck when one of its needs
    can only come from stuck or finished ranks. Empty when some rank could still move everything."""
    index = None
    waits = {}
    world = len(views)
    for r, view in sorted(views.items()):
        cur = view.current if view.status == RankState.RUNNING else None
        if cur is None or cur.source != "python":
            continue
        if cur.p2p:
            index = index or P2PIndex(views)
            ops = [p for p in cur.blocking_p2p() if not index.has_counterpart(r, cur, p)]
            needs = [[p.peer] if p.peer is not None else
                     [m for m in members_of(cur.pg.removesuffix(":p2p"), world) if m != r] for p in ops]
        elif cur.op in P2P_OPS:
            continue  # a transfer without its peers (a v1 journal): nothing certain
        else:
            needs = [[m] for m in members_of(cur.pg, world)
                     if m in views and len(views[m].records_in(cur.pg)) < cur.seq]
        if needs:
            waits[r] = (cur, needs)
    finished = {r for r, v in views.items() if v.finished}
    stuck = set(waits)
    changed = True
    while changed:
        changed = False
        for r in sorted(stuck):
            hopeless = stuck | finished
            if not any(all(m in hopeless for m in need) for need in waits[r][1]):
                stuck.discard(r)
                changed = True
    return {r: waits[r] for r in sorted(stuck)}


# -- how a record's call site and a rank's stack read in a headline ------------------------------------

def short_path(path: str) -> str:
    """'…/site-packages/trl/trainer/x.py:12' -> 'trl/trainer/x.py:12'; test files relative to cwd."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    except ValueError:
        pass
    return path


def short_site(site: str, depth: int = 3) -> str:
    return " <- ".join(short_path(s) for s in site.split(" <- ")[:depth] if s)


# Libraries whose frames only relay a collective for the code that asked for it: the headline names
# the caller (trl/trainer/sft_trainer.py:448, "via accelerate"); the trace keeps every frame.
RELAY_PACKAGES = ("accelerate",)


def headline_site(site: str) -> str:
    """The call site for a headline: the first frame outside the relaying libraries, then the
    frame after it."""
    frames = [short_path(s) for s in site.split(" <- ") if s]
    relays = []
    while len(frames) > 1 and frames[0].split("/", 1)[0] in RELAY_PACKAGES:
        package = frames.pop(0).split("/", 1)[0]
        if package not in relays:
            relays.append(package)
    text = " <- ".join(frames[:2])
    return f"{text}, via {', '.join(relays)}" if relays and text else text


# Where a rank waits for the members of a new group to join: a TCPStore server waiting for its
# clients (``wait_for_workers``), torch's rendezvous handlers, process group creation.
RENDEZVOUS_FUNCTIONS = frozenset({
    "rendezvous", "_create_c10d_store", "_tcp_rendezvous_handler", "_env_rendezvous_handler",
    "_file_rendezvous_handler", "init_process_group", "new_group", "new_subgroups",
    "_new_process_group_helper", "_store_based_barrier", "init_device_mesh",
})


def _main_frames(stack: str) -> list[tuple[str, str, str, str]]:
    """(path, line, function, source) of the main thread's frames, outermost first, from our
    format or faulthandler's (most recent call first)."""
    lines = stack.splitlines()
    start = next((i for i, l in enumerate(lines) if "MainThread" in l or "Current thread" in l), 0)
    frames = []
    for i in range(start + 1, len(lines)):
        l = lines[i].strip()
        if l.startswith("Thread ") or (l.startswith("Current thread") and frames):
            break
        if not l.startswith("File "):
            continue
        try:
            path, rest = l.split('"')[1], l.split('"', 2)[2]
            line = rest.split("line ", 1)[1].split(",")[0].split()[0]
            func = rest.rsplit("in ", 1)[1].strip()
        except IndexError:
            continue
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        frames.append((path, line, func, "" if nxt.startswith("File ") else nxt))
    if lines and "most recent call first" in lines[start]:
        frames.reverse()
    return frames


def _user_frames(stack: str) -> list[tuple[str, str, str, str]]:
    harness = os.sep + "pytest_nccl" + os.sep
    return [f for f in _main_frames(stack or "")
            if not (harness in f[0] and os.sep + "testing" + os.sep not in f[0])]


def stack_top(stack: str) -> str:
    """The innermost frame of the main thread outside pytest_nccl: 'file:line (in f)', the call-site
    form of every headline."""
    frames = _user_frames(stack)
    if not frames:
        return ""
    path, line, func, _ = frames[-1]
    return f"{short_path(path)}:{line} (in {func})"


def stack_source(stack: str) -> str:
    """The source line of the main thread's innermost frame outside pytest_nccl ("time.sleep(60)"):
    what a rank outside any collective is doing there."""
    frames = _user_frames(stack)
    source = frames[-1][3] if frames else ""
    return re.sub(r"\s+#[^'\"]*$", "", source)  # without a trailing comment


def rendezvous_at(stack: str) -> str:
    """'file:line (in f)' of the code that entered a rendezvous, when the main thread waits in one
    (its innermost frame creates a TCPStore or is one of torch's rendezvous / group creation
    functions); else ''."""
    frames = _user_frames(stack)
    if not frames:
        return ""
    path, _, func, source = frames[-1]
    torch_dir = os.sep + "torch" + os.sep + "distributed" + os.sep
    if not ("TCPStore(" in source or (torch_dir in path and func in RENDEZVOUS_FUNCTIONS)):
        return ""
    user = next((f for f in reversed(frames) if torch_dir not in f[0]), frames[-1])
    return f"{short_path(user[0])}:{user[1]} (in {user[2]})"
