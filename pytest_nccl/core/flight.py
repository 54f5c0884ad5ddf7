"""Controller side, pure: read PyTorch Flight Recorder dumps into records and merge them with the
Python-level journal.

The journal knows call sites but only sees collectives issued from Python; the Flight Recorder sees
every collective a process group runs, DDP's C++ reducer and functional collectives included, with
the group's own sequence id (``collective_seq_id``). The tracer stores that id with each Python
record (``fr_seq``), so the two line up exactly. Like torch's flight_recorder ``loader.py``: reading
only, no analysis, no torch.
"""

from __future__ import annotations

import copy
import json

from .groups import DEFAULT, GroupId
from .records import CollectiveRecord
from .states import RecordState, Source

# Backends whose calls return before their work completed (docs/diagnosis.md, "Backends"): their
# entries' state says whether the work of a collective the journal saw return is complete.
STREAM_BACKENDS = frozenset({"nccl", "xccl"})

DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
          "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
          "Bool": "bool"}


def _shapes(sizes: list) -> str:
    if not sizes:
        return ""
    if len(sizes) == 1:
        return str(list(sizes[0]))
    if all(s == sizes[0] for s in sizes):
        return f"{list(sizes[0])}x{len(sizes)}"
    return ";".join(str(list(s)) for s in sizes[:4]) + (";..." if len(sizes) > 4 else "")


def dtype_of(dtypes) -> str:
    """A dump's dtype list as the journal names dtypes: ["BFloat16"] -> "bfloat16"; "" for none."""
    return DTYPES.get(dtypes[0], str(dtypes[0]).lower()) if dtypes else ""


def group_name_of(label: str, group: str = "") -> str:
    """The c10d group name behind a journal label: "default" -> "0", "pg3[0,1]" -> "3"; a label
    with the user's name ("tp[2,3]") carries it in the record's ``group`` (journal v2)."""
    if group:
        return group
    if label == DEFAULT:
        return "0"
    name = GroupId.parse(label).name
    return name[2:] if name.startswith("pg") else name


def records_from_dump(text: str | None, rank: int, since_ns: int = 0) -> list[CollectiveRecord]:
    """Non-p2p entries of named groups created at or after ``since_ns`` (the call's start, wall
    clock); none without a readable dump (``text`` None: the rank sent none). An entry of a stream
    backend (NCCL) says in ``detail["work"]`` whether its work completed."""
    if text is None:
        return []
    try:
        dump = json.loads(text)
    except (TypeError, ValueError):
        return []
    out = []
    entries = [e for e in dump.get("entries", []) if not e.get("is_p2p")]
    for entry in entries:
        created = int(entry.get("time_created_ns") or 0)
        if created < since_ns:
            continue
        name = str((entry.get("process_group") or ["?"])[0])
        if not name:  # a backend built over a store of its own, never named by c10d: a side group the
            continue  # tracer journals in Python, or a backend's own internals (the NCCL model's gloo)
        backend, _, op = str(entry.get("profiling_name", "?")).rpartition(":")
        done = bool(entry.get("retired")) or entry.get("state") == "completed"
        detail = {"work": "done" if done else "pending"} if backend in STREAM_BACKENDS else {}
        out.append(CollectiveRecord(
            rank=rank, pg="default" if name == "0" else f"pg{name}", seq=0, op=op,
            shapes=_shapes(entry.get("input_sizes") or []),
            dtype=dtype_of(entry.get("input_dtypes")),
            async_op=True, state=RecordState.COMPLETED if entry.get("retired") else RecordState.ENTERED,
            t_start=(created - since_ns) / 1e9 if since_ns else 0.0, source=Source.FLIGHT_RECORDER,
            fr_seq=int(entry.get("collective_seq_id") or 0), detail=detail))
    return out


