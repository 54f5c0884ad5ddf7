"""``pytest-nccl bisect`` (also ``python -m pytest_nccl bisect``): find the release that broke (or
fixed) a test.

Usage::

    pytest-nccl bisect PACKAGE --good V --bad V [options] -- PYTEST-ARGS
    pytest-nccl bisect PACKAGE --sweep --from V --to V [options] -- PYTEST-ARGS
    pytest-nccl bisect PACKAGE --sweep ... --shard K/N --results FILE.json -- ...   (``sweeps``)
    pytest-nccl bisect --merge A.json B.json ...                                     (their sweep)

Exit status:

- bisect: 0 the first bad (or first fixed) release was found; 1 found, but skipped releases next
  to it make it ambiguous (they are named); 3 a bound does not behave as claimed or cannot be
  tested; 4 the release list could not be obtained or a bound is not a release; 2 usage error.
- sweep: 0 no release is bad; 1 at least one release is bad; 5 no release could be tested;
  4 and 2 as above.
- 6 this interpreter cannot build release envs (torch is not installed; ``--installer uv`` without uv).
- 130 when interrupted.

Progress goes to stdout, errors to stderr; a heartbeat line at least every minute of a long step.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Sequence, TextIO

from packaging.version import InvalidVersion, Version

from ..usage import Parser, UsageError, report
from . import builders, search, sweeps
from . import envs as envs_mod
from .exits import (  # noqa: F401 (the statuses, as the tests and callers name them: cli.EXIT_...)
    EXIT_AMBIGUOUS,
    EXIT_BOUNDS,
    EXIT_ENVIRONMENT,
    EXIT_FOUND,
    EXIT_INDEX,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_TESTABLE,
    EXIT_USAGE,
)
from .heartbeat import Heartbeat
from .matrix.shards import parse_shard, share
from .prober import ProbeConfig, ReleaseProber, tooling_requirements
from .progress import TerminalReporter, render_bisect
from .search import BoundsError
from .versions import (
    Index,
    IndexError_,
    PipIndex,
    PyPIJsonIndex,
    Release,
    StaticIndex,
    parse_version_list,
    select_range,
)

PROG = "pytest-nccl bisect"
RUN_TIMEOUT = 1800.0



DESCRIPTION = ("Binary-search the releases of PACKAGE for the first one where a pytest selection fails "
               "(good older than bad) or passes again (good newer than bad). Each probed release gets its "
               "own cached env layered on the torch already installed.")
EPILOG = ("Everything after '--' is passed to pytest, e.g. -- suites/trl -k cpo --nccl-world=2. "
          "Exit: bisect 0 found, 1 ambiguous (skips), 3 bounds wrong, 4 index error; sweep 0 none bad, "
          "1 some bad, 5 nothing testable; 2 usage error, 6 torch (or uv) missing, 130 interrupted.")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments, on its own parser or on ``pytest-nccl``'s subcommand parser."""
    add_package_and_range(p, " (a --sweep's; or --good/--bad)")
    p.add_argument("--good", metavar="V", help="a release where the tests pass")
    p.add_argument("--bad", metavar="V", help="a release where the tests fail")
    p.add_argument("--sweep", action="store_true",
                   help="test every release in the range (a verdict each) instead of bisecting")
    p.add_argument("--shard", metavar="K/N", help="with --sweep: only this job's share of the releases (K of N)")
    p.add_argument("--results", metavar="FILE", help="with --sweep: write the verdicts here (JSON), for --merge")
    p.add_argument("--balance", metavar="FILE", nargs="+", help="with --shard: share the releases by the seconds "
                   "they took in these earlier shards' --results (default: in turn)")
    p.add_argument("--merge", metavar="FILE", nargs="+", help="print the sweep of these shards' --results; run nothing")
    p.add_argument("--no-check-bounds", action="store_true",
                   help="trust --good/--bad instead of testing them first")
    add_release_options(p, "; past it the release is a skip")


def add_package_and_range(p: argparse.ArgumentParser, range_note: str = "") -> None:
    """The arguments bisect and matrix share first: the package and which of its releases."""
    # optional to argparse, so that none given is check_args' one line with an example, not
    # argparse's list of what is required
    p.add_argument("package", nargs="?", help="distribution name on the index, e.g. trl")
    p.add_argument("--from", dest="from_", metavar="V", help=f"first release of the range{range_note}")
    p.add_argument("--to", metavar="V", help="last release of the range")
    p.add_argument("--versions", metavar="LIST",
                   help="the releases, comma or space separated, instead of the index's list for a range")


