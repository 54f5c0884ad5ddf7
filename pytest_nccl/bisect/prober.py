"""The verdict function the search calls: build (or reuse) the env of a version, run pytest there.

Glue only; each part is injectable (the env cache's builder, the pytest runner, the reporter) so
the cache reuse and the progress lines are tested without installing anything.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Protocol, Sequence

from . import tomlcompat
from .envs import EnvCache, EnvRequest, EnvResult
from .runner import RunOutcome, run_pytest
from .search import Probe, Verdict
from .versions import Release

#: how long after a release's last upload its dependencies may be, with ``--as-of release``
RELEASE_MARGIN = _dt.timedelta(hours=1)


class Reporter(Protocol):  # pragma: no cover - protocol
    def probe_started(self, n: int, package: str, version: str, role: str | None) -> None: ...
    def env_ready(self, result: EnvResult) -> None: ...
    def tests_done(self, outcome: RunOutcome) -> None: ...
    def probe_done(self, version: str, probe: Probe) -> None: ...


@dataclass
class ProbeConfig:
    package: str
    pytest_args: list[str]
    #: extra requirements for every env (``--with``), after ``PACKAGE==VERSION``
    extra: list[str] = field(default_factory=list)
    #: pytest and the plugin's own requirements: installed newest, exempt from the date cutoff
    tooling: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    lifted: list[str] = field(default_factory=list)
    #: "release" (as of the probed release's upload), "now" (newest), or a datetime
    as_of: str | _dt.datetime = "release"
    installer: str = "uv"
    timeout: float = 1800.0
    rebuild: bool = False
    cwd: str | None = None
    stream: bool = False


def cutoff_for(release: Release | None, as_of: str | _dt.datetime) -> _dt.datetime | None:
    if isinstance(as_of, _dt.datetime):
        return as_of
    if as_of == "now" or release is None:
        return None
    last = release.uploaded_last or release.uploaded
    return last + RELEASE_MARGIN if last else None


def make_request(config: ProbeConfig, version: str, release: Release | None) -> EnvRequest:
    return EnvRequest(
        package=config.package,
        version=version,
        requirements=[f"{config.package}=={version}", *config.extra],
        cutoff=cutoff_for(release, config.as_of),
        lifted=list(config.lifted),
        constraints=list(config.constraints),
        tooling=list(config.tooling),
        installer=config.installer,
    )


class ReleaseProber:
    def __init__(self, cache: EnvCache, releases: Mapping[str, Release], config: ProbeConfig,
                 reporter: Reporter | None = None,
                 run: Callable[..., RunOutcome] = run_pytest,
                 roles: Mapping[str, str] | None = None,
                 step: Callable[[str], ContextManager[object]] = contextlib.nullcontext):
        self.cache = cache
        self.step = step  # a heartbeat while each long step runs
        self.releases = dict(releases)
        self.config = config
        self.reporter = reporter
        self._run = run
        self.roles = dict(roles or {})
        self.count = 0
        self.env_results: dict[str, EnvResult] = {}
        self.outcomes: dict[str, RunOutcome] = {}

    def __call__(self, version: str) -> Probe:
        self.count += 1
        rep = self.reporter
        if rep:
            rep.probe_started(self.count, self.config.package, version, self.roles.get(version))
        request = make_request(self.config, version, self.releases.get(version))
        with self.step(f"env of {self.config.package} {version}"):
            env = self.cache.ensure(request, rebuild=self.config.rebuild)
        self.env_results[version] = env
        if rep:
            rep.env_ready(env)
        install_s = env.seconds
        if not env.ok:
            probe = Probe(Verdict.SKIP, headline=f"cannot install: {env.reason}", install_seconds=install_s,
                          env_cached=env.cached, detail=str(env.log) if env.log else None)
            if rep:
                rep.probe_done(version, probe)
            return probe
        with self.step(f"tests on {self.config.package} {version}"):
            outcome = self._run(env.python, self.config.pytest_args, log=Path(env.path) / "pytest.log",
                                timeout=self.config.timeout, cwd=self.config.cwd, stream=self.config.stream)
        self.outcomes[version] = outcome
        if rep:
            rep.tests_done(outcome)
        probe = Probe(outcome.verdict, headline=outcome.headline, install_seconds=install_s,
                      test_seconds=outcome.seconds, env_cached=env.cached,
                      detail=str(outcome.log) if outcome.log else None)
        if rep:
            rep.probe_done(version, probe)
        return probe


def tooling_requirements(pyproject: Path | None = None) -> list[str]:
    """pytest-nccl's own requirements (the plugin must import in every env).

    From the installed distribution's metadata, else this checkout's pyproject.toml, else
    ``pytest>=8``. Extras-only requirements are left out."""
    import importlib.metadata as md

    reqs: Sequence[str] | None = None
    try:
        reqs = md.requires("pytest-nccl")
    except md.PackageNotFoundError:
        reqs = None
    if reqs is None and pyproject is not None and pyproject.is_file():
        try:
            reqs = tomlcompat.loads(pyproject.read_text()).get("project", {}).get("dependencies")
        except (OSError, tomlcompat.TOMLDecodeError):
            reqs = None
    out = [r for r in (reqs or []) if "extra ==" not in r.replace('"', "").replace("'", "")]
    if not any(r.strip().lower().startswith("pytest") for r in out):
        out.insert(0, "pytest>=8")
    return out
