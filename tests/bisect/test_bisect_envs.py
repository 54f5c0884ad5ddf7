"""Env cache (fake builder), torch layering on fake directories, resolver messages."""

import datetime as dt
import json
from pathlib import Path

import pytest

from pytest_nccl.bisect import envs
from pytest_nccl.bisect.builders import resolver_reason
from pytest_nccl.bisect.envs import (
    BaseInfo,
    EnvBuildError,
    EnvCache,
    EnvRequest,
    build_deps_layer,
    cache_root,
    copy_dist_info,
    link_torch,
    requirement_closure,
)

BASE = BaseInfo(python="/usr/bin/python3", python_version="3.11.7", torch_version="2.13.0+cpu",
                torch_site="/base/site-packages", torch_entries=("functorch", "torch", "torchgen"))


class FakeBuilder:
    name = "fake"

    def __init__(self, fail_for=()):
        self.calls = []
        self.fail_for = set(fail_for)

    def build(self, request, path, base, log):
        self.calls.append(request.version)
        log.write_text(f"building {request.version}\n")
        if request.version in self.fail_for:
            raise EnvBuildError("No solution found: trl==0.15.1 depends on torch<2")
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").write_text("#!fake\n")


def req(version, **kw):
    return EnvRequest(package="trl", version=version, requirements=[f"trl=={version}", "pytest>=8"],
                      constraints=["torch==2.13.0+cpu"], **kw)


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTEST_NCCL_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("PYTEST_NCCL_CACHE")
    assert cache_root() == Path("~/.cache/pytest-nccl").expanduser()


def test_second_ensure_reuses_the_env(tmp_path):
    b = FakeBuilder()
    cache = EnvCache(tmp_path, b, BASE)
    r1 = cache.ensure(req("0.14.0"))
    assert r1.ok and not r1.cached and r1.path == tmp_path / "envs" / "trl-0.14.0"
    assert r1.python == r1.path / "bin" / "python"
    assert (r1.path / "install.log").read_text() == "building 0.14.0\n"
    marker = json.loads((r1.path / envs.MARKER).read_text())
    assert marker["status"] == "ok" and marker["request"]["version"] == "0.14.0"
    # a second run (new cache object: a new process) reuses it
    r2 = EnvCache(tmp_path, b, BASE).ensure(req("0.14.0"))
    assert r2.ok and r2.cached and b.calls == ["0.14.0"]
    assert r2.build_seconds is not None


def test_rebuild_and_fingerprint_changes(tmp_path):
    b = FakeBuilder()
    cache = EnvCache(tmp_path, b, BASE)
    cache.ensure(req("0.14.0"))
    cache.ensure(req("0.14.0"), rebuild=True)
    assert b.calls == ["0.14.0", "0.14.0"]
    # other requirements, another cutoff, another torch: rebuilt
    cache.ensure(EnvRequest("trl", "0.14.0", ["trl==0.14.0", "peft"]))
    cache.ensure(req("0.14.0", cutoff=dt.datetime(2025, 1, 30, tzinfo=dt.timezone.utc)))
    other = BaseInfo(**{**BASE.__dict__, "torch_version": "2.14.0"})
    EnvCache(tmp_path, b, other).ensure(req("0.14.0", cutoff=dt.datetime(2025, 1, 30, tzinfo=dt.timezone.utc)))
    assert len(b.calls) == 5
    # the lifted names matter, their order does not
    a = req("0.14.0", lifted=["pytest", "sympy"]).fingerprint(BASE)
    assert a == req("0.14.0", lifted=["sympy", "pytest"]).fingerprint(BASE)
    assert a != req("0.14.0").fingerprint(BASE)


def test_failed_build_is_cached_with_its_reason(tmp_path):
    b = FakeBuilder(fail_for={"0.15.1"})
    cache = EnvCache(tmp_path, b, BASE)
    r1 = cache.ensure(req("0.15.1"))
    assert not r1.ok and not r1.cached and "No solution found" in r1.reason
    r2 = cache.ensure(req("0.15.1"))
    assert not r2.ok and r2.cached and r2.reason == r1.reason
    assert b.calls == ["0.15.1"]
    cache.ensure(req("0.15.1"), rebuild=True)
    assert b.calls == ["0.15.1", "0.15.1"]


def test_builder_os_error_is_a_failed_build(tmp_path):
    class Broken(FakeBuilder):
        def build(self, request, path, base, log):
            raise PermissionError("read-only file system")

    r = EnvCache(tmp_path, Broken(), BASE).ensure(req("0.14.0"))
    assert not r.ok and r.reason == "PermissionError: read-only file system"


def test_incomplete_env_is_rebuilt(tmp_path):
    b = FakeBuilder()
    cache = EnvCache(tmp_path, b, BASE)
    r = cache.ensure(req("0.14.0"))
    (r.path / "bin" / "python").unlink()  # someone damaged it
    r2 = cache.ensure(req("0.14.0"))
    assert r2.ok and not r2.cached and len(b.calls) == 2
    (r.path / envs.MARKER).unlink()  # interrupted build: no marker
    assert not cache.ensure(req("0.14.0")).cached