def add_run_timeout(p: argparse.ArgumentParser, more: str = "") -> None:
    """``--run-timeout`` (a whole pytest run). ``--timeout`` was its name up to 0.1, and means the
    diagnosis bound in the plugin and the stall bound in watch: kept one release as a hidden alias."""
    p.add_argument("--run-timeout", type=float, default=None, metavar="S",
                   help=f"bound for one whole pytest run (default {RUN_TIMEOUT:.0f}){more}")
    p.add_argument("--timeout", dest="deprecated_timeout", type=float, default=None, help=argparse.SUPPRESS)


def add_release_options(p: argparse.ArgumentParser, run_timeout_note: str = "") -> None:
    """The options bisect and matrix share last: where the release list comes from, how each
    release's env is built (the same cache and fingerprint for both), a run's bound, -v."""
    p.add_argument("--pre", action="store_true", help="include pre-releases")
    p.add_argument("--include-yanked", action="store_true", help="include yanked releases")
    p.add_argument("--index-url", metavar="URL",
                   help="PyPI JSON API base (default $PYTEST_NCCL_PYPI_JSON or https://pypi.org/pypi)")
    p.add_argument("--pip-index", action="store_true",
                   help="list releases with 'pip index versions' (configured pip index) instead of the JSON API")
    p.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto",
                   help="resolver for the envs: uv when present (auto), else pip")
    p.add_argument("--with", dest="extra", action="append", default=[], metavar="REQ",
                   help="extra requirement for every env (repeatable), e.g. peft or 'transformers<4.50'")
    p.add_argument("--as-of", default="release", metavar="WHEN",
                   help="resolve each release's dependencies as of: 'release' (its upload date, default), "
                        "'now', or an ISO date")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="cache root (default $PYTEST_NCCL_CACHE or ~/.cache/pytest-nccl); envs in DIR/envs")
    p.add_argument("--rebuild", action="store_true", help="rebuild envs even when cached (retries failed installs)")
    add_run_timeout(p, run_timeout_note)
    p.add_argument("-v", "--verbose", action="store_true", help="stream the installer's and pytest's output")


def check_release_options(parser: argparse.ArgumentParser, ns: argparse.Namespace,
                          err: TextIO | None = None) -> None:
    """``--as-of`` to a datetime (unless 'release' or 'now') and a positive ``--run-timeout``, or
    one argparse error line; the deprecated ``--timeout`` says so on stderr and stands in for it."""
    if ns.as_of not in ("release", "now"):
        try:
            t = _dt.datetime.fromisoformat(ns.as_of.replace("Z", "+00:00"))
        except ValueError:
            parser.error(f"--as-of: {ns.as_of!r} is not 'release', 'now' or an ISO date")
        ns.as_of = t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
    if ns.deprecated_timeout is not None:
        (err or sys.stderr).write(f"{parser.prog}: --timeout is deprecated and will be removed: use "
                                  "--run-timeout (the bound of one whole pytest run)\n")
        if ns.run_timeout is None:
            ns.run_timeout = ns.deprecated_timeout
    if ns.run_timeout is None:
        ns.run_timeout = RUN_TIMEOUT
    if ns.run_timeout <= 0:
        parser.error("--run-timeout must be positive")


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_args(argv: Sequence[str], prog: str = PROG) -> argparse.Namespace:
    own, pytest_args = split_argv(argv)
    parser = build_parser(prog)
    return check_args(parser, parser.parse_args(own), pytest_args)


def check_args(parser: argparse.ArgumentParser, ns: argparse.Namespace, pytest_args: list[str]) -> argparse.Namespace:
    """What argparse alone cannot check; ``parser.error`` (one line, exit 2) for what is wrong."""
    ns.pytest_args = pytest_args
    if ns.merge is not None:
        if ns.package or pytest_args or ns.shard or ns.results or ns.balance or ns.good or ns.bad or ns.from_ or ns.to:
            parser.error("--merge takes the sweep shards' results files only")
        return ns
    if not ns.package:
        parser.error("give the PACKAGE and its releases, e.g. trl --good 0.13.0 --bad 0.16.1 -- suites/trl -k cpo")
    if ns.sweep:
        lo = ns.from_ or ns.good
        hi = ns.to or ns.bad
        if not lo or not hi:
            parser.error("--sweep needs the range: --from V --to V (or --good/--bad)")
        ns.range = (lo, hi)
    else:
        if ns.from_ or ns.to:
            parser.error("--from/--to are for --sweep; a bisect takes --good and --bad")
        if not ns.good or not ns.bad:
            parser.error("a bisect needs --good V and --bad V (or --sweep)")
        ns.range = (ns.good, ns.bad)
    for v in ns.range:
        try:
            Version(v)
        except InvalidVersion:
            parser.error(f"{v!r} is not a version")
    if not ns.sweep and Version(ns.good) == Version(ns.bad):
        parser.error("--good and --bad are the same version")
    if not pytest_args:
        parser.error("give the pytest selection after '--', e.g. -- suites/trl -k cpo")
    if (ns.shard or ns.results or ns.balance) and not ns.sweep:
        parser.error("--shard, --results and --balance are for --sweep")
    if ns.balance and not ns.shard:
        parser.error("--balance shares the releases among shards: give --shard K/N too")
    try:
        ns.shard = parse_shard(ns.shard) if ns.shard else None
        ns.balance_seconds = sweeps.release_seconds([sweeps.SweptShard.load(p) for p in ns.balance or ()])
    except ValueError as e:
        parser.error(str(e))
    check_release_options(parser, ns)
    return ns


