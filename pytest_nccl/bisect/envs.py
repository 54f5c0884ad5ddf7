"""Per-version environments, cached, layered on the torch that is already installed.

Layout (``root`` = ``$PYTEST_NCCL_CACHE`` or ``~/.cache/pytest-nccl``)::

    root/envs/trl-0.14.0/                 a venv of the running interpreter's base Python
        lib/pythonX.Y/site-packages/torch -> <running torch>/torch   (symlinks: torch, torchgen,
        lib/pythonX.Y/site-packages/torch-2.13.0+cpu.dist-info/      functorch; a copied
                                                                      dist-info without RECORD)
        pytest-nccl-env.json              marker: fingerprint, status, install time, reason
        install.log                       the resolver's output
    root/layers/torch-2.13.0+cpu-<hash>/  (pip only) symlinks to torch's own dependencies,
                                          on sys.path through a .pth, after site-packages

Why this works without downloading torch again:

- torch is *in* the env's site-packages (symlinked) with its metadata, so both resolvers see
  ``torch 2.13.0+cpu`` as installed; a constraint ``torch==<that version>`` makes any resolution
  that would need another torch fail (= the version is a skip) instead of fetching one. The
  dist-info has no RECORD: pip refuses to uninstall it, and nothing ever writes through the links.
- uv only looks at the env's own site-packages, so torch's small dependencies (sympy, networkx,
  jinja2, fsspec, ...) are resolved and installed by uv like everything else (from its cache).
- pip sees installed distributions on all of ``sys.path``, so for pip the dependencies are exposed
  from a shared layer directory through a .pth; when the probed version pins another version
  (datasets pins ``fsspec``), pip installs that one into the env, which shadows the layer.

The probed package's world (transformers, accelerate, datasets, ...) is resolved by the real
resolver, by default *as of the release date* of the probed version (uv ``--exclude-newer``, pip
``--uploaded-prior-to``), so an old release gets the transformers it was released against rather
than today's. The tooling (pytest and the plugin's own requirements) and torch's dependencies are
exempt from that date (uv ``--exclude-newer-package``; with pip they are installed first).

An env is reused when its marker's fingerprint matches (package, version, requirements, cutoff,
Python, torch). A failed build is cached too (with its reason) so a second run does not retry an
unresolvable version; ``rebuild=True`` retries.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import enum
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

MARKER = "pytest-nccl-env.json"
SCHEMA = 1
LAYER_INSTALLER = "pytest-nccl-layer"


class BuildState(str, enum.Enum):
    """How an env's build ended, as its marker file records it."""
    OK = "ok"
    FAILED = "failed"


@dataclass
class EnvMarker:
    """The marker file of a built env (``MARKER``): for which request and base it was built, and how."""
    fingerprint: str
    state: BuildState | None
    reason: str | None = None
    seconds: float | None = None

    @classmethod
    def read(cls, path: Path) -> "EnvMarker | None":
        try:
            doc = json.loads(path.read_text())
            state = BuildState(doc["status"]) if doc.get("status") in set(BuildState) else None
            return cls(doc.get("fingerprint", ""), state, doc.get("reason"), doc.get("seconds"))
        except (OSError, ValueError, TypeError, AttributeError):
            return None


class EnvBuildError(Exception):
    """The env could not be built: the version cannot be installed or imported (a skip)."""


