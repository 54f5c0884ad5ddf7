"""The release matrix's findings: which rows are red on which releases, since when, fixed where
(:func:`findings`); what is known about them (a notes file, :func:`parse_notes`); and the rows of
one trainer that read the same, merged into one entry (:func:`group_findings`). Pure, as
:mod:`.results`; it reads the cells of :mod:`.cells`."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion

from .. import tomlcompat
from .cells import CellStatus, cell, short_headline
from .results import DASH, Results, ResultsError, row_labels

# --------------------------------------------------------------------------- findings


@dataclass
class Finding:
    nodeid: str
    label: str
    ranges: list[tuple[str, str]]
    first_bad: list[str]  # "0.21.0" or "0.21.0 (0.20.1 untested)"
    fixed: list[str]
    newest: str
    newest_status: CellStatus  # the newest release's cell status
    newest_red: str
    headline: str
    #: (release, headline) of each "first bad" release whose headline differs from ``headline``
    first_bad_headlines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def red_on_newest(self) -> bool:
        return self.newest_status is CellStatus.RED

    def range_text(self) -> str:
        return ", ".join(a if a == b else f"{a}{DASH}{b}" for a, b in self.ranges)


def red_ranges(statuses: Sequence[CellStatus]) -> list[tuple[int, int]]:
    """Index ranges of red releases; releases without a verdict (not red, not green) inside a range
    do not break it when the nearest releases with a verdict on both sides are red."""
    out: list[tuple[int, int]] = []
    last_verdict: CellStatus | None = None
    for i, s in enumerate(statuses):
        if s is CellStatus.RED:
            if out and last_verdict is CellStatus.RED:
                out[-1] = (out[-1][0], i)
            else:
                out.append((i, i))
        if s.verdict:
            last_verdict = s
    return out


def findings(results: Results, labels: Mapping[str, str] | None = None) -> list[Finding]:
    """Rows red on some release, red on the newest first, then in row order."""
    versions = results.versions
    labels = labels or row_labels(results.nodeids())
    found = []
    for n in results.nodeids():
        cells = [cell(results, n, v) for v in versions]
        statuses = [c.status for c in cells]
        ranges = red_ranges(statuses)
        if not ranges:
            continue
        first_bad, fixed, heads = [], [], []
        for a, b in ranges:
            before = [i for i in range(a) if statuses[i].verdict]
            if before and statuses[before[-1]] is CellStatus.GREEN:
                gap = versions[before[-1] + 1:a]
                first_bad.append(versions[a] + (f" ({', '.join(gap)} untested)" if gap else ""))
                heads.append((versions[a], cells[a].full))
            after = [i for i in range(b + 1, len(versions)) if statuses[i].verdict]
            if after and statuses[after[0]] is CellStatus.GREEN:
                fixed.append(versions[after[0]])
        last_red = ranges[-1][1]
        newest = cells[last_red].full
        found.append(Finding(n, labels.get(n, n), [(versions[a], versions[b]) for a, b in ranges], first_bad,
                             fixed, versions[-1], statuses[-1], versions[last_red], newest,
                             [(v, h) for v, h in heads if h != newest and v != versions[last_red]]))
    return sorted(found, key=lambda f: not f.red_on_newest)


# --------------------------------------------------------------------------- notes and groups


@dataclass(frozen=True)
class Note:
    """What is known about some rows' failures (a notes file's ``[[note]]``): ``rows`` are glob
    patterns over row labels (``"cpo · *"``), ``text`` the issue-style description shown under the
    finding; ``new`` marks a finding this matrix found (not a documented bug); ``releases`` (a PEP
    440 specifier set, ``">=0.14.0,<0.17.0"``; empty: any) the releases it is about, so that one
    row red for two reasons in two ranges gets each range's note."""

    rows: tuple[str, ...]
    text: str
    new: bool = False
    releases: str = ""

    def matches(self, label: str, version: str | None = None) -> bool:
        if not any(fnmatch.fnmatchcase(label, pat) for pat in self.rows):
            return False
        if version is None or not self.releases:
            return True
        try:
            return SpecifierSet(self.releases).contains(version, prereleases=True)
        except InvalidVersion:
            return False


