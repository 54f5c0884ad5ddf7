"""The release matrix (``python -m pytest_nccl matrix``): results model, cells, findings, Markdown.

Pure: data in, data out (no processes, no clock: the caller passes dates). :mod:`.cells` makes
the cells (a row on a release), :mod:`.findings` the findings, :mod:`.render` the Markdown;
:mod:`.cli` runs the releases.

Results: one :class:`Run` per (release, world size): whether the release's env could be built,
the resolved versions of its key packages, the test seconds, and per test nodeid its outcome
(:class:`~pytest_nccl.core.states.CaseOutcome`) and headline (the plugin's one-line diagnosis, else
the failure's first line; for a skip, the skip reason). A run whose pytest did not finish or
exited with neither 0 nor 1 (timeout, collection error, no tests) keeps that reason as
``problem``: a test it has no record for counts as an error with that reason. An outcome word this
version does not know (a newer or foreign file) loads as no result for that test, and is written
back as it was.

Row labels (:func:`row_labels`): the nodeid without the location prefix every row shares
(directories, and the file too when all rows are in one file), ``::`` between what is left of the
location and the function, the function's ``test_`` prefix dropped, and a parametrize id's
``-``-separated parts joined with `` · `` (``test_cell[sft-ragged]`` -> ``cell[sft · ragged]``).
When the function is the only one of its file, its name is left out: ``sft · ragged``. Two rows
that would read the same keep their ``test_`` prefix, and if that is not enough, their nodeids.

Findings (:func:`.findings.findings`), for each row that fails (is red) on some release: the red releases as
ranges in release order; a range is not broken by releases without a verdict (skipped, not run,
cannot install) when the nearest releases with a verdict on both sides are red; "first bad" is the
first release of a range that follows a passing release; "fixed in" the passing release after a
range; whether the newest release is red; the full headline of the newest red release (and of a
first bad release when it says something else).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from packaging.version import InvalidVersion, Version

from ...core.states import CaseOutcome

SCHEMA = 1
#: packages whose resolved versions are recorded per release (plus the package itself)
KEY_PACKAGES = ("transformers", "accelerate", "datasets", "torch")
MARK = "\u2717"
DASH = "\u2013"


# --------------------------------------------------------------------------- model


@dataclass
class TestRecord:
    __test__ = False  # not a pytest test class

    outcome: CaseOutcome | None  # None: a word this version does not know, kept in ``word``
    headline: str = ""
    word: str = ""  # the outcome as the results file wrote it, when this version does not know it

    def __post_init__(self):
        if self.outcome is not None:
            self.outcome = CaseOutcome(self.outcome)  # an outcome given by its word ("passed") is the member

    @classmethod
    def read(cls, word: str, headline: str = "") -> "TestRecord":
        """The record of a results file's outcome word, a word this version does not know included."""
        outcome = CaseOutcome.read(word)
        return cls(outcome, headline, "" if outcome is not None else word)

    @property
    def written(self) -> str:
        """The outcome as the results file writes it."""
        return self.outcome.value if self.outcome is not None else self.word


