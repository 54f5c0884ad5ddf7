"""Controller side: turn a call's records and diagnosis into what a person reads.

- ``report_text`` / ``format_report``: headline, the collective table (``table.py``), where each rank is
  now, tracebacks (identical ones once), stacks.
- ``trace_json``: the machine-readable trace written by ``--nccl-trace-dir``.
- ``NcclLongRepr``: the failure report pytest shows: the exception class and the headline first, the
  trace files it wrote (``trace_files``) last.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from ..core.diagnosis import Diagnosis
from ..core.diagnosis.outside import NO_FUNCTION
from ..core.diagnosis.outside import place as place_of
from ..core.diagnosis.wording import TEST, Words, waiting_for, where
from ..core.groups import rank_ranges
from ..core.records import RankView
from ..core.reports import CallOutcome
from ..core.sites import short_path, short_site
from ..core.states import RankState, RecordState
from .table import format_table, one_column_each


def format_divergence(diagnosis: Diagnosis) -> str:
    div = diagnosis.divergence
    if div is None:
        return ""
    first = next(iter(div.records.values()), None)
    lines = [f"at collective #{first.number if first is not None else div.seq} of group {div.pg}:"]
    fold = not one_column_each(len(div.records) + len(div.absent))  # then without durations, which differ
    texts = {}
    for r, rec in sorted(div.records.items()):
        args = "".join(f" {text}" for text, shown in ((f"op={rec.reduce_op}", rec.reduce_op),
                                                      (rec.root_text, rec.root is not None),
                                                      (f"splits={rec.splits}", rec.splits)) if shown)
        took = "" if rec.duration is None or fold else f" in {rec.duration * 1000:.1f} ms"
        texts[r] = (f"{rec.op} shapes={rec.shapes or '-'} dtype={rec.dtype or '-'}{args} "
                    f"{'async ' if rec.async_op else ''}{rec.state}{took}")
        if rec.site:
            texts[r] += f"\n          at {short_site(rec.site, 4)}{f' (thread {rec.thread})' if rec.thread else ''}"
    texts.update(dict.fromkeys(div.absent, "never entered it"))
    pairs = _folded(texts) if fold else [(f"rank {r}", text) for r, text in texts.items()]
    lines += [f"  {who}: {text}" for who, text in pairs]
    return "\n".join(lines)


def _folded(texts: dict[int, str]) -> list[tuple[str, str]]:
    """(ranks, text) with the ranks that share a text together: 'rank 3', 'ranks 0-2'."""
    by_text: dict[str, list[int]] = {}
    for r, text in sorted(texts.items()):
        by_text.setdefault(text, []).append(r)
    return [(_who(rs), text) for text, rs in by_text.items()]


def _who(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2'; a long list (a strided group of a large job): '128 ranks (0,8,...,1016)'."""
    text = rank_ranges(ranks)
    if len(text) > 60:
        return f"{len(ranks)} ranks ({ranks[0]},{ranks[1]},...,{ranks[-1]})"
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def format_positions(ranks: list[RankView], words: Words = TEST, counts: dict | None = None) -> str:
    """Where each rank is, ranks in the same place on one line. ``counts``: rank -> {group:
    collectives entered}, where a long job's window holds fewer records than the rank issued."""
    texts = {}
    for v in ranks:
        n = sum(counts[v.rank].values()) if counts and v.rank in counts else len(v.records)
        if v.status == RankState.DEAD:
            cur = v.current
            # where it was when it went: its collective, or its stack's line (written as it died)
            at = f" in {where(cur)}" if cur is not None else f" at {stop}" if (stop := place_of(v, NO_FUNCTION)) else ""
            place = v.exit_description + at
        elif v.status == RankState.RUNNING:
            cur = v.current
            if cur is None:
                place = "running, outside any collective"
            elif cur.state == RecordState.IN_FLIGHT:  # NCCL: at its sync point, waiting for it
                place = f"waits {waiting_for(cur, v)}"
            else:
                place = f"inside {where(cur)} ({cur.state})"
        elif v.status == RankState.UNSEEN and not v.message:  # else the transport's word for where it is
            place = words.unseen
        elif v.status == RankState.PASSED and not v.message:
            place = words.passed
        elif v.status == RankState.FAILED and v.message:
            place = words.raised + v.message
        else:
            place = v.status + (f": {v.message}" if v.message else "")
        texts[v.rank] = f"{place} [{n} collective{'s' if n != 1 else ''}]"
    return "\n".join(f"  {who}: {text}" for who, text in _folded(texts))


