"""Builders of the per-version environments (uv with the release date's dependencies, else pip),
their logged subprocess runs, and the import check of a built environment. Each implements
``envs.Builder``; ``envs.EnvCache`` uses one of them."""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.version import Version

from .envs import (
    BaseInfo,
    EnvBuildError,
    EnvRequest,
    build_deps_layer,
    env_python,
    installed_requires,
    link_torch,
    requirement_closure,
    site_packages_of,
)


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONSTARTUP"):
        env.pop(k, None)
    return env


def _run_logged(cmd: list[str], log: Path, *, timeout: float = 3600, cwd: Path | None = None,
                stream: bool = False) -> subprocess.CompletedProcess:
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        if stream:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=_clean_env(), cwd=cwd)
            out_lines = []
            assert proc.stdout is not None
            for line in proc.stdout:
                out_lines.append(line)
                fh.write(line)
                sys.stderr.write("    | " + line)
            rc = proc.wait(timeout=timeout)
            text = "".join(out_lines)
        else:
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=timeout, cwd=cwd)
            except subprocess.TimeoutExpired:
                fh.write(f"[timed out after {timeout}s]\n")
                raise EnvBuildError(f"{Path(cmd[0]).name} timed out after {timeout:.0f}s") from None
            text = (p.stdout or "") + (p.stderr or "")
            rc = p.returncode
        fh.write(text)
        fh.write(f"[exit {rc}]\n\n")
    return subprocess.CompletedProcess(cmd, rc, text, "")


