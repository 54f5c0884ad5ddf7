"""A failed test's trace folder as ``explain`` reads it: ``<name>.fr/`` holds the ranks' dumps, and
``<name>.json`` beside it what the test knew besides them: how each rank ended (a rank that passed
left the test, it is not stuck), the call sites its tracer saw (the forked ranks dump without
Python frames: symbolizing them costs seconds in a stuck rank), and where the test's numbering of
each group starts in the group's own sequence ids (a group lives across tests). With it, the dumps
give the test's own headline.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..core.records import RankView
from ..core.states import RankState, Reason


@dataclass
class TestTrace:
    """What a test's trace JSON adds to its dumps."""
    path: str
    reason: Reason = Reason.DECIDED
    bound: float = 0.0
    ends: dict[int, dict] = field(default_factory=dict)            # rank -> its status, exit, message, stack
    sites: dict[tuple[int, str, int], str] = field(default_factory=dict)  # (rank, group, sequence id) -> site
    offsets: dict[str, int] = field(default_factory=dict)          # group -> sequence id of the test's #0


def beside(path: str) -> str | None:
    """The trace JSON of a ``<name>.fr`` folder, where there is one."""
    folder = os.path.normpath(path)
    if not (os.path.isdir(folder) and folder.endswith(".fr")):
        return None
    found = folder[:-3] + ".json"
    return found if os.path.isfile(found) else None


def read(path: str) -> TestTrace | None:
    """The trace JSON at ``path``; None where it is not one a test wrote."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        ranks = data["ranks"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    trace = TestTrace(path, bound=float(data.get("bound_s") or 0.0))
    try:
        trace.reason = Reason(data.get("reason") or Reason.DECIDED)
    except ValueError:
        pass
    for rank in ranks:
        r = int(rank["rank"])
        trace.ends[r] = {k: rank.get(k) for k in ("status", "exit_code", "signal", "message", "stack")}
        for rec in rank.get("collectives") or []:
            fr_seq = rec.get("fr_seq")
            if fr_seq is None:
                continue
            if rec.get("site"):
                trace.sites[(r, rec["group"], int(fr_seq))] = " <- ".join(rec["site"])
            trace.offsets.setdefault(rec["group"], int(fr_seq) - int(rec["seq"]))
    return trace


def apply(views: list[RankView], trace: TestTrace) -> None:
    """The test's knowledge on the dumps' views: each rank's end, the call sites, and the test's
    numbering (collectives of earlier tests in the same group are left out)."""
    for view in views:
        end = trace.ends.get(view.rank)
        if end:
            try:
                view.status = RankState(end.get("status") or RankState.RUNNING)
            except ValueError:
                pass
            view.exit_code, view.signal_name = end.get("exit_code"), end.get("signal")
            view.message, view.stack = end.get("message") or "", end.get("stack") or ""
        kept = []
        for rec in view.records:
            offset = trace.offsets.get(rec.pg)
            if offset is not None and rec.fr_seq is not None and not rec.p2p:
                number = rec.fr_seq - offset
                if number < 1:
                    continue  # an earlier test's
                first = rec.number - rec.seq + 1  # the window's first sequence id in this group
                rec.before = max(first - offset - 1, 0)
                rec.seq = number - rec.before
            if rec.fr_seq is not None and not rec.site:
                rec.site = trace.sites.get((view.rank, rec.pg, rec.fr_seq), "")
            kept.append(rec)
        view.records = kept