# --------------------------------------------------------------------------- main


def _index(ns) -> Index:
    if getattr(ns, "index", None) is not None:
        return ns.index
    if ns.pip_index:
        return PipIndex()
    return PyPIJsonIndex(ns.index_url)


def given_releases(ns, versions: Sequence[str], out: TextIO) -> list[Release]:
    """The releases named by ``--versions`` (bisect and matrix), with their upload dates from the
    index when ``--as-of release`` needs them (best effort: without the index they resolve with
    the newest dependencies, said once)."""
    dated: dict[str, Release] = {}
    if ns.as_of == "release":
        try:
            dated = {r.version: r for r in _index(ns).releases(ns.package)}
        except IndexError_ as e:
            out.write(f"note: no release dates ({e}); resolving with the newest dependencies\n")
    return [dated.get(v, Release(v)) for v in versions]


def _list_releases(ns, out: TextIO) -> list[Release]:
    lo, hi = ns.range
    if ns.versions:
        given = parse_version_list(ns.versions)
        for b in (lo, hi):  # the bounds are probed too, listed or not
            if all(Version(v) != Version(b) for v in given):
                given.append(b)
        rels = given_releases(ns, given, out)
        return select_range(StaticIndex({ns.package: rels}).releases(ns.package), lo, hi,
                            pre=True, yanked=True)
    return select_range(_index(ns).releases(ns.package), lo, hi, pre=ns.pre, yanked=ns.include_yanked)


class EnvironmentProblem(Exception):
    """This interpreter cannot build release envs (exit ``EXIT_ENVIRONMENT``, not the usage code)."""


def _make_cache(ns, out: TextIO,
                prog: str = "bisect") -> tuple[envs_mod.EnvCache, str, list[str], list[str], list[str]]:
    root = envs_mod.cache_root(ns.cache_dir)
    base = envs_mod.detect_base()
    if not base.torch_version:
        raise EnvironmentProblem(f"pytest-nccl {prog}: torch is not installed in this interpreter; install it "
                                 "first (the envs are layered on it)")
    uv = builders.find_uv() if ns.installer in ("auto", "uv") else None
    if ns.installer == "uv" and not uv:
        raise EnvironmentProblem(f"pytest-nccl {prog}: --installer uv but no uv found (pip install uv)")
    builder: builders.UvBuilder | builders.PipBuilder
    if uv:
        builder = builders.UvBuilder(uv, stream=ns.verbose)
    else:
        builder = builders.PipBuilder(root / "layers", stream=ns.verbose)
    repo_pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    tooling = tooling_requirements(repo_pyproject)
    from packaging.requirements import Requirement

    names = [Requirement(r).name for r in tooling]
    lifted = envs_mod.requirement_closure(["torch", *names], envs_mod.installed_requires)
    constraints = [f"torch=={base.torch_version}"]
    return envs_mod.EnvCache(root, builder, base), builder.name, tooling, lifted, constraints


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, prog: str = PROG, *,
         parse: Callable | None = None, command: Callable | None = None) -> int:
    """The command line of ``bisect`` (or of the command whose ``parse`` and ``command`` are given):
    a usage error as one line and exit 2."""
    try:
        ns = (parse or parse_args)(list(sys.argv[1:] if argv is None else argv), prog)
    except UsageError as e:
        return report(e, prog)
    except SystemExit as e:  # --help
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    return (command or run_command)(ns, out)


