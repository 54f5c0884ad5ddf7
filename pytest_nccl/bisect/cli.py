"""``python -m pytest_nccl bisect`` / ``pytest-nccl bisect``: find the release that broke (or fixed) a test.

Usage::

    python -m pytest_nccl bisect PACKAGE --good V --bad V [options] -- PYTEST-ARGS
    python -m pytest_nccl bisect PACKAGE --sweep --from V --to V [options] -- PYTEST-ARGS

Exit status:

- bisect: 0 the first bad (or first fixed) release was found; 1 found, but skipped releases next
  to it make it ambiguous (they are named); 3 a bound does not behave as claimed or cannot be
  tested; 4 the release list could not be obtained or a bound is not a release; 2 usage error.
- sweep: 0 no release is bad; 1 at least one release is bad; 5 no release could be tested;
  4 and 2 as above.
- 130 when interrupted.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from pathlib import Path
from typing import Sequence, TextIO

from packaging.version import InvalidVersion, Version

from . import builders
from . import envs as envs_mod
from . import search
from .prober import ProbeConfig, ReleaseProber, tooling_requirements
from .runner import RunOutcome
from .search import BisectResult, BoundsError, Probe, SweepResult, Verdict
from .versions import IndexError_, PipIndex, PyPIJsonIndex, Release, StaticIndex, parse_version_list, select_range

EXIT_FOUND = 0
EXIT_AMBIGUOUS = 1
EXIT_USAGE = 2
EXIT_BOUNDS = 3
EXIT_INDEX = 4
EXIT_NOTHING_TESTABLE = 5
EXIT_INTERRUPTED = 130

DASH = "\u2014"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pytest_nccl bisect",
        description="Binary-search the releases of PACKAGE for the first one where a pytest selection "
                    "fails (good older than bad) or passes again (good newer than bad). Each probed "
                    "release gets its own cached env layered on the torch already installed.",
        epilog="Everything after '--' is passed to pytest, e.g. -- suites/trl -k cpo --nccl-world=2. "
               "Exit: bisect 0 found, 1 ambiguous (skips), 3 bounds wrong, 4 index error; "
               "sweep 0 none bad, 1 some bad, 5 nothing testable.",
    )
    p.add_argument("package", help="distribution name on the index, e.g. trl")
    p.add_argument("--good", metavar="V", help="a release where the tests pass")
    p.add_argument("--bad", metavar="V", help="a release where the tests fail")
    p.add_argument("--sweep", action="store_true",
                   help="test every release in the range (a verdict each) instead of bisecting")
    p.add_argument("--from", dest="from_", metavar="V", help="sweep: first release (or use --good/--bad)")
    p.add_argument("--to", metavar="V", help="sweep: last release")
    p.add_argument("--versions", metavar="LIST",
                   help="the releases to consider, comma or space separated, instead of the index's list")
    add_release_options(p)
    p.add_argument("--no-check-bounds", action="store_true",
                   help="trust --good/--bad instead of testing them first")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                   help="bound for one pytest run (default 1800); past it the release is a skip")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the installer's and pytest's output")
    return p


def add_release_options(p: argparse.ArgumentParser) -> None:
    """The options bisect and matrix share: where the release list comes from, and how each
    release's env is built (the same cache and fingerprint for both)."""
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


