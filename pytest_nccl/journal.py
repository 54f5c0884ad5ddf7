"""A per-rank, append-only record of the collectives a rank entered, readable after the rank died.

The rank writes a line with ``os.write`` *before* it enters a collective: the line is in the kernel's
page cache the moment the call returns, so a SIGABRT inside gloo (or a SIGKILL) cannot lose it, and
the controller can read it while the rank is stuck. One file per rank per call, tab-separated:

    E <pg> <seq> <op> <async> <t> <shapes> <dtype> <fr_seq> <site>   entered
    W <pg> <seq> <t>                                                 waits on an async op (Work.wait)
    C <pg> <seq> <t>                                                 completed
    R <pg> <seq> <fr_seq_end>                                        composite op (all_gather_object):
                                                                     last group sequence id it used

Imported by ranks: standard library only.
"""

from __future__ import annotations

import os

from .records import COMPLETED, ENTERED, WAITING, CollectiveRecord


class JournalWriter:
    """The rank's end of a journal. The tracer's hot path writes E, C and R lines to ``fd`` itself
    (a method call per collective is measurable); the rarer lines go through these methods."""

    __slots__ = ("fd",)

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def waiting(self, pg, seq, t):
        os.write(self.fd, f"W\t{pg}\t{seq}\t{t:.6f}\n".encode())

    def completed(self, pg, seq, t):
        os.write(self.fd, f"C\t{pg}\t{seq}\t{t:.6f}\n".encode())

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def parse_journal(text: str, rank: int) -> list[CollectiveRecord]:
    """Records in the order the rank entered them. A torn last line (the rank died mid-write) is
    dropped; an unknown line is ignored rather than failing the report."""
    records: list[CollectiveRecord] = []
    by_key: dict[tuple[str, int], CollectiveRecord] = {}
    for line in text.split("\n"):
        fields = line.split("\t")
        kind = fields[0]
        try:
            if kind == "E" and len(fields) >= 10:
                rec = CollectiveRecord(
                    rank=rank, pg=fields[1], seq=int(fields[2]), op=fields[3],
                    async_op=fields[4] == "1", t_start=float(fields[5]), shapes=fields[6],
                    dtype=fields[7], fr_seq=int(fields[8]) if fields[8] not in ("", "None") else None,
                    site=fields[9], state=ENTERED)
                records.append(rec)
                by_key[(rec.pg, rec.seq)] = rec
            elif kind == "R" and len(fields) >= 4:
                rec = by_key.get((fields[1], int(fields[2])))
                if rec is not None:
                    rec.fr_seq_end = int(fields[3])
            elif kind in ("W", "C") and len(fields) >= 4:
                rec = by_key.get((fields[1], int(fields[2])))
                if rec is not None:
                    if kind == "W":
                        if rec.state != COMPLETED:
                            rec.state = WAITING
                    else:
                        rec.state = COMPLETED
                        rec.duration = max(0.0, float(fields[3]) - rec.t_start)
        except ValueError:
            continue
    return records


def read_journal(path: str, rank: int) -> list[CollectiveRecord]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_journal(f.read(), rank)
    except FileNotFoundError:
        return []


class JournalTail:
    """A journal read as it grows (``pytest-nccl watch`` follows a running job): ``feed`` takes the
    bytes that followed the last chunk and returns the records they entered; their W, C and R lines
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
            fields = line.split("\t")
            kind = fields[0]
            try:
                if kind == "E" and len(fields) >= 10:
                    rec = CollectiveRecord(
                        rank=self.rank, pg=fields[1], seq=int(fields[2]), op=fields[3],
                        async_op=fields[4] == "1", t_start=float(fields[5]), shapes=fields[6],
                        dtype=fields[7], fr_seq=int(fields[8]) if fields[8] not in ("", "None") else None,
                        site=fields[9], state=ENTERED)
                    new.append(rec)
                    self.by_key[(rec.pg, rec.seq)] = rec
                elif kind in ("W", "C", "R") and len(fields) >= 4:
                    rec = self.by_key.get((fields[1], int(fields[2])))
                    if rec is None:
                        continue
                    if kind == "R":
                        rec.fr_seq_end = int(fields[3])
                    elif kind == "W":
                        if rec.state != COMPLETED:
                            rec.state = WAITING
                    else:
                        rec.state = COMPLETED
                        rec.duration = max(0.0, float(fields[3]) - rec.t_start)
            except ValueError:
                continue
        return new

    def forget(self, pg: str, upto: int) -> None:
        """Drop the records of ``pg`` numbered up to ``upto`` (the reader keeps a window)."""
        for key in [k for k in self.by_key if k[0] == pg and k[1] <= upto]:
            del self.by_key[key]