def run_command(ns, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """A parsed command, with Ctrl-C as exit 130."""
    return interruptible(run, ns, out, err, sigterm=True)


def interruptible(run_parsed: Callable, ns, out: TextIO | None, err: TextIO | None,
                  sigterm: bool = False) -> int:
    """``run_parsed(ns, out, err=err)`` with Ctrl-C (and, with ``sigterm``, a SIGTERM: the ``kill``
    of a long run) as exit 130: what ran is kept, the running pytest's process group is killed
    (``runner.run_pytest``)."""
    out = out or sys.stdout
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if sigterm else None
    try:
        return run_parsed(ns, out, err=err)
    except KeyboardInterrupt:
        (err or sys.stderr).write("\ninterrupted\n")
        return EXIT_INTERRUPTED
    finally:
        if sigterm:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run(ns, out: TextIO, *, err: TextIO | None = None, index=None, make_cache=None, run_tests=None,
        heartbeat: Heartbeat | None = None) -> int:
    """Run a parsed command: progress on ``out``, errors on ``err`` (stderr). ``index``,
    ``make_cache(ns, out)``, ``run_tests`` (the pytest runner) and ``heartbeat`` are injectable: the
    project's tests drive the whole CLI on a fake index."""
    err = err or sys.stderr
    if ns.merge is not None:
        merged = sweeps.merge_files(ns.merge, out, err)
        return EXIT_USAGE if merged is None else sweeps.end(*merged, out)
    ns.index = index
    try:
        releases = _list_releases(ns, out)
    except IndexError_ as e:
        err.write(f"pytest-nccl bisect: {e}\n")
        return EXIT_INDEX
    versions = [r.version for r in releases]
    try:
        cache, installer, tooling, lifted, constraints = (make_cache or _make_cache)(ns, out)
    except EnvironmentProblem as e:
        err.write(f"{e}\n")
        return EXIT_ENVIRONMENT
    step = (heartbeat or Heartbeat(out)).step
    extra_kw = {"run": run_tests} if run_tests is not None else {}
    base = cache.base
    config = ProbeConfig(package=ns.package, pytest_args=list(ns.pytest_args), extra=list(ns.extra),
                         tooling=tooling, constraints=constraints, lifted=lifted, as_of=ns.as_of,
                         installer=installer, timeout=ns.run_timeout, rebuild=ns.rebuild, cwd=os.getcwd(),
                         stream=ns.verbose)
    as_of = ns.as_of if isinstance(ns.as_of, str) else ns.as_of.isoformat()
    out.write(f"pytest-nccl bisect: {ns.package} {', '.join(versions)} ({len(versions)} release"
              f"{'s' if len(versions) != 1 else ''})\n")
    note = " when the index gives upload times" if installer == "pip" and ns.as_of == "release" else ""
    out.write(f"envs: {cache.envs} ({installer}, layered on torch {base.torch_version}, "
              f"dependencies as of {as_of}{note})\n")
    out.write(f"tests: pytest {' '.join(ns.pytest_args)}\n")
    by_version = {r.version: r for r in releases}

    if ns.sweep:
        mine = share(versions, ns.shard, ns.balance_seconds) if ns.shard else versions
        if ns.shard:
            how = f"by the seconds of {', '.join(ns.balance)}" if ns.balance_seconds else "in turn"
            out.write(f"shard {ns.shard}: {', '.join(mine) or 'no release'} ({how})\n")
        reporter = TerminalReporter(out, total=len(mine), verbose=ns.verbose)
        prober = ReleaseProber(cache, by_version, config, reporter=reporter, step=step, **extra_kw)
        # for --merge: saved after every release, so that a job killed at its time limit keeps its verdicts
        shard = sweeps.SweptShard(ns.package, list(ns.pytest_args), base.torch_version or "", str(ns.shard or ""),
                                  versions) if ns.results else None
        try:
            swept = search.sweep(mine, prober, on_probe=shard.keep(ns.results) if shard else None)
        except KeyboardInterrupt:
            return sweeps.interrupted(ns.package, ns.results, shard, out)
        if shard is not None:
            shard.save(ns.results)
        return sweeps.end(ns.package, swept, out)

    mode = search.direction(ns.good, ns.bad)
    out.write(f"{mode.value}: good {ns.good}, bad {ns.bad} -> looking for the {mode.label} release\n")
    reporter = TerminalReporter(out, verbose=ns.verbose)
    roles = {ns.good: "good bound", ns.bad: "bad bound"}
    prober = ReleaseProber(cache, by_version, config, reporter=reporter, roles=roles, step=step, **extra_kw)
    try:
        result = search.bisect(versions, ns.good, ns.bad, prober, check_bounds=not ns.no_check_bounds,
                               on_step=reporter.step)
    except BoundsError as e:
        err.write(f"pytest-nccl bisect: {e}\n")
        if e.probe.detail:
            err.write(f"  log: {e.probe.detail}\n")
        return EXIT_BOUNDS
    if result.first not in result.probes and result.mode is search.Direction.REGRESSION:
        # bounds trusted: probe the answer once for its headline
        result.probes[result.first] = prober(result.first)
    for ln in render_bisect(result, ns.package):
        out.write(ln + "\n")
    return EXIT_AMBIGUOUS if result.ambiguous else EXIT_FOUND