def parse_notes(text: str) -> list[Note]:
    """Notes from TOML: ``[[note]]`` tables with ``rows`` (a list of globs), ``text``, ``new``."""
    try:
        doc = tomlcompat.loads(text)
    except tomlcompat.TOMLDecodeError as e:
        raise ResultsError(f"notes: not TOML: {e}") from None
    out = []
    for i, item in enumerate(doc.get("note") or []):
        rows, body = item.get("rows"), item.get("text")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, str) for r in rows) \
                or not isinstance(body, str) or not body.strip():
            raise ResultsError(f"notes: note {i + 1} needs rows = [\"glob\", ...] and text = \"...\"")
        releases = item.get("releases", "")
        try:
            SpecifierSet(releases)
        except (InvalidSpecifier, TypeError):
            raise ResultsError(f"notes: note {i + 1}: releases = {releases!r} is not a specifier set "
                               "such as \">=0.14.0,<0.17.0\"") from None
        out.append(Note(tuple(rows), " ".join(body.split()), bool(item.get("new", False)), releases))
    return out


def parse_about(text: str) -> str:
    """The notes file's top-level ``about``: Markdown shown under the page's title (what the rows
    mean), or ""."""
    try:
        about = tomlcompat.loads(text).get("about", "")
    except tomlcompat.TOMLDecodeError as e:
        raise ResultsError(f"notes: not TOML: {e}") from None
    if not isinstance(about, str):
        raise ResultsError("notes: about must be a string")
    return about.strip()


def note_for(label: str, notes: Sequence[Note], version: str | None = None) -> Note | None:
    """The first note about ``label`` (on ``version``, when given)."""
    return next((n for n in notes if n.matches(label, version)), None)


def notes_of(f: Finding, notes: Sequence[Note]) -> list[tuple[str, Note]]:
    """(range text, note) for each red range of ``f`` that a note covers (the note about the
    range's first release), a note once."""
    out: list[tuple[str, Note]] = []
    for a, b in f.ranges:
        note = note_for(f.label, notes, a)
        if note is not None and all(note is not n for _, n in out):
            out.append((a if a == b else f"{a}{DASH}{b}", note))
    return out


@dataclass
class FindingGroup:
    """Findings of one trainer (the label before `` · ``) that read the same: the same red
    releases, first bad and fixed releases, the same kind of failure, the same note."""

    findings: list[Finding]
    notes: list[tuple[str, Note]]  # (red range, what is known about it)

    @property
    def first(self) -> Finding:
        return self.findings[0]

    def title(self) -> str:
        labels = [f.label for f in self.findings]
        head, sep, _ = labels[0].partition(" \u00b7 ")
        if len(labels) > 1 and sep and all(lab.startswith(head + sep) for lab in labels):
            return f"{head} \u00b7 " + ", ".join(lab[len(head) + len(sep):] for lab in labels)
        return ", ".join(labels)


def group_findings(found: Sequence[Finding], notes: Sequence[Note] = ()) -> list[FindingGroup]:
    """Consecutive-or-not findings merged by (trainer, ranges, first bad, fixed, newest status,
    failure kind, note), in the order of their first member."""
    groups: dict[tuple, FindingGroup] = {}
    for f in found:
        known = notes_of(f, notes)
        key = (f.label.partition(" \u00b7 ")[0], f.range_text(), tuple(f.first_bad), tuple(f.fixed),
               f.newest_status, short_headline(f.headline), tuple((r, id(n)) for r, n in known))
        if key in groups:
            groups[key].findings.append(f)
        else:
            groups[key] = FindingGroup([f], known)
    return list(groups.values())