def with_flight_recorder(journals: dict[int, list[CollectiveRecord]], fr_json: dict[int, str],
                         since_ns: int = 0) -> dict[int, list[CollectiveRecord]]:
    """The journals with every rank's Flight Recorder dump (its JSON text) merged in: the one merge
    every transport uses. The records are copied (merging renumbers them), the journals kept as they
    were."""
    dumps = {r: records_from_dump(text, r, since_ns) for r, text in fr_json.items() if text}
    return merge({r: [copy.copy(rec) for rec in recs] for r, recs in journals.items()}, dumps)


def merge(journals: dict[int, list[CollectiveRecord]],
          dumps: dict[int, list[CollectiveRecord]]) -> dict[int, list[CollectiveRecord]]:
    """Every rank's Python records plus the Flight Recorder entries they do not cover; a Python record
    the journal completed whose NCCL work the Flight Recorder shows incomplete is in flight.

    A group's records are numbered from its sequence ids, relative to the smallest one any rank
    recorded in this call: the same numbering on every rank even when one rank's ring buffer has
    already dropped its oldest entries. A group whose Python records lack sequence ids (Flight
    Recorder off) keeps the tracer's own numbering."""
    merged = {rank: _combine(journals[rank], dumps.get(rank, [])) for rank in journals}
    base: dict[str, int] = {}
    unnumbered: set = set()
    for records in merged.values():
        for rec in records:
            if rec.fr_seq is None:
                unnumbered.add(rec.pg)
            else:
                base[rec.pg] = min(base.get(rec.pg, rec.fr_seq), rec.fr_seq)
    for records in merged.values():
        _renumber([r for r in records if r.pg in base and r.pg not in unnumbered and not GroupId.parse(r.pg).p2p], base)
    return merged


def _renumber(records: list[CollectiveRecord], base: dict[str, int]) -> None:
    """One rank's records of numbered groups: position from the group's sequence id, less the ids
    that composite ops before it used beyond their first (all_gather_object runs two collectives,
    and is one record)."""
    extra: dict[str, int] = {}
    for rec in sorted(records, key=lambda r: r.fr_seq or 0):
        fr_seq = rec.fr_seq or 0  # every record here is numbered (merge() keeps the others apart)
        rec.seq = fr_seq - base[rec.pg] + 1 - extra.get(rec.pg, 0)
        rec.before = 0  # numbered by the Flight Recorder now, not by a window
        if rec.fr_seq_end is not None and rec.fr_seq_end > fr_seq:
            extra[rec.pg] = extra.get(rec.pg, 0) + rec.fr_seq_end - fr_seq


def _combine(python: list[CollectiveRecord], recorded: list[CollectiveRecord]) -> list[CollectiveRecord]:
    """One rank: its Python records plus the entries they do not cover, group by group, each group
    in its own order (the journal's and the Flight Recorder's clocks have different origins, so
    times do not interleave exactly)."""
    labels: dict[str, str] = {}
    for rec in python:
        if not GroupId.parse(rec.pg).p2p:
            labels.setdefault(group_name_of(rec.pg, rec.group), rec.pg)
    known: dict[tuple[str, int], CollectiveRecord] = {
        (group_name_of(r.pg, r.group), seq): r for r in python if r.fr_seq is not None
        for seq in range(r.fr_seq, (r.fr_seq_end or r.fr_seq) + 1)}
    by_pg: dict[str, list[CollectiveRecord]] = {}
    for rec in python:
        by_pg.setdefault(rec.pg, []).append(rec)
    for rec in recorded:
        name = group_name_of(rec.pg)
        covered = known.get((name, rec.fr_seq or 0))
        if covered is not None:
            if rec.detail.get("work") == "pending" and covered.state == RecordState.COMPLETED:
                # its call returned, its work did not complete: NCCL's wait_tensor (a functional
                # collective), or the journal's C line not polled yet
                covered.state = RecordState.IN_FLIGHT
            continue
        rec.pg = labels.get(name, rec.pg)
        by_pg.setdefault(rec.pg, []).append(rec)
    combined = []
    for records in by_pg.values():
        if all(r.fr_seq is not None for r in records):
            records.sort(key=lambda r: r.fr_seq or 0)  # every one is numbered here
        combined.extend(records)
    return combined
