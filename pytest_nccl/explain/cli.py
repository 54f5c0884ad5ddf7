"""``pytest-nccl explain PATH...``: the verdict on a job from the Flight Recorder dumps it left behind
(docs/explain.md). Reads (``load``), judges (``verdict``), prints the headline and the report as a
failed test's, and exits 3 when a rank diverges, 0 when none does, 2 when the input cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence, TextIO

from ..core.reports import CallOutcome
from ..usage import EXIT_USAGE, Parser, UsageError, report
from .consistency import Refused
from .load import InputError, load, rank_files
from .testtrace import beside
from .testtrace import read as read_test_trace
from .verdict import DUMPS, Explained, explain

EXIT_DIAGNOSED = 3
EXIT_NO_DIVERGENCE = 0
DESCRIPTION = """The verdict on a job from the Flight Recorder dumps it left behind (NCCL's
dump-on-timeout, torch's _dump_fr_trace, a test's or the watch's .fr folder), by the judge the tests
and the watch use: the rank that never entered the collective the others wait in, the op, the
group, the sequence number and the line."""
EPILOG = """PATH: a folder of dumps, a file prefix as NCCL writes them (/tmp/nccl_trace_rank_),
or single files; pickle or JSON, any schema torch writes (read by the keys present).

exit status:
  0  no rank diverges (every group's progress is printed)
  2  usage error, or input that cannot be read (one line naming the file)
  3  diagnosed"""


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a folder of dumps, a prefix, or files")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON instead of text")
    parser.add_argument("--trace-dir", metavar="DIR",
                        help="write the trace, the Perfetto timeline and the swimlane page here, as a failed test does")
    parser.add_argument("--world", type=int, default=None, metavar="N",
                        help="the job's number of ranks, where no dump says it (gloo's name no group's ranks) "
                             "and the last ranks left none")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="processes reading the dumps (default: one per core, for 32 files or more)")


def exit_code(result: Explained) -> int:
    return EXIT_NO_DIVERGENCE if result.diagnosis is None else EXIT_DIAGNOSED


TABLE_GROUPS = 8  # groups a report's table shows; past it, only those the verdict names


def text(result: Explained, files: int) -> str:
    """What the command prints: the headline (or that no rank diverges), what the dumps cannot tell,
    then the report as a failed test's: the collective table, the divergence, where each rank is."""
    from ..core.records import RankView
    from ..views.report import format_divergence, format_positions
    from ..views.table import format_table

    outcome, diag = result.outcome, result.diagnosis
    lines = [f"pytest-nccl explain: {files} dump{'s' if files != 1 else ''} of a {result.world}-rank job"
             f"{' (' + outcome.backend + ')' if outcome.backend else ''}"]
    if diag is not None:
        lines.append(f"{diag.exception_name}: {diag.headline}")
    else:
        lines.append("no rank diverges: every member of each group reached the same collective")
        lines += [f"  {p}" for p in result.progress]
    lines += [f"  note: {g}" for g in result.gaps]
    views = outcome.views
    groups = sorted({rec.pg for v in views for rec in v.records})
    shown = groups
    if len(groups) > TABLE_GROUPS:  # a large job's table is the groups the verdict names
        named = [g for g in groups if diag is not None and (g == diag.pg or g in diag.headline)]
        shown = named[:TABLE_GROUPS] or groups[:1]
        views = [RankView(v.rank, status=v.status, records=[r for r in v.records if r.pg in shown]) for v in views]
    lines.append(f"\n-- collective trace ({outcome.backend + ', ' if outcome.backend else ''}{result.world} ranks, "
                 f"{DUMPS.span(0.0, outcome.bound)}"
                 f"{f'; {len(shown)} of {len(groups)} groups: those the verdict names' if shown != groups else ''}) --")
    lines.append(format_table(views, diag))
    if diag is not None and diag.divergence is not None:
        lines += ["", format_divergence(diag)]
    lines += ["\n-- where each rank is --", format_positions(outcome.views, DUMPS, outcome.counts)]
    return "\n".join(lines)


def as_json(result: Explained) -> str:
    diag = result.diagnosis
    return json.dumps({
        "exit": exit_code(result), "world": result.world, "backend": result.outcome.backend,
        "diagnosis": None if diag is None else {
            "kind": diag.kind, "exception": diag.exception_name, "headline": diag.headline, "ranks": diag.ranks,
            "group": diag.pg, "seq": diag.seq},
        "missing": result.missing, "notes": result.gaps, "progress": result.progress,
        "groups": {g.label: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks) if g.ranks else None}
                   for g in result.groups.values()},
        "ranks": [{"rank": v.rank, "status": v.status,
                   "current": None if v.current is None else {
                       "group": v.current.pg, "op": v.current.op, "seq": v.current.number,
                       "state": v.current.state, "site": v.current.site}}
                  for v in result.outcome.views],
    }, indent=1)


def write_trace(directory: str, name: str, outcome: CallOutcome, err: TextIO) -> list[str]:
    from ..views.tracedir import write_trace as write

    def note(line: str) -> None:
        err.write(line + "\n")

    return write(directory, name, outcome, note)


def main(argv: Sequence[str] | None = None, prog: str = "pytest-nccl explain",
         out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        ns = build_parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        return report(exc, prog, err)
    except SystemExit as exc:  # --help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if ns.world is not None and ns.world < 1:
            raise UsageError(f"--world must be a positive number of ranks, not {ns.world}", prog)
        if ns.jobs is not None and ns.jobs < 1:
            raise UsageError(f"--jobs must be a positive number of processes, not {ns.jobs}", prog)
    except UsageError as exc:
        return report(exc, prog, err)
    try:
        files = rank_files(ns.paths)
        if ns.world is not None and max(files) >= ns.world:
            raise InputError(f"{files[max(files)]} is the dump of rank {max(files)}, outside --world {ns.world}")
        companion = beside(ns.paths[0]) if len(ns.paths) == 1 else None
        test = read_test_trace(companion) if companion else None
        result = explain(list(load(files, jobs=ns.jobs)), ns.world, test)
    except (InputError, Refused) as exc:
        err.write(f"{prog}: error: {exc}\n")
        return EXIT_USAGE
    if ns.trace_dir:
        name = os.path.basename(os.path.normpath(ns.paths[0])).rstrip("_") or "dumps"
        try:
            for path in write_trace(ns.trace_dir, f"explain-{name}", result.outcome, err):
                err.write(f"{prog}: wrote {path}\n")
        except OSError as exc:
            err.write(f"{prog}: error: cannot write the trace to {ns.trace_dir}: {exc.strerror or exc}\n")
            return EXIT_USAGE
    if test is not None and not ns.json:
        out.write(f"pytest-nccl explain: with the test's trace {test.path}\n")
    out.write((as_json(result) if ns.json else text(result, len(files))) + "\n")
    return exit_code(result)
