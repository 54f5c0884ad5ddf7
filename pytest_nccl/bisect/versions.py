"""Which releases of a package lie between two bounds.

Data (:class:`Release`), I/O (the indexes) and the pure range filter (:func:`select_range`) are
kept apart so the search can be tested on a fake index without the network.

Indexes:
- :class:`PyPIJsonIndex`: the PyPI JSON API ``{base}/{name}/json`` over ``urllib`` (the default,
  base ``https://pypi.org/pypi``, or ``$PYTEST_NCCL_PYPI_JSON``). It knows yanked files and upload
  times (used to resolve a probed release "as of" its release date).
- :class:`PipIndex`: ``pip index versions NAME --pre`` (whatever index pip is configured for); no
  yank or date information.
- :class:`StaticIndex`: a given list (``--versions``) or a fake for tests.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

DEFAULT_PYPI_JSON = "https://pypi.org/pypi"


class IndexError_(Exception):
    """The release list could not be obtained (network, unknown package, bad answer)."""


@dataclass(frozen=True)
class Release:
    """One release of a package as the index describes it."""

    version: str
    yanked: bool = False
    #: earliest upload time of the release's files (UTC), None when the index does not say
    uploaded: _dt.datetime | None = None
    #: latest upload time of the release's files (UTC)
    uploaded_last: _dt.datetime | None = None

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def is_prerelease(self) -> bool:
        return self.parsed.is_prerelease or self.parsed.is_devrelease


class Index(Protocol):
    def releases(self, name: str) -> list[Release]:  # pragma: no cover - protocol
        ...


def _parse_time(text: str | None) -> _dt.datetime | None:
    if not text:
        return None
    text = text.strip().replace("Z", "+00:00")
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.astimezone(_dt.timezone.utc)


def releases_from_pypi_json(doc: Mapping) -> list[Release]:
    """Turn a PyPI JSON API document (``/pypi/NAME/json``) into releases, sorted by version.

    A release is yanked when all its files are yanked; a release with no files is dropped (nothing
    to install); versions that are not PEP 440 are dropped."""
    out: list[Release] = []
    for version, files in (doc.get("releases") or {}).items():
        try:
            Version(version)
        except InvalidVersion:
            continue
        if not files:
            continue
        times = [t for t in (_parse_time(f.get("upload_time_iso_8601") or f.get("upload_time")) for f in files) if t]
        out.append(
            Release(
                version=version,
                yanked=all(bool(f.get("yanked")) for f in files),
                uploaded=min(times) if times else None,
                uploaded_last=max(times) if times else None,
            )
        )
    out.sort(key=lambda r: r.parsed)
    return out


class PyPIJsonIndex:
    """Releases from the PyPI JSON API. ``opener(url, timeout) -> bytes`` is injectable."""

    def __init__(self, base_url: str | None = None, timeout: float = 30.0,
                 opener: Callable[[str, float], bytes] | None = None):
        self.base_url = (base_url or os.environ.get("PYTEST_NCCL_PYPI_JSON") or DEFAULT_PYPI_JSON).rstrip("/")
        self.timeout = timeout
        self._opener = opener or _urlopen

    def releases(self, name: str) -> list[Release]:
        url = f"{self.base_url}/{urllib.parse.quote(canonicalize_name(name))}/json"
        try:
            raw = self._opener(url, self.timeout)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise IndexError_(f"{name}: no such project on {self.base_url}") from None
            raise IndexError_(f"{name}: {url}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            raise IndexError_(f"{name}: cannot reach {url}: {getattr(e, 'reason', e)}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise IndexError_(f"{name}: {url} did not answer JSON") from None
        return releases_from_pypi_json(doc)


def _urlopen(url: str, timeout: float) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "pytest-nccl-bisect"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - fixed https URL
        return resp.read()


_PIP_VERSIONS = re.compile(r"Available versions:\s*(.+)")


def parse_pip_index_output(text: str) -> list[str]:
    """Versions from ``pip index versions`` output (``Available versions: 1.2, 1.1, ...``)."""
    m = _PIP_VERSIONS.search(text)
    if not m:
        return []
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


class PipIndex:
    """Releases via ``pip index versions NAME --pre`` (the configured pip index)."""

    def __init__(self, python: str | None = None, run: Callable[..., subprocess.CompletedProcess] | None = None):
        self.python = python or sys.executable
        self._run = run or subprocess.run

    def releases(self, name: str) -> list[Release]:
        cmd = [self.python, "-m", "pip", "index", "versions", name, "--pre", "--disable-pip-version-check"]
        proc = self._run(cmd, capture_output=True, text=True)
        versions = parse_pip_index_output(proc.stdout or "")
        if proc.returncode != 0 or not versions:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no versions"]
            raise IndexError_(f"{name}: pip index versions failed: {tail[0]}")
        return StaticIndex({name: versions}).releases(name)


@dataclass
class StaticIndex:
    """A fixed list: ``{name: [version or Release, ...]}`` (``--versions``, tests)."""

    data: Mapping[str, Sequence[str | Release]] = field(default_factory=dict)

    def releases(self, name: str) -> list[Release]:
        key = {canonicalize_name(k): k for k in self.data}.get(canonicalize_name(name))
        if key is None:
            raise IndexError_(f"{name}: not in the given version list")
        out = []
        for item in self.data[key]:
            rel = item if isinstance(item, Release) else Release(str(item))
            try:
                _ = rel.parsed  # a version that does not parse is the index's error
            except InvalidVersion:
                raise IndexError_(f"{name}: {rel.version!r} is not a valid version") from None
            out.append(rel)
        out.sort(key=lambda r: r.parsed)
        return out


def select_range(releases: Iterable[Release], a: str, b: str, *, pre: bool = False,
                 yanked: bool = False) -> list[Release]:
    """Releases between ``a`` and ``b`` (either order), both included, sorted ascending.

    Pre-releases and yanked releases are left out unless asked for, except a bound itself: the two
    bounds are what the user named, so they are always kept. A bound the index does not list is an
    error (it could not be installed)."""
    va, vb = Version(a), Version(b)
    lo, hi = (va, vb) if va <= vb else (vb, va)
    rels = list(releases)
    by_version = {r.parsed: r for r in rels}
    for bound, text in ((va, a), (vb, b)):
        if bound not in by_version:
            known = ", ".join(r.version for r in rels[-8:])
            raise IndexError_(f"{text} is not a release of this package (latest: {known})")
    out = []
    for r in rels:
        v = r.parsed
        if v < lo or v > hi:
            continue
        if v not in (lo, hi):
            if r.is_prerelease and not pre:
                continue
            if r.yanked and not yanked:
                continue
        out.append(r)
    # one entry per version (1.0 == 1.0.0)
    dedup: dict[Version, Release] = {}
    for r in out:
        dedup.setdefault(r.parsed, r)
    return [dedup[v] for v in sorted(dedup)]


def parse_version_list(text: str) -> list[str]:
    """``--versions 0.13.0,0.14.0 0.15.0`` -> list (commas and/or spaces)."""
    return [t for t in re.split(r"[\s,]+", text.strip()) if t]