def resolver_reason(output: str) -> str:
    """One line saying why an install failed, from uv's or pip's output."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith(("error:", "ERROR:", "\u00d7")):
            msg = s[1:].strip() if s.startswith("\u00d7") else s.split(":", 1)[1].strip()
            msg = msg.rstrip(":")
            # uv: "error: No solution found ..." then "  cause: Because ..." / "╰─▶ Because ..."
            for nxt in lines[i + 1:i + 4]:
                n = nxt.strip().lstrip("╰─▶").strip()
                if n.startswith("cause:"):
                    n = n[len("cause:"):].strip()
                if n.startswith("Because") or "depends on" in n or "requires" in n:
                    msg += ": " + n
                    break
            return _short(msg)
    return _short(lines[-1]) if lines else "install failed"


def _short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


_IMPORT_SNIPPET = r"""
import importlib, importlib.metadata as md, sys, json
name = sys.argv[1]
d = md.distribution(name)
tops = [t for t in (d.read_text("top_level.txt") or "").split() if t and not t.startswith("_")]
mod = tops[0] if tops else name.replace("-", "_")
importlib.import_module(mod)
import torch
print(json.dumps({"module": mod, "version": d.version, "torch": torch.__version__, "torch_file": torch.__file__}))
"""


def verify_env(python: Path, request: EnvRequest, base: BaseInfo, log: Path, timeout: float = 600) -> None:
    """The probed package imports, and torch is still the layered base torch."""
    p = _run_logged([str(python), "-c", _IMPORT_SNIPPET, request.package], log, timeout=timeout)
    if p.returncode != 0:
        last = [ln for ln in p.stdout.splitlines() if ln.strip() and not ln.startswith("[exit")]
        raise EnvBuildError(f"import {request.package} failed: " + _short(last[-1] if last else "?"))
    try:
        info = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    except (IndexError, ValueError):
        raise EnvBuildError("import check printed nothing") from None
    if Version(str(info.get("version"))) != Version(request.version):
        raise EnvBuildError(f"{request.package} {info.get('version')} installed instead of {request.version}")
    if base.torch_site and not str(Path(info["torch_file"]).resolve()).startswith(str(Path(base.torch_site))):
        raise EnvBuildError(f"torch in the env is not the layered one: {info['torch_file']}")


def find_uv() -> str | None:
    try:
        import uv

        path = uv.find_uv_bin()
        if path and Path(path).exists():
            return str(path)
    except Exception:  # the uv package's helper, any version: look beside python
        pass
    local = Path(sys.executable).parent / "uv"
    if local.exists():
        return str(local)
    return shutil.which("uv")


def _iso(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class UvBuilder:
    uv: str
    name: str = "uv"
    stream: bool = False

    def build(self, request: EnvRequest, path: Path, base: BaseInfo, log: Path) -> None:
        p = _run_logged([self.uv, "venv", "--quiet", "--python", base.python, str(path)], log, cwd=path.parent)
        if p.returncode != 0:
            raise EnvBuildError("uv venv failed: " + resolver_reason(p.stdout))
        python = env_python(path)
        link_torch(site_packages_of(python), base)
        cons = path / "constraints.txt"
        cons.write_text("".join(c + "\n" for c in request.constraints))
        cmd = [self.uv, "pip", "install", "--python", str(python), "--constraint", str(cons)]
        if request.cutoff is not None:
            now = _iso(_dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(days=1))
            cmd += ["--exclude-newer", _iso(request.cutoff)]
            for name in request.lifted:
                cmd += ["--exclude-newer-package", f"{name}={now}"]
        cmd += list(request.tooling) + list(request.requirements)
        p = _run_logged(cmd, log, cwd=path, stream=self.stream)
        if p.returncode != 0:
            raise EnvBuildError(resolver_reason(p.stdout))
        if re.search(r"^\s*\+ torch==", p.stdout, re.M):  # never expected: the constraint pins it
            raise EnvBuildError("the resolver installed another torch (see log)")
        verify_env(python, request, base, log)


@dataclass
class PipBuilder:
    layers_root: Path
    name: str = "pip"
    stream: bool = False
    lifted_lookup: Callable[[str], md.Distribution] = md.distribution

    def build(self, request: EnvRequest, path: Path, base: BaseInfo, log: Path) -> None:
        p = _run_logged([base.python, "-m", "venv", str(path)], log)
        if p.returncode != 0:
            raise EnvBuildError("python -m venv failed: " + resolver_reason(p.stdout))
        python = env_python(path)
        site = site_packages_of(python)
        link_torch(site, base)
        # torch's own dependencies, visible to pip (outside the env: pip installs over, never removes)
        deps = [n for n in requirement_closure(["torch"], installed_requires) if n != "torch"]
        tag = hashlib.sha256(json.dumps([base.key(), deps]).encode()).hexdigest()[:10]
        layer = build_deps_layer(self.layers_root / f"torch-{base.torch_version}-{tag}", deps, self.lifted_lookup)
        (site / "zz-pytest-nccl-torch-deps.pth").write_text(str(layer) + "\n")
        cons = path / "constraints.txt"
        cons.write_text("".join(c + "\n" for c in request.constraints))
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        date_args: list[str] = []
        if request.cutoff is not None:
            _run_logged(pip + ["install", "--quiet", "--upgrade", "pip"], log)
            helptext = _run_logged(pip + ["install", "--help"], log).stdout
            if "--uploaded-prior-to" in helptext:
                date_args = ["--uploaded-prior-to", _iso(request.cutoff)]
            else:
                with open(log, "a") as fh:
                    fh.write("[pip has no --uploaded-prior-to: resolving without the date cutoff]\n")
        if request.tooling:
            p = _run_logged(pip + ["install", "-c", str(cons)] + list(request.tooling), log, stream=self.stream)
            if p.returncode != 0:
                raise EnvBuildError("installing the tooling failed: " + resolver_reason(p.stdout))
        p = _run_logged(pip + ["install", "-c", str(cons)] + date_args + list(request.requirements), log,
                        stream=self.stream)
        if p.returncode != 0 and date_args and "upload-time" in p.stdout:
            # the index does not publish upload times (pip needs them for --uploaded-prior-to)
            with open(log, "a") as fh:
                fh.write("[the index has no upload times: resolving without the date cutoff]\n")
            p = _run_logged(pip + ["install", "-c", str(cons)] + list(request.requirements), log,
                            stream=self.stream)
            if p.returncode != 0:
                raise EnvBuildError(resolver_reason(p.stdout) + " (pip, no date cutoff: try uv)")
            try:
                verify_env(python, request, base, log)
            except EnvBuildError as e:
                raise EnvBuildError(f"{e} (pip resolved today's dependencies: the index gives no upload "
                                    "times; install uv for release-date resolution)") from None
            return
        if p.returncode != 0:
            raise EnvBuildError(resolver_reason(p.stdout))
        verify_env(python, request, base, log)