@dataclass
class Run:
    version: str
    world: int
    env_ok: bool = True
    env_reason: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None  # the pytest run
    env_seconds: float | None = None  # building the env (None: reused from the cache)
    exit_code: int | None = None
    problem: str | None = None
    date: str | None = None
    tests: dict[str, TestRecord] = field(default_factory=dict)

    def counts(self) -> dict[CaseOutcome, int]:
        """Tests per outcome (every outcome there, 0 included; an unknown outcome is not counted)."""
        out = {k: 0 for k in CaseOutcome}
        for rec in self.tests.values():
            if rec.outcome is not None:
                out[rec.outcome] += 1
        return out

    def to_dict(self) -> dict:
        doc = {"env": {"ok": self.env_ok, "reason": self.env_reason,
                       "seconds": _round(self.env_seconds)},
               "packages": dict(sorted(self.packages.items())), "seconds": _round(self.seconds),
               "exit_code": self.exit_code, "problem": self.problem, "date": self.date,
               "tests": {k: ({"outcome": r.written, "headline": r.headline} if r.headline else {"outcome": r.written})
                         for k, r in sorted(self.tests.items())}}
        return doc

    @classmethod
    def from_dict(cls, version: str, world: int, doc: Mapping) -> "Run":
        env = doc.get("env") or {}
        tests = {k: TestRecord.read(str(v.get("outcome")), str(v.get("headline") or ""))
                 for k, v in (doc.get("tests") or {}).items()}
        return cls(version, world, env_ok=bool(env.get("ok", True)), env_reason=env.get("reason"),
                   env_seconds=env.get("seconds"), packages=dict(doc.get("packages") or {}),
                   seconds=doc.get("seconds"), exit_code=doc.get("exit_code"), problem=doc.get("problem"),
                   date=doc.get("date"), tests=tests)


class ResultsError(ValueError):
    """The results file cannot be read (not JSON, another schema)."""


@dataclass
class Results:
    package: str
    pytest_args: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)  # the columns, release order
    worlds: list[int] = field(default_factory=list)
    runs: dict[tuple[str, int], Run] = field(default_factory=dict)
    command: str = ""
    python: str = ""
    torch: str = ""
    as_of: str = "release"
    updated: str = ""
    shard: str = ""  # "K/N": a shard's results (``shards``), merged with the others'; "": the whole matrix

    def get(self, version: str, world: int) -> Run | None:
        return self.runs.get((version, world))

    def put(self, run: Run) -> None:
        self.runs[(run.version, run.world)] = run
        self.plan([run.version], [run.world])

    def plan(self, versions: Iterable[str], worlds: Iterable[int]) -> None:
        """Add columns and world sizes (kept sorted; what is there stays)."""
        self.versions = sort_versions(set(self.versions) | set(versions))
        self.worlds = sorted(set(self.worlds) | {int(w) for w in worlds})

    def to_dict(self) -> dict:
        runs: dict[str, dict] = {}
        for (v, w), run in self.runs.items():
            runs.setdefault(v, {})[str(w)] = run.to_dict()
        doc = {"schema": SCHEMA, "package": self.package, "pytest_args": list(self.pytest_args),
               "versions": list(self.versions), "worlds": list(self.worlds), "command": self.command,
               "python": self.python, "torch": self.torch, "as_of": self.as_of, "updated": self.updated,
               "runs": runs}
        return dict(doc, shard=self.shard) if self.shard else doc  # a whole matrix's file as before

    def dumps(self) -> str:
        """Sorted keys; a list or object of plain values on one line (one line per test), the rest
        indented: a rerun of one (release, world) changes only its lines."""
        return _dump(self.to_dict(), "") + "\n"

    @classmethod
    def loads(cls, text: str) -> "Results":
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ResultsError(f"not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            got = doc.get("schema") if isinstance(doc, dict) else None
            raise ResultsError(f"schema {got!r}, this version reads schema {SCHEMA}")
        try:
            res = cls(package=str(doc.get("package", "")), pytest_args=list(doc.get("pytest_args") or []),
                      command=doc.get("command") or "", python=doc.get("python") or "",
                      torch=doc.get("torch") or "", as_of=doc.get("as_of") or "release",
                      updated=doc.get("updated") or "", shard=str(doc.get("shard") or ""))
            for v, by_world in (doc.get("runs") or {}).items():
                for w, rdoc in by_world.items():
                    res.runs[(v, int(w))] = Run.from_dict(v, int(w), rdoc)
            res.plan(list(doc.get("versions") or []) + [v for v, _ in res.runs],
                     list(doc.get("worlds") or []) + [w for _, w in res.runs])
        except (AttributeError, TypeError, ValueError) as e:
            raise ResultsError(f"malformed results: {type(e).__name__}: {e}") from None
        return res

    def save(self, path: str | os.PathLike) -> None:
        save_atomically(path, self.dumps())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Results":
        return cls.loads(Path(path).read_text())

    def nodeids(self) -> list[str]:
        return sorted({n for run in self.runs.values() for n in run.tests})


def _dump(obj, pad: str) -> str:
    flat = isinstance(obj, dict) and not any(isinstance(v, (dict, list)) for v in obj.values()) or \
        isinstance(obj, list) and not any(isinstance(v, (dict, list)) for v in obj)
    if flat or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, sort_keys=True, ensure_ascii=False)
    inner = pad + " "
    if isinstance(obj, list):
        return "[\n" + ",\n".join(inner + _dump(v, inner) for v in obj) + "\n" + pad + "]"
    items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_dump(obj[k], inner)}" for k in sorted(obj)]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 1)