def report_text(outcome: CallOutcome, words: Words = TEST) -> str:
    """The report of a call, in a test's words or a job's."""
    return format_report(outcome.views, outcome.diagnosis, outcome.elapsed, outcome.bound, outcome.backend,
                         words, outcome.counts)


def format_report(ranks: list[RankView], diagnosis: Diagnosis | None, elapsed: float, bound: float,
                  backend: str = "", words: Words = TEST, counts: dict | None = None) -> str:
    parts = []
    if diagnosis is not None:
        parts.append(diagnosis.headline)
    parts.append(f"\n-- collective trace ({backend + ', ' if backend else ''}{len(ranks)} ranks, "
                 f"{words.span(elapsed, bound)}) --")
    parts.append(format_table(ranks, diagnosis))
    if diagnosis is not None and diagnosis.divergence is not None:
        parts.append("")
        parts.append(format_divergence(diagnosis))
    parts.append("\n-- where each rank is --")
    parts.append(format_positions(ranks, words, counts))
    # identical tracebacks once, naming the ranks
    tracebacks: dict[str, list[int]] = {}
    for v in ranks:
        if v.status == RankState.FAILED and v.exc_text:
            tracebacks.setdefault(v.exc_text, []).append(v.rank)
    for text, rs in tracebacks.items():
        parts.append(f"\n-- traceback of rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} --")
        parts.append(text.rstrip())
    # identical stacks once too (a stuck world 64 has few distinct ones)
    stacks = {v.rank: _trim_stack(v.stack) for v in ranks
              if v.stack and v.status in (RankState.RUNNING, RankState.DEAD)}
    for who, text in _folded(stacks):
        parts.append(f"\n-- Python stack of {who} (all threads) --")
        parts.append(text)
    return "\n".join(parts)


