"""A per-rank, append-only record of the collectives a rank entered, readable after the rank died.

The rank writes a line with ``os.write`` *before* it enters a collective: the line is in the kernel's
page cache the moment the call returns, so a SIGABRT inside gloo (or a SIGKILL) cannot lose it, and
the controller can read it while the rank is stuck. One file per rank per call, tab-separated:

    E <pg> <seq> <op> <async> <t> <shapes> <dtype> <fr_seq> <site> [<args>]   entered
    W <pg> <seq> <t> [<i>]                                         waits on an async op (Work.wait,
                                                                   a functional op's wait_tensor)
    Q <pg> <seq> <t> [<i>]                                         (v4) returned, not completed: the
                                                                   call (or Work.wait) returned before
                                                                   its work did (NCCL: enqueued on a
                                                                   stream); its C line comes when the
                                                                   work completes (Work.is_completed)
    C <pg> <seq> <t> [<i>]                                         completed
    R <pg> <seq> <fr_seq_end>                                      composite op (all_gather_object):
                                                                   last group sequence id it used
    O outside <seq> <what> 0 <t> ... <site> [<args>]               (v3) waits outside any collective:
                                                                   a store or a group being created,
                                                                   a store read (trace_rendezvous.py)
    U outside <seq> <args>                                         (v3) what such a wait learned since
                                                                   (which members joined)

``<t>``: seconds since the call started, as a decimal ("0.001520") or as an integer count of
nanoseconds written "<ns>e-9" (the tracer's hot path: cheaper to format); both read with float().
A synchronous collective's C line may come with the next line the rank writes (at most
``trace_completion.FLUSH_EVERY`` later): lines are matched by (pg, seq), never by their order.

``<site>`` may end in "\x1f<thread name>": the collective was issued by a thread other than the
rank's main one (the record's ``thread``).

``<args>`` (format v2; absent in v1 journals, which still read) is what every rank must agree on,
space-separated ``key=value`` items, each optional:

    red=MAX             the reduce op (all_reduce, reduce, reduce_scatter*, all_reduce_coalesced)
    root=1              the root as a GLOBAL rank (broadcast/scatter src, reduce/gather dst, object ops)
    split=2,2/1,3       all_to_all(_single): per group rank, what this rank sends / expects to receive
    p2p=s1:0,r*:2       point-to-point transfers, in call order: s(end)/r(ecv) (S/R: object lists),
                        the GLOBAL peer (* = any source), ':' the tag; several for batch_isend_irecv,
                        each with its tensor (v5, optional): "s1:0:4x8:float32" (dims joined by
                        'x', none for a scalar); a single send/recv's tensor is the E line's
    g=4                 the c10d group name (the label is the user's: "tp[2,3]")

The arguments of O and U lines (v3), each optional, go to the record's ``detail``:

    store=host:port     the store (a TCPStore's address, else its type)
    n=3                 members of the store or group; r=1: this rank's rank among them
    role=server         a TCPStore's role (its server waits for every member to connect)
    name=weights        the group's name; key=ready: the key a store read waits for
    joined=0,1          the members whose address is in the group's store ("-": none yet)

``<i>`` on W, Q and C: the index of the transfer of a batch_isend_irecv whose Work it is (one Work per
transfer); without it, the line is about every transfer of the record.

Imported by ranks: standard library only.
"""

from __future__ import annotations

import os
from enum import Enum

from .records import P2P, CollectiveRecord
from .states import RecordState, Source


class Line(str, Enum):
    """A journal line's kind, its first field (the writers put the letter itself: the tracer's hot
    path formats bytes)."""
    ENTERED = "E"
    WAITS = "W"
    COMPLETED = "C"
    IN_FLIGHT = "Q"   # returned before its work completed (v4)
    RESULT = "R"      # a composite op's last group sequence id
    OUTSIDE = "O"     # a wait outside any collective
    UPDATE = "U"      # what such a wait learned since


THREAD_MARK = "\x1f"  # ends a site, before the issuing thread's name (rank/trace_sites.py writes it)


