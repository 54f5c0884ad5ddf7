"""``pytest-nccl matrix`` (also ``python -m pytest_nccl matrix``): run a pytest selection over many
releases and world sizes.

Usage::

    pytest-nccl matrix PACKAGE (--from V --to V | --versions LIST) [--latest-patch [--keep V,...]]
        [--world N ...] --results FILE.json [--out FILE.md] [options] -- PYTEST-ARGS
    pytest-nccl matrix --render-only --results FILE.json [--out FILE.md]
    pytest-nccl matrix ... --shard K/N [--balance EARLIER.json] -- PYTEST-ARGS   (one CI job's share)
    pytest-nccl matrix --merge A.json B.json ... --out FILE.md [--results FILE.json]   (``shards``)

Glue: the releases come from :mod:`..versions`, each release's env from the same
``EnvCache``/``make_request``/``ProbeConfig`` path as ``bisect`` (same cache root and fingerprint,
so the envs are shared), each (release, world) run from :func:`..runner.run_pytest` with
``--nccl-world=N`` added. The results JSON is saved after every run and a (release, world) already
in it is not run again (``--rerun`` runs it again); the Markdown is written after every release.

Exit status: 0 it ran (failing tests are results, not errors), 2 usage error, 4 the release list
could not be had, 6 this interpreter cannot build release envs (torch is not installed; ``--installer
uv`` without uv), 130 interrupted. Progress goes to stdout, errors to stderr; a heartbeat line at
least every minute of a long step.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence, TextIO

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ...core.states import CaseOutcome
from ...usage import Parser
from .. import cli as bisect_cli
from ..heartbeat import Heartbeat
from ..prober import ProbeConfig, make_request
from ..progress import fmt_seconds
from ..runner import RunOutcome, run_pytest
from ..versions import IndexError_, Release, parse_version_list, select_range
from . import shards
from .findings import parse_about, parse_notes
from .render import render
from .results import KEY_PACKAGES, Results, ResultsError, Run, TestRecord, latest_patches

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INDEX = 4
EXIT_ENVIRONMENT = bisect_cli.EXIT_ENVIRONMENT
EXIT_INTERRUPTED = 130
PROG = "pytest-nccl matrix"
DESCRIPTION = ("Run a pytest selection on every release of PACKAGE in a range, at one or more world sizes, each "
               "release in its own cached env (shared with bisect), and write a Markdown matrix (tests x "
               "releases) with the findings. Resumable: runs already in --results are not run again.")
EPILOG = ("Everything after '--' is passed to pytest, e.g. -- suites/trl/matrix -p no:randomly; the tool adds "
          "--nccl-world=N per run. Exit: 0 ran (red cells are results), 2 usage, 4 index error, 6 torch (or uv) "
          "missing, 130 interrupted.")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments, on its own parser or on ``pytest-nccl``'s subcommand parser."""
    bisect_cli.add_package_and_range(p)
    p.add_argument("--latest-patch", action="store_true",
                   help="keep only the newest patch release of each minor series")
    p.add_argument("--keep", metavar="V,...", default="",
                   help="with --latest-patch: releases kept anyway (comma or space separated)")
    p.add_argument("--world", type=int, action="append", metavar="N",
                   help="world size (repeatable; default 2); the tool adds --nccl-world=N to pytest")
    p.add_argument("--results", metavar="FILE", help="results JSON, read to resume and rewritten after every run")
    p.add_argument("--out", metavar="FILE", help="the Markdown matrix (default: --results with .md)")
    p.add_argument("--rerun", action="store_true", help="run again the (release, world) pairs already in --results")
    p.add_argument("--render-only", action="store_true", help="write the Markdown from --results; run nothing")
    shards.add_arguments(p)
    p.add_argument("--notes", metavar="FILE",
                   help="TOML of what is known about failing rows ([[note]] rows = [globs], text, new), shown "
                        "under Findings, and an 'about' text shown under the title (default: notes.toml "
                        "beside --results, when there is one)")
    bisect_cli.add_release_options(p)


def parse_args(argv: Sequence[str], prog: str = PROG) -> argparse.Namespace:
    own, pytest_args = bisect_cli.split_argv(argv)
    parser = build_parser(prog)
    return check_args(parser, parser.parse_args(own), pytest_args, argv)


