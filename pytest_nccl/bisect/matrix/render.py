"""The release matrix as Markdown: a generated-by paragraph, the Stacks table (what each release
resolved to), the Matrix table (tests x releases, cells from :func:`.matrix.cell`), the Findings
(:func:`.matrix.findings`, full headlines) and a legend. Pure: the caller passes the date."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .cells import NO_ENV, NOT_RUN, RED_MARK, CellStatus, cell, md_escape, shorten, skip_reason
from .findings import FindingGroup, Note, findings, group_findings
from .results import KEY_PACKAGES, MARK, Results, row_labels

_SUP = str.maketrans("0123456789", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
_STATUS_WORD = {CellStatus.RED: "red", CellStatus.GREEN: "pass", CellStatus.SKIP: "skip", CellStatus.NONE: "not run",
                CellStatus.NO_ENV: "cannot install"}


def _secs(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s:.0f}s" if s < 90 else f"{int(s // 60)}m{int(s % 60):02d}s"


def _env_reason(results: Results, version: str) -> str | None:
    for w in results.worlds:
        run = results.get(version, w)
        if run is not None and not run.env_ok:
            return run.env_reason or "env build failed"
    return None


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_stacks(results: Results) -> list[str]:
    pkgs = [p for p in KEY_PACKAGES if p not in ("torch", results.package)]
    rows = []
    for v in results.versions:
        runs = [results.get(v, w) for w in results.worlds]
        have = [r for r in runs if r is not None]
        known = next((r.packages for r in have if r.packages), {})
        reason = _env_reason(results, v)
        built = next((r.env_seconds for r in have if r.env_seconds is not None), None)
        if reason:
            env = "cannot install"
        elif have:
            env = "ok" + (f" (built {_secs(built)})" if built is not None else "")
        else:
            env = NOT_RUN
        tests = []
        for r in runs:
            t = NOT_RUN if r is None else ("" if not r.env_ok else _secs(r.seconds))
            if r is not None and r.env_ok and r.problem:
                t += f" ({md_escape(shorten(r.problem, 40))})"
            tests.append(t)
        rows.append([v] + [md_escape(known.get(p, "")) or "" for p in pkgs] + [env] + tests)
    return _table([results.package] + pkgs + ["env"] + [f"tests w{w}" for w in results.worlds], rows)


def render_matrix(results: Results, labels: Mapping[str, str]) -> list[str]:
    noenv: dict[str, list[str]] = {}
    for v in results.versions:
        reason = _env_reason(results, v)
        if reason:
            noenv.setdefault(reason, []).append(v)
    header = ["test"] + [v + (f" {MARK}" if _env_reason(results, v) else "") for v in results.versions]
    rows, notes = [], []
    reasons: dict[str, int] = {}  # skip reason -> its footnote mark
    for n in results.nodeids():
        text = md_escape(labels.get(n, n))
        why = skip_reason(results, n)
        if why is not None:
            mark = reasons.setdefault(why, len(reasons) + 1)
            text += str(mark).translate(_SUP)
        rows.append([text] + [cell(results, n, v).text for v in results.versions])
    if not rows:
        rows.append(["(no test results yet)"] + [NO_ENV if _env_reason(results, v) else NOT_RUN
                                                 for v in results.versions])
    for reason, vs in noenv.items():
        notes.append(f"{MARK} {', '.join(vs)}: cannot install: {reason}")
    for why, mark in reasons.items():
        notes.append(f"{str(mark).translate(_SUP)} skipped: {why}")
    out = _table(header, rows)
    if notes:
        out += [""] + [ln + "  " if i < len(notes) - 1 else ln for i, ln in enumerate(notes)]
    return out


def render_group(g: FindingGroup) -> list[str]:
    f = g.first
    parts = [f"red on {f.range_text()}"]
    if f.first_bad:
        parts.append("first bad " + ", ".join(f.first_bad))
    if f.fixed:
        parts.append("fixed in " + ", ".join(f.fixed))
    parts.append(f"red on the newest ({f.newest})" if f.red_on_newest
                 else f"newest {f.newest}: {_STATUS_WORD[f.newest_status]}")
    lines = [f"- **{md_escape(g.title())}**: " + "; ".join(parts)]
    for where, note in g.notes:
        what = "new finding" if note.new else "known"
        lines.append(f"  - {what}{f' ({where})' if len(f.ranges) > 1 else ''}: {note.text}")
    lines.append(f"  - {f.newest_red}: {f.headline}")
    lines += [f"  - {v} (first bad): {h}" for v, h in f.first_bad_headlines]
    return lines


LEGEND = [
    "- `pass`: passed at every world size; `skip`: skipped at every world size "
    "(a superscript on the row names the reason when it is always the same); `xfail`: failed as expected.",
    f"- `{RED_MARK} kind`: failed; the kind of failure (`shape mismatch: all_gather`, `hang`, an exception) of the "
    "first failing world size; `w2 pass; w4: ...` when world sizes differ. The full headlines are under Findings.",
    f"- `{NOT_RUN}`: no result (not run yet, or the test was not collected); "
    f"`{NO_ENV}`: the release's environment could not be built ({MARK} on the column, reason under the table).",
    "- Findings: red releases as ranges; a range goes on across releases without a verdict (skipped, "
    "not run, cannot install) only when the nearest releases with a verdict on both sides are red.",
]


def render(results: Results, date: str | None = None, notes: Sequence[Note] = (), about: str = "") -> str:
    """The whole page; ``date`` defaults to the day of the results' last update (a re-render from
    the same JSON gives the same text)."""
    date = date or (results.updated[:10] if results.updated else "?")
    labels = row_labels(results.nodeids())
    worlds = ", ".join(str(w) for w in results.worlds) or "-"
    as_of = ("each release's dependencies resolved as of its release date" if results.as_of == "release"
             else "dependencies resolved as of today" if results.as_of == "now"
             else f"dependencies resolved as of {results.as_of}")
    cmd = f"`{results.command}`" if results.command else "`python -m pytest_nccl matrix`"
    lines = [f"# {results.package}: release matrix", "",
             f"Generated by {cmd} on {date} (Python {results.python or '?'}, torch {results.torch or '?'}): "
             f"{len(results.versions)} release{'s' if len(results.versions) != 1 else ''} of {results.package} "
             f"at world sizes {worlds}, {as_of}; each run is "
             f"`pytest {' '.join(results.pytest_args)} --nccl-world=N`.", "",
             *([about, ""] if about else []),
             "## Stacks", ""]
    lines += render_stacks(results)
    lines += ["", "## Matrix", ""]
    lines += render_matrix(results, labels)
    lines += ["", "## Findings", ""]
    found = findings(results, labels)
    for g in group_findings(found, notes):
        lines += render_group(g)
    if not found:
        lines.append("No test failed on any release.")
    lines += ["", "## Legend", ""] + LEGEND
    return "\n".join(lines) + "\n"