def cache_root(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("PYTEST_NCCL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/pytest-nccl").expanduser()


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class BaseInfo:
    """The interpreter and torch every env is layered on."""

    python: str  # base interpreter (not a venv's), used to create the envs
    python_version: str
    torch_version: str | None
    torch_site: str | None  # site-packages dir holding torch
    torch_entries: tuple[str, ...] = ()  # top-level names to link: torch, torchgen, functorch
    torch_dist_info: str | None = None

    def key(self) -> dict:
        return {"python": self.python, "python_version": self.python_version,
                "torch": self.torch_version, "torch_site": self.torch_site}


@dataclass
class EnvRequest:
    package: str
    version: str
    #: everything to install, e.g. ["trl==0.14.0", "pytest>=8.0", "peft"]
    requirements: list[str]
    #: resolve the probed package's world as of this time (None: newest)
    cutoff: _dt.datetime | None = None
    #: packages exempt from the cutoff (tooling, torch's dependencies)
    lifted: list[str] = field(default_factory=list)
    #: pip-style constraints, e.g. ["torch==2.13.0+cpu"]
    constraints: list[str] = field(default_factory=list)
    #: requirements installed before the probed package (pip; uv resolves all at once)
    tooling: list[str] = field(default_factory=list)
    installer: str = "uv"

    def fingerprint(self, base: BaseInfo) -> str:
        doc = {
            "schema": SCHEMA,
            "package": canonicalize_name(self.package),
            "version": self.version,
            "requirements": sorted(self.requirements),
            "tooling": sorted(self.tooling),
            "cutoff": self.cutoff.isoformat() if self.cutoff else None,
            "lifted": sorted(canonicalize_name(x) for x in self.lifted),
            "constraints": sorted(self.constraints),
            "installer": self.installer,
            "base": base.key(),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class EnvResult:
    ok: bool
    path: Path
    python: Path
    cached: bool
    seconds: float  # time spent now (0-ish when cached)
    build_seconds: float | None = None  # time the build took when it was made
    reason: str | None = None  # why it failed (one line)
    log: Path | None = None


def env_dirname(package: str, version: str) -> str:
    return f"{canonicalize_name(package)}-{version}"


def env_python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


# --------------------------------------------------------------------------- base / torch


def base_interpreter() -> str:
    """The real interpreter behind the running one (venvs are made from it, not from a venv)."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    if not exe or not Path(exe).exists():
        exe = sys.executable
    return str(Path(exe).resolve()) if Path(exe).exists() else exe


def _top_level_entries(dist: md.Distribution) -> tuple[str, ...]:
    names: set[str] = set()
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
            continue
        first = parts[0]
        if len(parts) == 1 and not first.endswith((".py", ".so", ".pth", ".pyd")):
            continue
        if first.endswith(".pth"):
            continue
        names.add(first)
    if not names:
        text = dist.read_text("top_level.txt") or ""
        names = {ln.strip() for ln in text.splitlines() if ln.strip()}
    return tuple(sorted(names))


def detect_base(dist_lookup: Callable[[str], md.Distribution] = md.distribution) -> BaseInfo:
    python = base_interpreter()
    pyver = ".".join(map(str, sys.version_info[:3]))
    try:
        dist = dist_lookup("torch")
    except md.PackageNotFoundError:
        return BaseInfo(python=python, python_version=pyver, torch_version=None, torch_site=None)
    site = Path(str(dist.locate_file(""))).resolve()
    info_dir = getattr(dist, "_path", None)
    return BaseInfo(python=python, python_version=pyver, torch_version=dist.version, torch_site=str(site),
                    torch_entries=_top_level_entries(dist),
                    torch_dist_info=str(info_dir) if info_dir else None)


def requirement_closure(roots: Iterable[str], requires: Callable[[str], list[str] | None],
                        environment: dict | None = None) -> list[str]:
    """Canonical names reachable from ``roots`` through ``requires(name)`` (installed metadata).

    Extras-only requirements are left out; markers are evaluated for this interpreter. A name whose
    metadata is unknown (``requires`` returns None) is kept but not expanded."""
    seen: set[str] = set()
    stack = [canonicalize_name(r) for r in roots]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in requires(name) or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None:
                try:
                    if not req.marker.evaluate({**(environment or {}), "extra": ""}):
                        continue
                except Exception:  # packaging's marker errors differ by its version: not followed
                    continue
            stack.append(canonicalize_name(req.name))
    return sorted(seen)


def installed_requires(name: str) -> list[str] | None:
    try:
        return md.requires(name) or []
    except md.PackageNotFoundError:
        return None


def link_torch(site_packages: Path, base: BaseInfo) -> None:
    """Expose the base torch in ``site_packages``: symlinks + a RECORD-less dist-info copy."""
    if not base.torch_version or not base.torch_site:
        raise EnvBuildError("torch is not installed in the running interpreter: nothing to layer on")
    src = Path(base.torch_site)
    for name in base.torch_entries:
        target = site_packages / name
        if target.exists() or target.is_symlink():
            continue
        os.symlink(src / name, target)
    if base.torch_dist_info:
        copy_dist_info(Path(base.torch_dist_info), site_packages)


def copy_dist_info(info: Path, dest_site: Path) -> Path:
    """Copy a dist-info's metadata (not RECORD: the copy can never be uninstalled through)."""
    out = dest_site / info.name
    out.mkdir(parents=True, exist_ok=True)
    for fname in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt"):
        f = info / fname
        if f.is_file():
            shutil.copyfile(f, out / fname)
    (out / "INSTALLER").write_text(LAYER_INSTALLER + "\n")
    return out


def build_deps_layer(layer_dir: Path, names: Iterable[str],
                     dist_lookup: Callable[[str], md.Distribution] = md.distribution) -> Path:
    """A directory of symlinks exposing the given installed distributions (and their metadata)."""
    if (layer_dir / ".complete").exists():
        return layer_dir
    tmp = layer_dir.with_name(layer_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in names:
        try:
            dist = dist_lookup(name)
        except md.PackageNotFoundError:
            continue
        site = Path(str(dist.locate_file(""))).resolve()
        for entry in _top_level_entries(dist):
            if not (tmp / entry).exists():
                os.symlink(site / entry, tmp / entry)
        info = getattr(dist, "_path", None)
        if info:
            copy_dist_info(Path(info), tmp)
    (tmp / ".complete").write_text("")
    try:
        tmp.rename(layer_dir)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return layer_dir


def site_packages_of(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


# --------------------------------------------------------------------------- builders


class Builder(Protocol):
    name: str

    def build(self, request: EnvRequest, path: Path, base: BaseInfo, log: Path) -> None:  # pragma: no cover
        """Create the env at ``path``; raise :class:`EnvBuildError` with a one-line reason."""


# --------------------------------------------------------------------------- cache


@contextlib.contextmanager
def _locked(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    import fcntl  # here, not at import: `pytest-nccl --version` and --help work on any platform
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class EnvCache:
    """``ensure(request)`` returns a ready env for a version, building it at most once."""

    def __init__(self, root: Path, builder: Builder, base: BaseInfo,
                 clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.envs = self.root / "envs"
        self.builder = builder
        self.base = base
        self._clock = clock

    def path_for(self, package: str, version: str) -> Path:
        return self.envs / env_dirname(package, version)

    def read_marker(self, path: Path) -> EnvMarker | None:
        return EnvMarker.read(path / MARKER)

    def ensure(self, request: EnvRequest, rebuild: bool = False) -> EnvResult:
        path = self.path_for(request.package, request.version)
        fp = request.fingerprint(self.base)
        t0 = self._clock()
        with _locked(self.envs / f".{path.name}.lock"):
            marker = self.read_marker(path)
            if marker and marker.fingerprint == fp and not rebuild:
                python = env_python(path)
                if marker.state == BuildState.OK and (python.exists() or not self._needs_python()):
                    return EnvResult(True, path, python, cached=True, seconds=self._clock() - t0,
                                     build_seconds=marker.seconds, log=path / "install.log")
                if marker.state == BuildState.FAILED:
                    return EnvResult(False, path, python, cached=True, seconds=self._clock() - t0,
                                     build_seconds=marker.seconds, reason=marker.reason, log=path / "install.log")
            if path.exists() or path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            log = self.envs / f".{path.name}.install.log"
            log.unlink(missing_ok=True)
            reason = None
            try:
                self.builder.build(request, path, self.base, log)
                ok = True
            except EnvBuildError as e:
                ok, reason = False, str(e)
            except (subprocess.SubprocessError, OSError) as e:
                ok, reason = False, f"{type(e).__name__}: {e}"
            seconds = self._clock() - t0
            path.mkdir(parents=True, exist_ok=True)
            final_log = path / "install.log"
            if log.exists():
                shutil.move(str(log), final_log)
            doc = {"fingerprint": fp, "status": BuildState.OK if ok else BuildState.FAILED, "reason": reason,
                   "seconds": round(seconds, 1), "installer": getattr(self.builder, "name", "?"),
                   "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   "request": {**asdict(request), "cutoff": request.cutoff.isoformat() if request.cutoff else None},
                   "base": self.base.key()}
            (path / MARKER).write_text(json.dumps(doc, indent=2))
            return EnvResult(ok, path, env_python(path), cached=False, seconds=seconds, build_seconds=seconds,
                             reason=reason, log=final_log if final_log.exists() else None)

    def _needs_python(self) -> bool:
        return getattr(self.builder, "needs_python", True)