def check_args(parser: argparse.ArgumentParser, ns: argparse.Namespace, pytest_args: list[str],
               argv: Sequence[str]) -> argparse.Namespace:
    """What argparse alone cannot check; ``parser.error`` (one line, exit 2) for what is wrong."""
    ns.argv, ns.prog = list(argv), parser.prog
    ns.pytest_args = pytest_args
    shards.check(parser, ns)  # --shard, --balance, --merge (and --results, required but with --merge)
    ns.results = Path(ns.results)
    ns.out = Path(ns.out) if ns.out else ns.results.with_suffix(".md")
    if ns.out.resolve() == ns.results.resolve():
        parser.error("--out and --results are the same file")
    if ns.notes is None and (ns.results.parent / "notes.toml").is_file():
        ns.notes = ns.results.parent / "notes.toml"
    ns.note_list, ns.about = [], ""
    if ns.notes is not None:
        try:
            text = Path(ns.notes).read_text()
            ns.note_list, ns.about = parse_notes(text), parse_about(text)
        except (OSError, ResultsError) as e:
            parser.error(f"--notes {ns.notes}: {e}")
    if ns.render_only or ns.merge:
        return ns
    if not ns.package:
        parser.error("give the PACKAGE, e.g. trl (or --render-only)")
    if ns.versions and (ns.from_ or ns.to):
        parser.error("give --from/--to or --versions, not both")
    if not ns.versions and not (ns.from_ and ns.to):
        parser.error("give the releases: --from V --to V, or --versions LIST")
    ns.keep = parse_version_list(ns.keep)
    ns.version_list = parse_version_list(ns.versions) if ns.versions else []
    for v in [ns.from_, ns.to, *ns.version_list, *ns.keep]:
        if v is None:
            continue
        try:
            Version(v)
        except InvalidVersion:
            parser.error(f"{v!r} is not a version")
    ns.worlds = sorted(set(ns.world or [2]))
    if ns.worlds[0] < 1:
        parser.error("--world must be at least 1")
    if not pytest_args:
        parser.error("give the pytest selection after '--', e.g. -- suites/trl/matrix")
    if any(a.startswith("--nccl-world") for a in pytest_args):
        parser.error("leave --nccl-world out of the pytest args: the tool adds it per --world")
    bisect_cli.check_release_options(parser, ns)
    return ns


# --------------------------------------------------------------------------- parts


def list_releases(ns, out: TextIO) -> list[Release]:
    if ns.version_list:
        given = {Version(r.version): r for r in bisect_cli.given_releases(ns, ns.version_list, out)}
        rels = [given[k] for k in sorted(given)]
    else:
        rels = select_range(bisect_cli._index(ns).releases(ns.package), ns.from_, ns.to,
                            pre=ns.pre, yanked=ns.include_yanked)
    if ns.latest_patch:
        kept = set(latest_patches([r.version for r in rels], ns.keep))
        rels = [r for r in rels if r.version in kept]
    return rels


