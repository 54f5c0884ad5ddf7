"""A failed call's collectives as a Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open as they are (``<name>.trace.json`` in ``--nccl-trace-dir``).

Pure: built from the ``RankView``s and the ``Diagnosis`` the report already holds, after the call.

- a process per node (host), a thread per rank: ``pid`` = node index + 1, ``tid`` = rank + 1
  (pid 0 and tid 0 are special in Perfetto), named by ``process_name`` / ``thread_name`` metadata
  events (``ph: "M"``) and sorted by rank;
- a complete slice (``ph: "X"``) per collective from entered to completed, or to the end of its rank
  (the verdict, or the moment the rank died or left) for one never completed, named
  ``op #seq group``, with shapes, dtype, peer/root, the call site and the state in ``args``;
- the position the diagnosis points at (the first divergence, or the collective every rank hangs in):
  ``args.diverging: true`` on those slices, an instant event on each member's track there, a flow
  across the members' slices, and for a member that never entered it an instant at its end;
- the verdict as a global instant event (``ph: "i"``, ``s: "g"``) carrying the headline;
- timestamps in microseconds since the call started (the records' own clock).
"""

from __future__ import annotations

import json
import platform

from ..core.diagnosis import Diagnosis
from ..core.records import CollectiveRecord, RankView
from ..core.sites import short_path
from ..core.states import RankState, RecordState, Source

US = 1_000_000
CATEGORY = "collective"


def _us(seconds: float) -> float:
    return round(max(0.0, seconds) * US, 3)


def slice_name(rec: CollectiveRecord) -> str:
    return f"{rec.op} #{rec.seq} {rec.pg}"


def rank_end(view: RankView, elapsed: float) -> float:
    """Where a rank's unfinished collectives end: when it died or left the test, else the verdict."""
    if view.status != RankState.RUNNING and view.finished_at is not None:
        return min(view.finished_at, elapsed) if elapsed else view.finished_at
    return elapsed


def position_of(diagnosis: Diagnosis | None) -> tuple[str, int] | None:
    """(group, seq) the diagnosis points at: the first divergence, or where every rank hangs."""
    if diagnosis is None:
        return None
    if diagnosis.divergence is not None:
        return diagnosis.divergence.pg, diagnosis.divergence.seq
    if diagnosis.pg is not None and diagnosis.seq is not None:
        return diagnosis.pg, diagnosis.seq
    return None


class _Args:
    """``args`` of each slice; the part records share (op, shapes, dtype, site, ...) built once: a
    long run repeats a few kinds thousands of times, and relative paths cost."""

    def __init__(self):
        self.sites: dict[str, str] = {}

    def site(self, site: str) -> str:
        short = self.sites.get(site)
        if short is None:
            short = self.sites[site] = " <- ".join(short_path(s) for s in site.split(" <- ") if s)
        return short

    def of(self, rec: CollectiveRecord) -> dict:
        args = {"group": rec.pg, "seq": rec.seq, "state": rec.state}  # op: the name; rank: the track
        if rec.shapes:
            args["shapes"] = rec.shapes
        if rec.dtype:
            args["dtype"] = rec.dtype
        for name in ("peer", "root"):  # on records that carry them
            value = getattr(rec, name, None)
            if value is not None:
                args[name] = value
        if rec.async_op:
            args["async"] = True
        if rec.site:
            args["site"] = self.site(rec.site)
        if rec.source != Source.PYTHON:
            args["source"] = rec.source
        if rec.fr_seq is not None:
            args["fr_seq"] = rec.fr_seq
        return args


def record_args(rec: CollectiveRecord) -> dict:
    """What a slice shows when selected: only the fields a record has."""
    return _Args().of(rec)


