"""``bisect --sweep`` over a CI job matrix: ``--shard K/N --results FILE.json`` sweeps one job's share
of the releases (the matrix's split: ``matrix/shards.py``) and writes its verdicts; ``--merge
A.json B.json ...`` prints the sweep of them all, as one machine's sweep prints it, and exits as it
would. Shards made for another package, other pytest arguments or another torch, and a release
swept twice, are refused in one line. A sweep's closing lines and exit status (``end``; ``interrupted``:
what ran, and where it is kept). File reads and writes only: tested on data.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, TextIO

from packaging.version import Version

from .exits import EXIT_INTERRUPTED, EXIT_NOTHING_TESTABLE
from .matrix.results import save_atomically
from .matrix.shards import MergeError, same_run
from .progress import render_sweep
from .search import Probe, SweepResult, Verdict

SCHEMA = 1
KIND = "sweep"


@dataclass
class SweptShard:
    """One shard's sweep, as its results file holds it."""
    package: str
    pytest_args: list[str]
    torch: str
    shard: str                          # "K/N"
    versions: list[str]                 # every release of the sweep, this shard's or not
    probes: dict[str, Probe] = field(default_factory=dict)

    def dumps(self) -> str:
        probes = {v: {"verdict": p.verdict.value, "headline": p.headline, "install_seconds": p.install_seconds,
                      "test_seconds": p.test_seconds} for v, p in self.probes.items()}
        return json.dumps({"schema": SCHEMA, "kind": KIND, "package": self.package, "pytest_args": self.pytest_args,
                           "torch": self.torch, "shard": self.shard, "versions": self.versions,
                           "probes": probes}, indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        save_atomically(path, self.dumps())

    def keep(self, path: str | os.PathLike):
        """``search.sweep``'s ``on_probe``: each verdict saved to ``path`` as it comes."""
        def on_probe(version: str, probe: Probe) -> None:
            self.probes[version] = probe
            self.save(path)
        return on_probe

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SweptShard":
        """The shard in ``path``; ValueError with the one line to say."""
        try:
            doc = json.loads(Path(path).read_text())
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ValueError(f"cannot read {path}: not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a sweep's results file (bisect --sweep --shard K/N --results FILE)")
        try:
            probes = {str(v): Probe(Verdict(p["verdict"]), p.get("headline"), p.get("install_seconds"),
                                    p.get("test_seconds")) for v, p in doc["probes"].items()}
            return cls(str(doc["package"]), list(doc["pytest_args"]), str(doc.get("torch") or ""),
                       str(doc.get("shard") or ""), [str(v) for v in doc["versions"]], probes)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"cannot read {path}: malformed sweep: {type(e).__name__}: {e}") from None


def release_seconds(shards: Sequence[SweptShard]) -> dict[str, float]:
    """Seconds each release took in earlier shards (its env's build and its tests), for ``--balance``."""
    return {v: (p.install_seconds or 0.0) + (p.test_seconds or 0.0) for s in shards for v, p in s.probes.items()}


def merge(parts: Sequence[tuple[str, SweptShard]]) -> tuple[SweepResult, list[str]]:
    """The sweep of every shard's releases, and the releases no shard swept (a missing shard's)."""
    if not parts:
        raise MergeError("give the shards' results files after --merge")
    same_run(parts, "sweep")
    probes: dict[str, Probe] = {}
    where: dict[str, str] = {}
    for name, part in parts:
        for v, probe in part.probes.items():
            if v in where:
                raise MergeError(f"{v} is in both {where[v]} and {name}")
            where[v], probes[v] = name, probe
    every = sorted({v for _, part in parts for v in part.versions}, key=Version)
    swept = [v for v in every if v in probes]
    return SweepResult(versions=swept, probes=probes), [v for v in every if v not in probes]


def merge_files(paths: Sequence[str], out: TextIO, err: TextIO) -> tuple[str, SweepResult] | None:
    """(package, merged sweep) of the files, or None with one line on ``err``."""
    try:
        parts = [(p, SweptShard.load(p)) for p in paths]
        result, unswept = merge(parts)
    except ValueError as e:  # MergeError included
        err.write(f"pytest-nccl bisect: {e}\n")
        return None
    if unswept:
        err.write(f"pytest-nccl bisect: not swept (a shard missing, or interrupted): {', '.join(unswept)}\n")
    out.write(f"merged {len(parts)} shard{'s' if len(parts) != 1 else ''}\n")
    return parts[0][1].package, result


def end(package: str, swept: SweepResult, out: TextIO) -> int:
    """The sweep's lines and its exit status (one machine's or merged shards')."""
    for ln in render_sweep(swept, package):
        out.write(ln + "\n")
    if not swept.good and not swept.bad:
        return EXIT_NOTHING_TESTABLE
    return 1 if swept.bad else 0


def interrupted(package: str, results: str | None, shard: SweptShard | None, out: TextIO) -> int:
    """Ctrl-C or SIGTERM during a sweep: the releases swept so far, and where they are kept."""
    if shard is not None and results and shard.probes:
        shard.save(results)
        done = sorted(shard.probes, key=Version)
        for ln in render_sweep(SweepResult(done, dict(shard.probes)), package):
            out.write(ln + "\n")
    kept = f": {results} holds the {len(shard.probes)} release{'s' if len(shard.probes) != 1 else ''} swept" \
        if shard is not None else ""
    out.write(f"\ninterrupted{kept}\n")
    return EXIT_INTERRUPTED