class JournalWriter:
    """The rank's end of a journal. The tracer's hot path writes E, C and R lines to ``fd`` itself
    (a method call per collective is measurable); the rarer lines go through these methods."""

    __slots__ = ("fd",)

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def waiting(self, pg, seq, t, index=-1):
        os.write(self.fd, f"W\t{pg}\t{seq}\t{t:.6f}{'' if index < 0 else f'	{index}'}\n".encode())

    def completed(self, pg, seq, t, index=-1):
        os.write(self.fd, f"C\t{pg}\t{seq}\t{t:.6f}{'' if index < 0 else f'	{index}'}\n".encode())

    def close(self) -> int:
        """End the journal; returns the descriptor every later write goes to (``/dev/null``). A
        thread of the job can race the end of a call (a collective or a ``Work.wait`` entered before
        it ended, the flusher): its line goes nowhere, where a descriptor of -1 raised EBADF into the
        job. The journal's own descriptor is closed one writer later, so a thread that read its
        number just before cannot write into a file that got the number since."""
        global _retired
        if self.fd >= 0 and (_null is None or self.fd != _null[0]):  # not closed before
            _close_if_same(_retired)
            _retired = _held(self.fd)
        self.fd = _null_fd()
        return self.fd


_null: tuple[int, os.stat_result] | None = None  # /dev/null, where closed journals write
_retired: tuple[int, os.stat_result] | None = None  # the last closed journal's descriptor, still open


def _held(fd: int) -> tuple[int, os.stat_result] | None:
    """``fd`` with the file it is now, to tell later whether it still is (``_same``)."""
    try:
        return fd, os.fstat(fd)
    except OSError:
        return None


def _same(held: tuple[int, os.stat_result]) -> bool:
    """``held``'s descriptor still the file it was (a job may close descriptors it does not own)."""
    fd, was = held
    try:
        now = os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (was.st_dev, was.st_ino)


def _close_if_same(held: tuple[int, os.stat_result] | None) -> None:
    if held is not None and _same(held):
        os.close(held[0])


def _null_fd() -> int:
    global _null
    if _null is None or not _same(_null):
        _null = _held(os.open(os.devnull, os.O_WRONLY))
        assert _null is not None  # opened just now
    return _null[0]


def transfer_text(send: bool, peer, tag: int, dims=None, dtype: str = "") -> str:
    """One transfer of a ``p2p=`` argument: "s1:0", or with its tensor "r0:0:4x8:float32" (``dims``:
    its shape as a sequence of ints; None: not known)."""
    head = f"{'s' if send else 'r'}{'*' if peer is None else peer}:{tag}"
    return head if dims is None else f"{head}:{'x'.join(map(str, dims))}:{dtype}"


def parse_p2p(text: str) -> list[P2P]:
    out = []
    for item in text.split(","):
        if len(item) < 2 or item[0] not in "srSR":
            continue
        peer, tag, *tensor = item[1:].split(":")
        p = P2P(send=item[0] in "sS", peer=None if peer == "*" else int(peer), tag=int(tag or 0), obj=item[0] in "SR")
        if len(tensor) == 2:  # v5: the transfer's tensor, as a record's shapes read
            p.shape, p.dtype = f"[{', '.join(tensor[0].split('x')) if tensor[0] else ''}]", tensor[1]
        out.append(p)
    return out


def _apply_args(rec: CollectiveRecord, text: str) -> None:
    for item in text.split(" "):
        key, _, value = item.partition("=")
        if key == "red":
            rec.reduce_op = value
        elif key == "root":
            rec.root = int(value)
        elif key == "split":
            rec.splits = value
        elif key == "p2p":
            rec.p2p = parse_p2p(value)
        elif key == "g":
            rec.group = value


def _apply_detail(rec: CollectiveRecord, text: str) -> None:
    for item in text.split(" "):
        key, _, value = item.partition("=")
        if key:
            rec.detail[key] = value


def _entered(fields: list, rank: int, with_args: bool = True) -> CollectiveRecord:
    """The record of an E or O line (at least 10 fields); ``with_args``: read an E line's <args>."""
    site, _, thread = fields[9].partition(THREAD_MARK)
    rec = CollectiveRecord(
        rank=rank, pg=fields[1], seq=int(fields[2]), op=fields[3], async_op=fields[4] == "1",
        t_start=float(fields[5]), shapes=fields[6], dtype=fields[7],
        fr_seq=int(fields[8]) if fields[8] not in ("", "None") else None, site=site, thread=thread,
        state=RecordState.ENTERED)
    if fields[0] == Line.OUTSIDE:
        rec.source = Source.OUTSIDE
        if len(fields) > 10 and fields[10]:
            _apply_detail(rec, fields[10])
    elif with_args and len(fields) > 10 and fields[10]:
        _apply_args(rec, fields[10])
        if len(rec.p2p) == 1 and not rec.p2p[0].shape and rec.shapes:  # send/recv: the E line's tensor
            rec.p2p[0].shape, rec.p2p[0].dtype = rec.shapes, rec.dtype
    return rec


_MARKS = {Line.WAITS: RecordState.WAITING, Line.IN_FLIGHT: RecordState.IN_FLIGHT,
          Line.COMPLETED: RecordState.COMPLETED}


