"""The release matrix over a CI job matrix: which releases one shard runs (``--shard K/N``), and the
shards' results merged into one results file and page (``--merge A.json B.json ...``).

A shard runs whole releases (every ``--world`` of each): a release's env is built once per machine,
and building it is most of a cell's time. Releases go to shards in turn, or, with ``--balance
FILE`` (an earlier results file), by the seconds each took there (env build plus tests; a release
that file lacks counts as their mean), longest first to the least loaded shard. Every shard lists
the same releases (the same index, the same range), so each computes the same split.

Merging refuses, in one line, a shard made for another package, other pytest arguments or another
torch, and a (release, world) found in two shards; a shard that is missing is said in a line and
its releases read as not run. File reads and writes only (no process): tested on data.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

from .results import Results, ResultsError


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """'2/4' -> Shard(2, 4); ValueError with the one line to say."""
    k, slash, n = str(text).partition("/")
    try:
        shard = Shard(int(k), int(n)) if slash else None
    except ValueError:
        shard = None
    if shard is None or not 1 <= shard.index <= shard.count:
        raise ValueError(f"--shard must be K/N with 1 <= K <= N (this job's share of N), e.g. 2/4, not {text!r}")
    return shard


def release_seconds(results: Results) -> dict[str, float]:
    """Seconds each release took in ``results``: its env's build and its test runs, every world."""
    out: dict[str, float] = {}
    for (version, _), run in results.runs.items():
        out[version] = out.get(version, 0.0) + (run.seconds or 0.0) + (run.env_seconds or 0.0)
    return out


def assign(versions: Sequence[str], count: int, seconds: Mapping[str, float] | None = None) -> dict[str, int]:
    """release -> the shard (1-based) that runs it: in turn without ``seconds``; else longest first
    to the least loaded shard (ties: the earlier release, the lower shard), which any shard computes
    alike."""
    known = {v: seconds[v] for v in versions if seconds and v in seconds}
    if not known:
        return {v: i % count + 1 for i, v in enumerate(versions)}
    mean = sum(known.values()) / len(known)
    cost = {v: known.get(v, mean) for v in versions}
    load = [0.0] * count
    out = {}
    for v in sorted(versions, key=lambda v: (-cost[v], versions.index(v))):
        target = min(range(count), key=lambda i: (load[i], i))
        load[target] += cost[v]
        out[v] = target + 1
    return out


def share(versions: Sequence[str], shard: Shard, seconds: Mapping[str, float] | None = None) -> list[str]:
    """The releases ``shard`` runs, in release order."""
    by = assign(versions, shard.count, seconds)
    return [v for v in versions if by[v] == shard.index]


def unsharded(command: str) -> str:
    """A shard's command as one machine would have run it: without --shard and --balance."""
    words, out, skip = shlex.split(command), [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--shard", "--balance"):
            skip = True
        elif not word.startswith(("--shard=", "--balance=")):
            out.append(word)
    return shlex.join(out)


class MergeError(ValueError):
    """Shards that cannot be one matrix: the one line to say."""


def same_run(parts: Sequence[tuple[str, Any]], run: str) -> None:
    """Every shard (name, results) was made for the first one's package, pytest arguments and torch;
    else ``MergeError`` naming the two that differ (``run``: "matrix", "sweep")."""
    first_name, first = parts[0]
    for name, part in parts[1:]:
        for what, mine, theirs in (("package", part.package, first.package),
                                   ("pytest arguments", part.pytest_args, first.pytest_args),
                                   ("torch", part.torch, first.torch)):
            if mine != theirs:
                shown = (lambda a: f"`pytest {shlex.join(a)}`") if what == "pytest arguments" else repr
                raise MergeError(f"{name} was made for {what} {shown(mine)}, {first_name} for {shown(theirs)}: "
                                 f"shards of one {run} run the same")


def merge(parts: Sequence[tuple[str, Results]]) -> Results:
    """One results file from the shards' (name, results), in the order given."""
    if not parts:
        raise MergeError("give the shards' results files after --merge")
    first = parts[0][1]
    same_run(parts, "matrix")
    merged = Results(first.package, list(first.pytest_args), command=unsharded(first.command),
                     python=first.python, torch=first.torch, as_of=first.as_of,
                     updated=max(p.updated for _, p in parts))
    where: dict[tuple[str, int], str] = {}
    for name, part in parts:
        merged.plan(part.versions, part.worlds)
        for cell, run in part.runs.items():
            if cell in where:
                raise MergeError(f"{cell[0]} at world {cell[1]} is in both {where[cell]} and {name}")
            where[cell] = name
            merged.put(run)
    return merged


def missing(parts: Sequence[tuple[str, Results]]) -> list[str]:
    """'K/N' of each shard of N that none of ``parts`` is (shards made for one N)."""
    shards = [parse_shard(p.shard) for _, p in parts if p.shard]
    if not shards:
        return []
    count = max(s.count for s in shards)
    seen = {s.index for s in shards}
    return [f"{k}/{count}" for k in range(1, count + 1) if k not in seen]


# -- the command line -----------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", metavar="K/N", help="run only this job's share of the releases (K of N CI jobs)")
    p.add_argument("--balance", metavar="FILE", help="with --shard: share the releases by the seconds they "
                   "took in this earlier results file (default: in turn)")
    p.add_argument("--merge", metavar="FILE", nargs="+", help="merge these shards' results files into "
                   "--results and --out (the page); run nothing")


def check(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """--shard, --balance and --merge; ``parser.error`` (one line) for what is wrong. Sets
    ``ns.shard`` (a Shard or None) and ``ns.balance_seconds``."""
    ns.balance_seconds = None
    if ns.merge is not None:
        if ns.package or ns.pytest_args or ns.shard or ns.render_only:
            parser.error("--merge takes the shards' results files only (and --results, --out, --notes)")
        if ns.results is None and ns.out is None:
            parser.error("--merge needs --out (the page) or --results (the merged file)")
        ns.results = ns.results or str(Path(ns.out).with_suffix(".json"))
    elif ns.results is None:
        parser.error("the following arguments are required: --results")
    if ns.balance and not ns.shard:
        parser.error("--balance shares the releases among shards: give --shard K/N too")
    try:
        ns.shard = parse_shard(ns.shard) if ns.shard else None
    except ValueError as e:
        parser.error(str(e))
    if ns.balance:
        try:
            ns.balance_seconds = release_seconds(Results.load(ns.balance))
        except (OSError, ResultsError) as e:
            parser.error(f"--balance {ns.balance}: {e}")


def merge_files(ns: argparse.Namespace, out: TextIO, err: TextIO, write_markdown: Callable[..., None]) -> int:
    """``--merge``: exit 0 with the merged file and page written, 2 with one line on ``err``."""
    parts = []
    for name in ns.merge:
        try:
            parts.append((name, Results.load(name)))
        except (OSError, ResultsError) as e:
            err.write(f"pytest-nccl matrix: cannot read {name}: {e}\n")
            return 2
    try:
        merged = merge(parts)
        gaps = missing(parts)
    except (MergeError, ValueError) as e:
        err.write(f"pytest-nccl matrix: {e}\n")
        return 2
    if gaps:
        err.write(f"pytest-nccl matrix: shard {', '.join(gaps)} missing: its releases read as not run\n")
    merged.save(ns.results)
    write_markdown(merged, ns.out, ns.note_list, ns.about)
    out.write(f"merged {len(parts)} shard{'s' if len(parts) != 1 else ''}: wrote {ns.results} and {ns.out}\n")
    return 0