def check_release_options(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """``--as-of`` to a datetime (unless 'release' or 'now') and a positive ``--timeout``, or
    one argparse error line."""
    if ns.as_of not in ("release", "now"):
        try:
            t = _dt.datetime.fromisoformat(ns.as_of.replace("Z", "+00:00"))
        except ValueError:
            parser.error(f"--as-of: {ns.as_of!r} is not 'release', 'now' or an ISO date")
        ns.as_of = t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
    if ns.timeout <= 0:
        parser.error("--timeout must be positive")


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    own, pytest_args = split_argv(argv)
    parser = build_parser()
    ns = parser.parse_args(own)
    ns.pytest_args = pytest_args
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
    check_release_options(parser, ns)
    return ns


# --------------------------------------------------------------------------- output


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class TerminalReporter:
    """Progress lines: which version is probed, install time, test time, verdict."""

    def __init__(self, out: TextIO, total: int | None = None, verbose: bool = False):
        self.out = out
        self.total = total
        self.verbose = verbose

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _part(self, text: str) -> None:
        if self.verbose:
            self.line(text.strip())
        else:
            self.out.write(text)
            self.out.flush()

    def probe_started(self, n: int, package: str, version: str, role: str | None) -> None:
        tag = f"[{n}/{self.total}]" if self.total else f"[{n}]"
        role_s = f" ({role})" if role else ""
        self._part(f"{tag} {package} {version}{role_s}: env ")

    def env_ready(self, result) -> None:
        if result.cached:
            what = "cached" if result.ok else "cached failure"
            built = f", built in {_fmt_s(result.build_seconds)}" if result.build_seconds else ""
            self._part(f"{what} ({_fmt_s(result.seconds)}{built})")
        else:
            self._part(("built" if result.ok else "failed") + f" in {_fmt_s(result.seconds)}")
        if result.ok:
            self._part(", tests ")

    def tests_done(self, outcome: RunOutcome) -> None:
        self._part(_fmt_s(outcome.seconds))

    def probe_done(self, version: str, probe: Probe) -> None:
        verdict = {Verdict.GOOD: "good", Verdict.BAD: "BAD", Verdict.SKIP: "skip"}[probe.verdict]
        extra = f": {probe.headline}" if probe.headline else ""
        self._part(f" -> {verdict}{extra}\n")
        if probe.verdict is Verdict.SKIP and probe.detail:
            self.line(f"      log: {probe.detail}")

    def step(self, remaining: int, steps: int) -> None:
        self.line(f"bisecting: {remaining} untested release{'s' if remaining != 1 else ''} left, "
                  f"about {steps} more probe{'s' if steps != 1 else ''}")


def render_bisect(result: BisectResult, package: str) -> list[str]:
    lines = ["", "probed:"]
    for v in sorted(result.probes, key=Version):
        p = result.probes[v]
        extra = f"  {p.headline}" if p.headline else ""
        lines.append(f"  {v:<12} {p.verdict.value:<5}{extra}".rstrip())
    if result.mode == "regression":
        head = result.first_probe.headline if result.first_probe else None
        final = f"first bad: {package} {result.first}"
    else:
        last = result.probes.get(result.last_old)
        head = last.headline if last else None
        final = f"first fixed: {package} {result.first}"
        if head:
            head = f"last bad {result.last_old}: {head}"
    if result.ambiguous:
        lines.append(f"note: {', '.join(result.ambiguous)} could not be tested; "
                     f"the {'first bad' if result.mode == 'regression' else 'first fixed'} release is one of "
                     f"{', '.join(result.ambiguous + [result.first])}")
        final += f" (or one of the untested {', '.join(result.ambiguous)})"
    if head:
        final += f" {DASH} {head}"
    lines.append(final)
    return lines


def render_sweep(result: SweepResult, package: str) -> list[str]:
    lines = ["", "sweep:"]
    for v in result.versions:
        p = result.probes[v]
        extra = f"  {p.headline}" if p.headline else ""
        lines.append(f"  {v:<12} {p.verdict.value:<5}{extra}".rstrip())
    bad = result.bad
    if not result.good and not bad:
        lines.append(f"no release of {package} in the range could be tested")
        return lines
    if not bad:
        lines.append(f"no bad release: {package} {result.versions[0]} .. {result.versions[-1]} "
                     f"({len(result.good)} good, {len(result.skipped)} skipped)")
        return lines
    runs = []
    for run in result.bad_runs():
        runs.append(run[0] if len(run) == 1 else f"{run[0]} .. {run[-1]}")
    head = result.probes[bad[0]].headline
    alone = " alone" if len(bad) == 1 else ""
    final = f"bad: {package} {'; '.join(runs)}{alone}"
    if head:
        final += f" {DASH} {head}"
    lines.append(final)
    return lines


# --------------------------------------------------------------------------- main


def _index(ns) -> object:
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


def _make_cache(ns, out: TextIO, prog: str = "bisect") -> tuple[envs_mod.EnvCache, str, list[str], list[str], list[str]]:
    root = envs_mod.cache_root(ns.cache_dir)
    base = envs_mod.detect_base()
    if not base.torch_version:
        raise SystemExit(f"pytest-nccl {prog}: torch is not installed in this interpreter; install it first "
                         "(the envs are layered on it)")
    uv = builders.find_uv() if ns.installer in ("auto", "uv") else None
    if ns.installer == "uv" and not uv:
        raise SystemExit(f"pytest-nccl {prog}: --installer uv but no uv found (pip install uv)")
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


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        ns = parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    try:
        return run(ns, out)
    except KeyboardInterrupt:
        out.write("\ninterrupted\n")
        return EXIT_INTERRUPTED


def run(ns, out: TextIO, *, index=None, make_cache=None, run_tests=None) -> int:
    """Run a parsed command. ``index``, ``make_cache(ns, out)`` and ``run_tests`` (the pytest
    runner) are injectable: the project's tests drive the whole CLI on a fake index."""
    ns.index = index
    try:
        releases = _list_releases(ns, out)
    except IndexError_ as e:
        out.write(f"pytest-nccl bisect: {e}\n")
        return EXIT_INDEX
    versions = [r.version for r in releases]
    try:
        cache, installer, tooling, lifted, constraints = (make_cache or _make_cache)(ns, out)
    except SystemExit as e:
        out.write(f"{e}\n")
        return EXIT_USAGE
    extra_kw = {"run": run_tests} if run_tests is not None else {}
    base = cache.base
    config = ProbeConfig(package=ns.package, pytest_args=list(ns.pytest_args), extra=list(ns.extra),
                         tooling=tooling, constraints=constraints, lifted=lifted, as_of=ns.as_of,
                         installer=installer, timeout=ns.timeout, rebuild=ns.rebuild, cwd=os.getcwd(),
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
        reporter = TerminalReporter(out, total=len(versions), verbose=ns.verbose)
        prober = ReleaseProber(cache, by_version, config, reporter=reporter, **extra_kw)
        result = search.sweep(versions, prober)
        for ln in render_sweep(result, ns.package):
            out.write(ln + "\n")
        if not result.good and not result.bad:
            return EXIT_NOTHING_TESTABLE
        return 1 if result.bad else 0

    mode = search.direction(ns.good, ns.bad)
    out.write(f"{'regression' if mode == 'regression' else 'fix'}: good {ns.good}, bad {ns.bad} -> looking for "
              f"the {'first bad' if mode == 'regression' else 'first fixed'} release\n")
    reporter = TerminalReporter(out, verbose=ns.verbose)
    roles = {ns.good: "good bound", ns.bad: "bad bound"}
    prober = ReleaseProber(cache, by_version, config, reporter=reporter, roles=roles, **extra_kw)
    try:
        result = search.bisect(versions, ns.good, ns.bad, prober, check_bounds=not ns.no_check_bounds,
                               on_step=reporter.step)
    except BoundsError as e:
        out.write(f"pytest-nccl bisect: {e}\n")
        if e.probe.detail:
            out.write(f"  log: {e.probe.detail}\n")
        return EXIT_BOUNDS
    if result.first not in result.probes and result.mode == "regression":
        # bounds trusted: probe the answer once for its headline
        result.probes[result.first] = prober(result.first)
    for ln in render_bisect(result, ns.package):
        out.write(ln + "\n")
    return EXIT_AMBIGUOUS if result.ambiguous else EXIT_FOUND