def _mark(rec: CollectiveRecord, kind: str, t: float, index: int) -> None:
    """A W, Q or C line: for one transfer of a batch, or for the whole record. Completed stays."""
    new = _MARKS[Line(kind)]
    if rec.p2p:
        for i, p in enumerate(rec.p2p):
            if index < 0 or i == index:
                if new == RecordState.COMPLETED or p.state != RecordState.COMPLETED:
                    p.state = new
        states = {p.state for p in rec.p2p}
        state = (RecordState.COMPLETED if states == {RecordState.COMPLETED} else
                 RecordState.WAITING if RecordState.WAITING in states else
                 RecordState.IN_FLIGHT if RecordState.IN_FLIGHT in states else RecordState.ENTERED)
    else:
        state = new if new == RecordState.COMPLETED or rec.state != RecordState.COMPLETED else RecordState.COMPLETED
    if state == RecordState.COMPLETED and rec.state != RecordState.COMPLETED:
        rec.duration = max(0.0, t - rec.t_start)
    rec.state = state


def _read_line(line: str, rank: int, by_key: dict, with_args: bool = True) -> CollectiveRecord | None:
    """One journal line: the record it enters (E, O lines; ``by_key`` learns it), else None once
    applied to the record it names (U, R, W, Q, C lines). A line that cannot be read is skipped."""
    fields = line.split("\t")
    kind = fields[0]
    try:
        if kind in (Line.ENTERED, Line.OUTSIDE) and len(fields) >= 10:
            entered = _entered(fields, rank, with_args=with_args)
            by_key[(entered.pg, entered.seq)] = entered
            return entered
        rec = by_key.get((fields[1], int(fields[2]))) if len(fields) >= 4 else None
        if rec is None:
            return None
        if kind == Line.UPDATE:
            _apply_detail(rec, fields[3])
        elif kind == Line.RESULT:
            rec.fr_seq_end = int(fields[3])
        elif kind in _MARKS:
            _mark(rec, kind, float(fields[3]), int(fields[4]) if len(fields) > 4 and fields[4] else -1)
    except ValueError:
        pass
    return None


def transfers_entered(lines: bytes, rank: int) -> list[CollectiveRecord]:
    """The point-to-point records that the whole journal lines ``lines`` enter, with their transfers
    (the watch's pairing check): every other line is skipped unread."""
    out: list[CollectiveRecord] = []
    if b":p2p\t" not in lines:  # a job without transfers: one scan in C, no line split
        return out
    for line in lines.split(b"\n"):
        if line.startswith(b"E\t") and b":p2p\t" in line:
            entered = _read_line(line.decode("utf-8", errors="replace"), rank, {})
            if entered is not None:
                out.append(entered)
    return out


def parse_journal(text: str, rank: int) -> list[CollectiveRecord]:
    """Records in the order the rank entered them. A torn last line (the rank died mid-write) is
    dropped; an unknown line is ignored rather than failing the report."""
    records: list[CollectiveRecord] = []
    by_key: dict[tuple[str, int], CollectiveRecord] = {}
    lines = text.split("\n")
    if lines and not text.endswith("\n"):
        lines.pop()  # torn: the rank died (or is) mid-write
    for line in lines:
        entered = _read_line(line, rank, by_key)
        if entered is not None:
            records.append(entered)
    return records


def read_journal(path: str, rank: int) -> list[CollectiveRecord]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_journal(f.read(), rank)
    except FileNotFoundError:
        return []


class JournalTail:
    """A journal read as it grows (``pytest-nccl watch`` follows a running job): ``feed`` takes the
    bytes that followed the last chunk and returns the records they entered; their W, Q, C and R lines
    may update records of earlier chunks. A line cut at the end of a chunk waits for the next one.
    The same format as ``parse_journal``, whose whole-file reading the forked and SPMD modes keep."""

    def __init__(self, rank: int):
        self.rank = rank
        self.by_key: dict[tuple[str, int], CollectiveRecord] = {}
        self._rest = b""

    def feed(self, data: bytes) -> list[CollectiveRecord]:
        data = self._rest + data
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        new: list[CollectiveRecord] = []
        for line in data[:cut].decode("utf-8", errors="replace").split("\n"):
            entered = _read_line(line, self.rank, self.by_key, with_args=False)
            if entered is not None:
                new.append(entered)
        return new

    def forget(self, pg: str, upto: int) -> None:
        """Drop the records of ``pg`` numbered up to ``upto`` (the reader keeps a window)."""
        for key in [k for k in self.by_key if k[0] == pg and k[1] <= upto]:
            del self.by_key[key]