_VERSIONS_SNIPPET = r"""
import importlib.metadata as md, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def read_packages(python: Path, names: Sequence[str]) -> dict[str, str]:
    """{name: version} of the installed ``names`` in the env (what is missing is left out)."""
    try:
        p = subprocess.run([str(python), "-c", _VERSIONS_SNIPPET, *names], capture_output=True, text=True,
                           timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        return {str(k): str(v) for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, AttributeError):
        return {}


def run_record(version: str, world: int, outcome: RunOutcome, packages: dict[str, str],
               env_seconds: float | None, date: str) -> Run:
    """The results' record of one pytest run. A pytest stopped by SIGINT or SIGTERM that was not our
    timeout is the matrix being stopped, not a result: KeyboardInterrupt (nothing recorded)."""
    if not outcome.timed_out and outcome.exit_code in (-signal.SIGINT, -signal.SIGTERM):
        raise KeyboardInterrupt
    tests = {}
    for c in outcome.cases:
        headline = "" if c.outcome is CaseOutcome.PASSED else (c.headline or c.outcome.value)
        tests[c.nodeid] = TestRecord(c.outcome, headline)
    problem = None
    if outcome.timed_out or outcome.exit_code not in (0, 1) or (outcome.exit_code == 1 and not tests):
        problem = outcome.headline or f"pytest exited {outcome.exit_code}"
    return Run(version, world, packages=dict(packages), seconds=outcome.seconds, env_seconds=env_seconds,
               exit_code=outcome.exit_code, problem=problem, date=date, tests=tests)


class Progress:
    """One line per (release, world): env built / cached, test time, counts."""

    def __init__(self, out: TextIO, total: int, verbose: bool = False):
        self.out, self.total, self.verbose, self.n = out, total, verbose, 0

    def _write(self, text: str, end: bool = False) -> None:
        if self.verbose:
            text = text.strip() + "\n" if text.strip() else ""
        elif end:
            text += "\n"
        self.out.write(text)
        self.out.flush()

    def start(self, package: str, version: str, world: int, env, first: bool = True) -> None:
        self.n += 1
        self._write(f"[{self.n}/{self.total}] {package} {version} w{world}: ")
        if not first:
            self._write("env ready, " if env.ok else "env failed")
        elif env.cached:
            self._write(("env cached" if env.ok else "env cached failure") + f" ({fmt_seconds(env.seconds)})")
            self._write(", " if env.ok else "")
        else:
            self._write(("env built" if env.ok else "env failed") + f" in {fmt_seconds(env.seconds)}")
            self._write(", " if env.ok else "")

    def cannot_install(self, reason: str | None) -> None:
        self._write(f": cannot install: {reason}", end=True)

    def done(self, run: Run) -> None:
        parts = [f"{n} {outcome}" for outcome, n in run.counts().items() if n]
        text = f"tests {fmt_seconds(run.seconds)}: " + (", ".join(parts) or "no tests")
        if run.problem:
            text += f" ({run.problem})"
        self._write(text, end=True)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, prog: str = PROG) -> int:
    return bisect_cli.main(argv, out, prog, parse=parse_args, command=run_command)


def run_command(ns, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """A parsed command; Ctrl-C and SIGTERM as exit 130: ``kill`` of a long matrix ends it as
    Ctrl-C does, what ran is saved and the run it was in is not recorded (``run`` catches the
    interrupt during the runs; this, before them: listing releases, making the cache)."""
    return bisect_cli.interruptible(run, ns, out, err, sigterm=True)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def write_markdown(results: Results, path: Path, notes=(), about: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(results, notes=notes, about=about))
    os.replace(tmp, path)


def _load(ns, err: TextIO) -> Results | None:
    try:
        return Results.load(ns.results)
    except (OSError, ResultsError) as e:
        err.write(f"pytest-nccl matrix: cannot read {ns.results}: {e}\n")
        return None


def run(ns, out: TextIO, *, err: TextIO | None = None, index=None, make_cache=None,
        run_tests: Callable[..., RunOutcome] = run_pytest,
        packages_of: Callable[[Path, Sequence[str]], dict[str, str]] = read_packages,
        now: Callable[[], _dt.datetime] = _now, heartbeat: Heartbeat | None = None) -> int:
    """Run a parsed command: progress on ``out``, errors on ``err`` (stderr). ``index``,
    ``make_cache(ns, out)``, ``run_tests`` (the pytest runner), ``packages_of(python, names)``, ``now``
    and ``heartbeat`` are injectable: the tests drive it without envs."""
    err = err or sys.stderr
    if ns.render_only:
        results = _load(ns, err)
        if results is None:
            return EXIT_USAGE
        write_markdown(results, ns.out, ns.note_list, ns.about)
        out.write(f"wrote {ns.out} from {ns.results}\n")
        return EXIT_OK
    if ns.merge:
        return shards.merge_files(ns, out, err, write_markdown)
    ns.index = index
    try:
        releases = list_releases(ns, out)
    except IndexError_ as e:
        err.write(f"pytest-nccl matrix: {e}\n")
        return EXIT_INDEX
    if not releases:
        err.write(f"pytest-nccl matrix: no release of {ns.package} left to run\n")
        return EXIT_INDEX
    results = Results(ns.package, list(ns.pytest_args))
    if ns.results.exists():
        old = _load(ns, err)
        if old is None:
            return EXIT_USAGE
        if canonicalize_name(old.package) != canonicalize_name(ns.package):
            err.write(f"pytest-nccl matrix: {ns.results} holds {old.package}, not {ns.package}\n")
            return EXIT_USAGE
        if old.pytest_args != list(ns.pytest_args) and not ns.rerun:
            err.write(f"pytest-nccl matrix: {ns.results} was made with `pytest {shlex.join(old.pytest_args)}`, "
                      f"not `pytest {shlex.join(ns.pytest_args)}`; give another --results, or --rerun to start "
                      "it again\n")
            return EXIT_USAGE
        if old.pytest_args == list(ns.pytest_args):
            results = old
    try:
        cache, installer, tooling, lifted, constraints = (make_cache or bisect_cli._make_cache)(ns, out, "matrix")
    except bisect_cli.EnvironmentProblem as e:
        err.write(f"{e}\n")
        return EXIT_ENVIRONMENT
    step = (heartbeat or Heartbeat(out)).step
    base = cache.base
    config = ProbeConfig(package=ns.package, pytest_args=list(ns.pytest_args), extra=list(ns.extra),
                         tooling=tooling, constraints=constraints, lifted=lifted, as_of=ns.as_of,
                         installer=installer, timeout=ns.run_timeout, rebuild=ns.rebuild, cwd=os.getcwd(),
                         stream=ns.verbose)
    versions = [r.version for r in releases]
    as_of = ns.as_of if isinstance(ns.as_of, str) else ns.as_of.isoformat()
    results.package, results.pytest_args, results.as_of = ns.package, list(ns.pytest_args), as_of
    results.command = f"{ns.prog} {shlex.join(ns.argv)}"  # as the user ran it
    results.python, results.torch = base.python_version, base.torch_version or ""
    results.plan(versions, ns.worlds)  # a shard's page too has every release: the others' read as not run
    mine = shards.share(versions, ns.shard, ns.balance_seconds) if ns.shard else versions
    results.shard = str(ns.shard or "")
    todo = [(v, w) for v in mine for w in ns.worlds if ns.rerun or results.get(v, w) is None]
    total = len(mine) * len(ns.worlds)
    out.write(f"pytest-nccl matrix: {ns.package} {', '.join(versions)} ({len(versions)} release"
              f"{'s' if len(versions) != 1 else ''}) x world {', '.join(map(str, ns.worlds))}\n")
    out.write(f"envs: {cache.envs} ({installer}, layered on torch {base.torch_version}, dependencies as of {as_of})\n")
    out.write(f"tests: pytest {shlex.join(ns.pytest_args)} --nccl-world=N\n")
    if ns.shard:
        out.write(f"shard {ns.shard}: {', '.join(mine) or 'no release'}"
                  f" ({'by the seconds of ' + str(ns.balance) if ns.balance_seconds else 'in turn'})\n")
    out.write(f"results: {ns.results}: {total - len(todo)} of {total} runs there already, {len(todo)} to run"
              + (" (--rerun to run them again)" if total - len(todo) and not ns.rerun else "") + "\n")
    by_version = {r.version: r for r in releases}
    progress = Progress(out, len(todo), verbose=ns.verbose)
    try:
        for v in versions:
            worlds = [w for w in ns.worlds if (v, w) in todo]
            if worlds:
                _run_release(ns, results, cache, config, by_version[v], worlds, progress, run_tests,
                             packages_of, now, step)
                write_markdown(results, ns.out, ns.note_list, ns.about)
    except KeyboardInterrupt:
        results.save(ns.results)
        write_markdown(results, ns.out, ns.note_list, ns.about)
        out.write(f"\ninterrupted: {ns.results} and {ns.out} hold what ran\n")
        return EXIT_INTERRUPTED
    results.updated = results.updated or now().isoformat(timespec="seconds")
    results.save(ns.results)
    write_markdown(results, ns.out, ns.note_list, ns.about)
    out.write(f"wrote {ns.results} and {ns.out}\n")
    return EXIT_OK


def _run_release(ns, results: Results, cache, config: ProbeConfig, release: Release, worlds: list[int],
                 progress: Progress, run_tests, packages_of, now, step) -> None:
    v = release.version
    with step(f"env of {ns.package} {v}"):
        env = cache.ensure(make_request(config, v, release), rebuild=ns.rebuild)
    built = env.build_seconds  # what building it took, whether now or on an earlier run
    packages: dict[str, str] = {}
    if env.ok:
        names = list(dict.fromkeys([*KEY_PACKAGES, canonicalize_name(ns.package)]))
        packages = packages_of(env.python, names)
    for i, w in enumerate(worlds):
        progress.start(ns.package, v, w, env, first=i == 0)
        date = now().isoformat(timespec="seconds")
        if not env.ok:
            progress.cannot_install(env.reason)
            record = Run(v, w, env_ok=False, env_reason=env.reason, env_seconds=built, date=date)
        else:
            with step(f"tests on {ns.package} {v} at world {w}"):
                outcome = run_tests(env.python, [*config.pytest_args, f"--nccl-world={w}"],
                                    log=Path(env.path) / f"pytest-w{w}.log", timeout=config.timeout, cwd=config.cwd,
                                    stream=config.stream)
            record = run_record(v, w, outcome, packages, built, date)
            progress.done(record)
        results.put(record)
        results.updated = date
        results.save(ns.results)
