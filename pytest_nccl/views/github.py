"""GitHub Actions: a failure as one workflow-command annotation at its call site in the user's
checkout, and the job summary's table. Pure: text in, text out; the pytest glue is
``pytest_nccl/github.py``, the watch's ``watch/frontends/ci.py``.

An annotation is ``::error file=F,line=N,title=CLASS::MESSAGE``, escaped as GitHub's toolkit
(``@actions/core``, ``command.ts``) escapes it: the message ``%`` -> ``%25``, CR -> ``%0D``,
LF -> ``%0A``; a property value those and ``:`` -> ``%3A``, ``,`` -> ``%2C``. GitHub shows 10
error annotations per step (docs: actions/toolkit problem-matchers.md, "Limitations"): a session
emits at most :data:`ANNOTATIONS_PER_STEP` and says how many it left out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..core.reports import CallOutcome
from ..core.sites import is_ours, stack_frames
from ..core.states import RankState, Word

ANNOTATIONS_PER_STEP = 10
SUMMARY_ROWS = 20           # a short table: the rest is counted in a line under it
_TRACEBACK_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')


class GithubMode(Word):
    """``--nccl-github`` (pytest) and ``--github`` (the watch)."""
    AUTO = "auto"    # annotations when GITHUB_ACTIONS=true, the summary when GITHUB_STEP_SUMMARY is set
    ON = "on"        # annotations anywhere (a runner that does not set GITHUB_ACTIONS); the summary as auto
    OFF = "off"      # neither, the gate report's copy in the summary included


def wanted(mode: str, environ: Mapping[str, str]) -> tuple[bool, str | None]:
    """(annotate, the job summary's path or None) for ``mode`` in this environment."""
    if mode == GithubMode.OFF:
        return False, None
    annotate = mode == GithubMode.ON or environ.get("GITHUB_ACTIONS") == "true"
    return annotate, environ.get("GITHUB_STEP_SUMMARY") or None


def checkout_root(environ: Mapping[str, str], default: str) -> str:
    """The checkout the annotations point into: the workspace GitHub checked out, else ``default``."""
    return environ.get("GITHUB_WORKSPACE") or default


# -- escaping (GitHub's rules) ----------------------------------------------------------------------

def escape_data(text: str) -> str:
    """A workflow command's message: ``%`` first, so that the escapes themselves survive."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (file, title): as the message, and the delimiters ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


@dataclass(frozen=True)
class Annotation:
    """One failure as GitHub annotates it; ``file`` None: no place in the checkout (the watch)."""
    title: str
    message: str
    file: str | None = None
    line: int | None = None

    def command(self) -> str:
        props = [f"file={escape_property(self.file)}", f"line={self.line}"] if self.file else []
        props.append(f"title={escape_property(self.title)}")
        return f"::error {','.join(props)}::{escape_data(self.message)}"


# -- where: the first frame of the failure's call site inside the checkout ---------------------------

def chain_frames(site: str) -> list[tuple[str, int]]:
    """A record's call site "file:line <- file:line" (innermost first) as (path, line) pairs."""
    frames = []
    for part in site.split(" <- "):
        path, _, line = part.strip().rpartition(":")
        if path and line.isdigit():
            frames.append((path, int(line)))
    return frames


def traceback_frames(text: str) -> list[tuple[str, int]]:
    """(path, line) of a formatted traceback's frames, innermost first."""
    found = [(m.group(1), int(m.group(2))) for m in map(_TRACEBACK_FRAME.match, text.splitlines()) if m]
    return found[::-1]


def candidate_frames(outcome: CallOutcome) -> list[list[tuple[str, int]]]:
    """The frames that say where a call failed, most telling first: for each rank the diagnosis
    blames, its diverging collective's call site, the collective it sits in, its traceback or its
    stack (a slow rank's busy line); then the other ranks' diverging collectives, then those of the
    ranks that did not pass, then every rank's collective at the diagnosis's position."""
    diag = outcome.diagnosis
    div = diag.divergence if diag is not None else None
    diverging = div.records if div is not None else {}
    views = {v.rank: v for v in outcome.views}
    blamed = list(diag.ranks) if diag is not None else []
    others = [v.rank for v in outcome.views if v.rank not in blamed and v.status != RankState.PASSED]
    chains: list[list[tuple[str, int]]] = []

    def of_rank(r: int) -> None:
        view = views.get(r)
        if r in diverging:
            chains.append(chain_frames(diverging[r].site))
        if view is None:
            return
        current = view.current
        if current is not None:
            chains.append(chain_frames(current.site))
        if view.exc_text:
            chains.append(traceback_frames(view.exc_text))
        if view.stack:
            chains.append(stack_frames(view.stack))

    for r in blamed:
        of_rank(r)
    chains += [chain_frames(rec.site) for r, rec in sorted(diverging.items()) if r not in blamed]
    for r in others:
        of_rank(r)
    if diag is not None and diag.pg is not None and diag.seq is not None:
        for view in outcome.views:
            chains += [chain_frames(rec.site) for rec in view.records_in(diag.pg) if rec.seq == diag.seq]
    return [c for c in chains if c]


def in_checkout(path: str, root: str) -> str | None:
    """``path`` relative to the checkout ``root`` ("/" separated) when it is the user's code there:
    not an installed package (a virtual environment inside the checkout), not this plugin's
    machinery, not ``<string>``; else None."""
    if not path or path.startswith("<") or is_ours(path):
        return None
    full = os.path.normpath(path if os.path.isabs(path) else os.path.join(root, path))
    parts = full.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return None
    rel = os.path.relpath(full, os.path.normpath(root))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return rel.replace(os.sep, "/")


def locate(chains: Iterable[Sequence[tuple[str, int]]], root: str,
           fallback: tuple[str, int] | None = None) -> tuple[str, int] | None:
    """(file relative to ``root``, line): the innermost frame inside the checkout of the first chain
    that has one; else ``fallback`` (the test's own line, when it is in the checkout), else None."""
    for chain in chains:
        for path, line in chain:
            rel = in_checkout(path, root)
            if rel is not None:
                return rel, line
    if fallback is not None:
        rel = in_checkout(fallback[0], root)
        if rel is not None:
            return rel, fallback[1]
    return None


def annotation(title: str, headline: str, outcome: CallOutcome | None, root: str,
               fallback: tuple[str, int] | None = None, about: str = "") -> Annotation:
    """A failure's annotation: ``title`` the exception class, the headline (then ``about``, e.g. the
    test's node id, on a line of its own), at the call site in ``root`` that ``locate`` finds."""
    chains = candidate_frames(outcome) if outcome is not None else []
    place = locate(chains, root, fallback)
    message = headline + (f"\n{about}" if about else "")
    return Annotation(title, message, *(place or (None, None)))


def capped(annotations: Sequence[Annotation], limit: int = ANNOTATIONS_PER_STEP) -> list[str]:
    """The lines to print: at most ``limit`` commands, then one line saying how many were left out."""
    lines = [a.command() for a in annotations[:limit]]
    left = len(annotations) - limit
    if left > 0:
        lines.append(f"pytest-nccl: {left} more failure{'s' if left > 1 else ''} not annotated "
                     f"(GitHub shows {limit} error annotations per step); the log above has them all")
    return lines


# -- the job summary ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One failed test in the job summary."""
    test: str
    exception: str
    headline: str
    files: tuple[str, ...] = ()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    text = _cell(text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def summary(rows: Sequence[Row], distributed: int, others_failed: int = 0) -> str:
    """The session's part of the job summary: a table of the distributed tests that failed, or one
    line when none did."""
    if not rows:
        tail = f"; {others_failed} other test{'s' if others_failed != 1 else ''} failed" if others_failed else ""
        return f"pytest-nccl: no distributed test failed ({distributed} ran){tail}\n"
    out = [f"### pytest-nccl: {len(rows)} distributed test{'s' if len(rows) != 1 else ''} failed", "",
           "| test | exception | headline | trace files |", "| --- | --- | --- | --- |"]
    for row in rows[:SUMMARY_ROWS]:
        files = "<br>".join(_code(f) for f in row.files) or "\u2014"
        out.append(f"| {_code(row.test)} | {_cell(row.exception)} | {_cell(row.headline)} | {files} |")
    if len(rows) > SUMMARY_ROWS:
        out += ["", f"and {len(rows) - SUMMARY_ROWS} more: the log has them all"]
    if others_failed:
        out += ["", f"{others_failed} other test{'s' if others_failed != 1 else ''} failed (not distributed)"]
    return "\n".join(out) + "\n\n"


def watch_summary(title: str, headline: str, exit_code: int, files: Sequence[str] = ()) -> str:
    """The watch's verdict in the job summary; ``title`` empty: the job ended without one."""
    if not title:
        return f"pytest-nccl watch: no verdict, the job ended with exit status {exit_code}\n"
    out = [f"### pytest-nccl watch: {_cell(title)}", "", _cell(headline), "",
           f"exit status {exit_code}" + (f"; trace files: {', '.join(_code(f) for f in files)}" if files else "")]
    return "\n".join(out) + "\n\n"