def _thread_blocks(stack: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    for line in stack.rstrip().splitlines():
        if line.startswith(("Thread ", "Current thread")) or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def _without_harness(stack: str) -> str:
    """Keep the test's frames: drop the fork server and rank loop around the test body (everything
    outside ``rank/loop.py``'s ``run_call``) and the rank's reader thread. Handles both our format
    (outermost first) and faulthandler's (most recent call first)."""
    marker = os.path.join("pytest_nccl", "rank", "loop.py")
    kept = []
    for block in _thread_blocks(stack):
        if any(marker in line and "_reader" in line for line in block):
            continue
        at = next((i for i, line in enumerate(block) if marker in line and "run_call" in line), None)
        if at is None:
            kept.append(block)
        elif "most recent call first" in block[0]:
            kept.append(block[:at])
        else:
            body = block[at + 1:]
            if body and not body[0].lstrip().startswith("File "):
                body = body[1:]  # the source line of run_call's frame
            kept.append(block[:1] + body)
    return "\n".join("\n".join(b) for b in kept)


def _trim_stack(stack: str, max_lines: int = 60) -> str:
    lines = _without_harness(stack).rstrip().splitlines()
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(lines[:8] + [f"  ... {len(lines) - max_lines} lines ..."] + lines[-(max_lines - 8):])


def trace_json(nodeid: str, ranks: list[RankView], diagnosis: Diagnosis | None, elapsed: float,
               bound: float, backend: str, reason: str = "") -> str:
    return json.dumps({
        "test": nodeid, "backend": backend, "world": len(ranks), "elapsed_s": round(elapsed, 3),
        "bound_s": bound, "reason": reason or None,
        "diagnosis": None if diagnosis is None else {
            "kind": diagnosis.kind, "headline": diagnosis.headline, "ranks": diagnosis.ranks,
            "group": diagnosis.pg, "seq": diagnosis.seq},
        "ranks": [{
            "rank": v.rank, "status": v.status, "exit_code": v.exit_code, "signal": v.signal_name,
            "message": v.message, "stack": v.stack or None,
            "collectives": [{
                "group": r.pg, "seq": r.seq, "op": r.op, "shapes": r.shapes, "dtype": r.dtype,
                "async": r.async_op, "state": r.state, "t_start_s": round(r.t_start, 6),
                "duration_s": None if r.duration is None else round(r.duration, 6),
                "site": [short_path(s) for s in r.site.split(" <- ") if s], "source": r.source,
                "fr_seq": r.fr_seq, "reduce_op": r.reduce_op or None, "root": r.root, "splits": r.splits or None,
                "p2p": [{"send": p.send, "peer": p.peer, "tag": p.tag, "state": p.state} for p in r.p2p] or None,
                } for r in v.records],
        } for v in ranks],
    }, indent=1)


def safe_filename(nodeid: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in nodeid)
    return keep[-150:]


def write_trace_dir(directory: str, nodeid: str, text: str, fr_pickles: dict) -> list[str]:
    """One JSON per failed test; Flight Recorder dumps per rank where the ranks produced them, in the
    layout torch's ``fr_trace`` analyzer reads (a folder of per-rank pickles sharing a prefix)."""
    os.makedirs(directory, exist_ok=True)
    base = safe_filename(nodeid)
    written = [os.path.join(directory, base + ".json")]
    with open(written[0], "w") as f:
        f.write(text)
    if fr_pickles:
        fr_dir = os.path.join(directory, base + ".fr")
        os.makedirs(fr_dir, exist_ok=True)
        for rank, data in fr_pickles.items():
            path = os.path.join(fr_dir, f"rank_{rank}")
            with open(path, "wb") as f:
                f.write(data)
            written.append(path)
    return written


def _crash_location(path: str, lineno: int, message: str) -> object:
    """pytest's own crash location (private module): its JUnit and -r summaries read it."""
    try:
        from _pytest._code.code import ReprFileLocation
    except ImportError:
        return SimpleNamespace(path=path, lineno=lineno, message=message)  # the three fields they read
    return ReprFileLocation(path=path, lineno=lineno, message=message)


# What each file of a trace directory is, and what opens it (docs/views.md), in the order listed
TRACE_FILES = (
    (".html", "swimlane page: any browser, offline"),
    (".trace.json", "Perfetto trace: ui.perfetto.dev (Open trace file) or chrome://tracing"),
    (".json", "the collective trace as JSON: jq, scripts"),
)
FR_READER = "python -m torch.distributed.flight_recorder.fr_trace"
# A file counts as this call's when written since it started, less a coarse file system's mtime step
MTIME_SLACK_S = 2.0


def trace_files(directory: str, name: str, since: float | None = None) -> list[tuple[str, str]]:
    """(path, what opens it) of each file of ``name``'s trace in ``directory`` (``write_trace_dir``'s
    and ``tracedir``'s names), those written since ``since`` (epoch seconds) only: an older run's
    leftovers in the same directory are not this failure's."""
    base = os.path.join(directory, safe_filename(name))

    def fresh(path: str) -> bool:
        try:
            return os.stat(path).st_mtime >= (since - MTIME_SLACK_S if since is not None else 0)
        except OSError:
            return False

    found = [(base + suffix, what) for suffix, what in TRACE_FILES if fresh(base + suffix)]
    fr_dir = base + ".fr"
    dumps = sorted(f for f in (os.listdir(fr_dir) if os.path.isdir(fr_dir) else ())
                   if fresh(os.path.join(fr_dir, f)))
    if dumps:
        found.append((fr_dir + os.sep, f"Flight Recorder dumps, {len(dumps)} rank(s): {FR_READER} {fr_dir}"))
    return found


def format_trace_files(files: list[tuple[str, str]]) -> str:
    """The report's last part: each trace file and what opens it."""
    if not files:
        return ""
    width = max(len(path) for path, _ in files)
    return "-- trace files (--nccl-trace-dir) --\n" + "\n".join(
        f"  {path.ljust(width)}  {what}" for path, what in files)


class NcclLongRepr:
    """A failure report whose first line is the exception class and the diagnosis headline (what
    -r summaries and the JUnit failure message show, as pytest shows ``AssertionError: ...``), whose
    body is the collective trace, and whose end lists the trace files written."""

    def __init__(self, headline: str, body: str, path: str, lineno: int, exception: str = "",
                 files: list[tuple[str, str]] | None = None):
        self.headline = headline
        self.first_line = f"{exception}: {headline}" if exception else headline
        self.body = body
        self.files = format_trace_files(files or [])
        self.reprcrash = _crash_location(path, lineno, self.first_line)
        self.sections: list = []

    def _rest(self) -> str:
        """The report after its first line."""
        rest = self.body[len(self.headline):] if self.body.startswith(self.headline) else "\n" + self.body
        return rest.rstrip("\n") + ("\n\n" + self.files if self.files else "")

    def toterminal(self, tw) -> None:
        tw.line(self.first_line, red=True, bold=True)
        for line in self._rest().splitlines():
            tw.line(line)
        for name, content, sep in self.sections:
            tw.sep(sep, name)
            tw.line(content)

    def addsection(self, name, content, sep="-"):
        self.sections.append((name, content, sep))

    def __str__(self) -> str:
        return self.first_line + self._rest()