def trace_events(nodeid: str, ranks: list[RankView], diagnosis: Diagnosis | None, elapsed: float,
                 bound: float, backend: str = "", nodes: dict[int, str] | None = None) -> dict:
    """The trace-event JSON object (``{"traceEvents": [...], ...}``). ``nodes``: rank -> host name
    (default: every rank on this host)."""
    nodes = nodes or {}
    here = platform.node() or "localhost"
    hosts: list[str] = []
    for view in ranks:
        host = nodes.get(view.rank, here)
        if host not in hosts:
            hosts.append(host)
    pid_of = {view.rank: hosts.index(nodes.get(view.rank, here)) + 1 for view in ranks}
    events: list[dict] = []
    for i, host in enumerate(hosts):
        members = [v.rank for v in ranks if pid_of[v.rank] == i + 1]
        first = members[0] + 1  # tid 0 would make a thread track of its own in Perfetto
        events.append({"ph": "M", "name": "process_name", "pid": i + 1, "tid": first,
                       "args": {"name": f"node {i} ({host}): ranks {_span(members)}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": i + 1, "tid": first,
                       "args": {"sort_index": i}})
    for view in ranks:
        pid, tid = pid_of[view.rank], view.rank + 1
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"rank {view.rank}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": view.rank}})

    position = position_of(diagnosis)
    kind = diagnosis.kind if diagnosis is not None else ""
    marked: list[tuple[int, dict]] = []   # (rank, slice) at the diagnosed position
    make_args = _Args().of
    for view in ranks:
        pid, tid = pid_of[view.rank], view.rank + 1
        end = rank_end(view, elapsed)
        for rec in view.records:
            start = rec.t_start
            if rec.state == RecordState.COMPLETED:
                stop = start + (rec.duration or 0.0)
            else:
                stop = max(start, end)
            args = make_args(rec)
            ev = {"ph": "X", "name": slice_name(rec), "cat": CATEGORY if rec.source == Source.PYTHON else rec.source,
                  "pid": pid, "tid": tid, "ts": _us(start), "dur": round(max(0.0, stop - start) * US, 3),
                  "args": args}
            if rec.state != RecordState.COMPLETED:
                args["ends"] = "verdict" if end == elapsed else f"rank {view.status}"
            if position is not None and (rec.pg, rec.seq) == position:
                args["diverging"] = True
                if kind:
                    args["diagnosis"] = kind
                marked.append((view.rank, ev))
            events.append(ev)
        if view.status != RankState.RUNNING and view.finished_at is not None:
            args = {"status": str(view.status)}
            if view.message:
                args["message"] = view.message
            if view.exit_code is not None or view.signal_name:
                args["exit"] = view.exit_description
            events.append({"ph": "i", "s": "t", "name": f"rank {view.rank} {_ended(view)}", "cat": "rank",
                           "pid": pid, "tid": tid, "ts": _us(view.finished_at), "args": args})

    if position is not None:
        pg, seq = position
        for _, ev in marked:
            events.append({"ph": "i", "s": "t", "name": f"diverges here: {ev['name']}", "cat": "diagnosis",
                           "pid": ev["pid"], "tid": ev["tid"], "ts": ev["ts"],
                           "args": {"diverging": True, "kind": kind, "group": pg, "seq": seq}})
        marked.sort(key=lambda item: item[1]["ts"])
        if len(marked) > 1:
            for i, (_, ev) in enumerate(marked):
                ph = "s" if i == 0 else "f" if i == len(marked) - 1 else "t"
                flow = {"ph": ph, "id": 1, "name": "divergence", "cat": "diagnosis", "pid": ev["pid"],
                        "tid": ev["tid"], "ts": ev["ts"]}
                if ph != "s":
                    flow["bp"] = "e"
                events.append(flow)
        div = diagnosis.divergence if diagnosis is not None else None
        for rank in (div.absent if div is not None else []):
            if 0 <= rank < len(ranks):
                view = ranks[rank]
                events.append({"ph": "i", "s": "t", "name": f"never entered {pg} #{seq}", "cat": "diagnosis",
                               "pid": pid_of[rank], "tid": rank + 1, "ts": _us(rank_end(view, elapsed)),
                               "args": {"diverging": True, "kind": kind, "group": pg, "seq": seq,
                                        "status": str(view.status)}})
    if diagnosis is not None:
        events.append({"ph": "i", "s": "g", "name": f"verdict: {diagnosis.kind}", "cat": "diagnosis",
                       "pid": 1, "tid": (ranks[0].rank + 1) if ranks else 1, "ts": _us(elapsed),
                       "args": {"headline": diagnosis.headline, "kind": diagnosis.kind,
                                "ranks": list(diagnosis.ranks), "group": diagnosis.pg, "seq": diagnosis.seq}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"test": nodeid, "backend": backend, "world": len(ranks), "elapsed_s": round(elapsed, 3),
                      "bound_s": bound, "headline": diagnosis.headline if diagnosis is not None else "",
                      "generator": "pytest-nccl"},
    }


def timeline_json(nodeid: str, ranks: list[RankView], diagnosis: Diagnosis | None, elapsed: float,
                  bound: float, backend: str = "", nodes: dict[int, str] | None = None) -> str:
    """``trace_events`` as compact JSON text, one event a line (diffable, and small)."""
    data = trace_events(nodeid, ranks, diagnosis, elapsed, bound, backend, nodes)
    events = data.pop("traceEvents")
    head = json.dumps(data)[1:-1]
    encode = json.JSONEncoder(separators=(",", ":")).encode
    lines = ",\n".join(map(encode, events))
    return '{"traceEvents": [\n' + lines + "\n], " + head + "}\n"


def _ended(view: RankView) -> str:
    if view.status == RankState.DEAD:
        return view.exit_description
    return f"left the test ({view.status})"


def _span(members: list[int]) -> str:
    if members and members == list(range(members[0], members[-1] + 1)) and len(members) > 2:
        return f"{members[0]}-{members[-1]}"
    return ",".join(map(str, members))