def sort_versions(versions: Iterable[str]) -> list[str]:
    def key(v: str):
        try:
            return (0, Version(v), v)
        except InvalidVersion:
            return (1, Version("0"), v)
    return sorted(set(versions), key=key)


def latest_patches(versions: Sequence[str], keep: Iterable[str] = ()) -> list[str]:
    """The newest release of each ``major.minor`` series, plus the versions in ``keep``."""
    keep_v = {Version(k) for k in keep}
    newest: dict[tuple[int, int], Version] = {}
    for v in versions:
        pv = Version(v)
        series = (pv.major, pv.minor)
        if series not in newest or pv > newest[series]:
            newest[series] = pv
    chosen = set(newest.values()) | keep_v
    return [v for v in sort_versions(versions) if Version(v) in chosen]


# --------------------------------------------------------------------------- labels


def _split_nodeid(nodeid: str) -> tuple[list[str], str, str | None]:
    """(location parts, function, parametrize id) of a path nodeid or a JUnit ``classname::name``."""
    if "::" not in nodeid:  # a collection error: the module itself
        return [p for p in nodeid.replace(".py", "").replace("/", ".").split(".") if p], "", None
    loc, _, fn = nodeid.rpartition("::")
    loc = loc.replace(".py::", "::").removesuffix(".py")
    parts = [p for p in loc.replace("::", "/").replace(".", "/").split("/") if p]
    param = None
    if fn.endswith("]") and "[" in fn:
        fn, _, param = fn[:-1].partition("[")
    return parts, fn, param


def _id_text(param: str) -> str:
    return " \u00b7 ".join(p for p in param.split("-")) if param else param


def row_labels(nodeids: Sequence[str]) -> dict[str, str]:
    """{nodeid: label}; see the module docstring for the rule."""
    split = {n: _split_nodeid(n) for n in nodeids}
    locs = [parts for parts, _, _ in split.values()]
    common = 0
    if locs:
        shortest = min(len(p) for p in locs)
        while common < shortest and len({tuple(p[:common + 1]) for p in locs}) == 1:
            common += 1
    funcs_at: dict[tuple, set[str]] = {}
    for parts, fn, _ in split.values():
        funcs_at.setdefault(tuple(parts), set()).add(fn)

    def label(n: str, strip: bool) -> str:
        parts, fn, param = split[n]
        where = "/".join(parts[common:])
        if not fn:
            return (where or n) + " (collection)"
        name = fn.removeprefix("test_") if strip and fn != "test_" else fn
        if param is not None and len(funcs_at[tuple(parts)]) == 1:
            what = _id_text(param)
        else:
            what = name + (f"[{_id_text(param)}]" if param is not None else "")
        return f"{where}::{what}" if where else what

    out = {n: label(n, True) for n in nodeids}
    for fallback in (lambda n: label(n, False), lambda n: n):
        seen: dict[str, list[str]] = {}
        for n, text in out.items():
            seen.setdefault(text, []).append(n)
        for group in seen.values():
            if len(group) > 1:
                for n in group:
                    out[n] = fallback(n)
    return out


def save_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (an interrupted save leaves the previous file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