def test_env_dirname_is_canonical():
    assert envs.env_dirname("Foo_Bar", "1.0") == "foo-bar-1.0"


@pytest.fixture
def fake_torch(tmp_path):
    site = tmp_path / "base-site"
    for name in ("torch", "torchgen", "functorch"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    info = site / "torch-2.13.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    (info / "RECORD").write_text("torch/__init__.py,,\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    return BaseInfo(python="python", python_version="3.11", torch_version="2.13.0+cpu", torch_site=str(site),
                    torch_entries=("functorch", "torch", "torchgen"), torch_dist_info=str(info))


def test_link_torch_symlinks_and_copies_metadata_without_record(tmp_path, fake_torch):
    env_site = tmp_path / "env-site"
    env_site.mkdir()
    link_torch(env_site, fake_torch)
    for name in ("torch", "torchgen", "functorch"):
        assert (env_site / name).is_symlink()
        assert (env_site / name).resolve() == Path(fake_torch.torch_site, name).resolve()
    info = env_site / "torch-2.13.0+cpu.dist-info"
    assert info.is_dir() and not info.is_symlink()
    assert (info / "METADATA").read_text().startswith("Metadata-Version")
    assert not (info / "RECORD").exists()  # no uninstall can go through the links
    assert (info / "INSTALLER").read_text().strip() == envs.LAYER_INSTALLER
    # importlib.metadata sees torch installed in the env
    import importlib.metadata as md

    found = [d for d in md.distributions(path=[str(env_site)]) if d.metadata["Name"] == "torch"]
    assert found and found[0].version == "2.13.0+cpu"
    # idempotent
    link_torch(env_site, fake_torch)


def test_link_torch_needs_torch(tmp_path):
    with pytest.raises(EnvBuildError, match="torch is not installed"):
        link_torch(tmp_path, BaseInfo("python", "3.11", None, None))


def test_detect_base_real_interpreter():
    base = envs.detect_base()
    assert Path(base.python).exists()
    if base.torch_version:  # this project's venv has torch; CI without torch still passes
        assert "torch" in base.torch_entries
        assert Path(base.torch_site, "torch").is_dir()


def test_requirement_closure():
    meta = {
        "torch": ["filelock", "sympy>=1.13", 'optree>=0.13; extra == "optree"', 'nvidia-nccl; sys_platform == "win32"'],
        "sympy": ["mpmath<1.4"],
        "mpmath": [],
        "filelock": [],
        "pytest": ["pluggy", "iniconfig"],
    }
    got = requirement_closure(["torch", "pytest"], lambda n: meta.get(n), environment={"sys_platform": "linux"})
    assert got == ["filelock", "iniconfig", "mpmath", "pluggy", "pytest", "sympy", "torch"]


def test_build_deps_layer(tmp_path, fake_torch):
    import importlib.metadata as md

    class Dist:
        def __init__(self, name):
            self.name = name
            self._path = Path(fake_torch.torch_dist_info)
            self.files = [f"{name}/__init__.py", f"{name}-1.0.dist-info/METADATA"]

        def locate_file(self, p):
            return Path(fake_torch.torch_site) / p

        def read_text(self, f):
            return None

    def lookup(name):
        if name == "missing":
            raise md.PackageNotFoundError(name)
        return Dist(name)

    layer = build_deps_layer(tmp_path / "layer", ["torchgen", "missing"], lookup)
    assert (layer / "torchgen").is_symlink() and (layer / ".complete").exists()
    assert build_deps_layer(tmp_path / "layer", ["other"], lookup) == layer  # reused as is


def test_copy_dist_info(tmp_path, fake_torch):
    out = copy_dist_info(Path(fake_torch.torch_dist_info), tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["INSTALLER", "METADATA", "WHEEL"]


UV_FAIL = """Using Python 3.11.7 environment at: env
  × No solution found when resolving dependencies:
  ╰─▶ Because only setuptools<=75.6.0 is available and torch>=2.13.0+cpu depends on setuptools>=77.0.3, we can conclude that torch>=2.13.0+cpu cannot be used.
"""  # noqa: E501  (uv's output, verbatim)
UV_FAIL_OLD = """error: No solution found when resolving dependencies
  cause: Because trl==0.15.1 depends on torch<2 and you require torch==2.13.0+cpu, we can conclude that your requirements are unsatisfiable.
"""  # noqa: E501  (uv's output, verbatim)
PIP_FAIL = """Collecting trl==9.9
ERROR: Could not find a version that satisfies the requirement trl==9.9 (from versions: 0.1.0)
ERROR: No matching distribution found for trl==9.9
"""


def test_resolver_reason():
    assert resolver_reason(UV_FAIL_OLD).startswith("No solution found when resolving dependencies: Because trl==0.15.1")
    assert "No solution found" in resolver_reason(UV_FAIL)
    assert resolver_reason(PIP_FAIL).startswith("Could not find a version that satisfies the requirement trl==9.9")
    assert resolver_reason("") == "install failed"
    assert len(resolver_reason("error: " + "x" * 1000)) <= 300
