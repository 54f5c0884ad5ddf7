"""DeepSpeed on CPU for suites/zero: the environment, and the one op it JIT-compiles.

With ``DS_ACCELERATOR=cpu`` and no oneCCL, ``deepspeed.init_distributed()`` wraps the existing gloo
process group (TorchBackend), but first JIT-builds ``deepspeed_shm_comm`` (csrc/cpu/comm/shm*.cpp:
g++ + ninja + Python headers; 45-110 s on 2 shared cores, ~1 MB) into ``TORCH_EXTENSIONS_DIR``.
Later loads from the cache take well under a second, but only when ninja finds nothing to do.

What makes ninja rebuild, although a ``.so`` is there:
- a different command line in build.ninja: torch writes absolute paths of this environment into it
  (torch's and DeepSpeed's include/library dirs in site-packages, the interpreter's Python headers)
  and the compiler (``CXX``). A second virtual environment sharing one cache dir rebuilds there;
- a different ``ninja`` binary whose log format differs (1.11 reads 1.13's ``.ninja_log`` as
  missing and rebuilds everything);
- a source or header newer than its object (a reinstalled DeepSpeed or torch).

So the default cache dir is keyed by all of the first two (``build_signature``: readable versions
plus a short hash), a build writes that signature next to the op (``STAMP``), and ``op_staleness``
says the op is ready only when the stamp matches this environment *and* ``ninja -n`` (a dry run,
it writes nothing) has no work to do. The ``deepspeed_ops`` fixture (conftest.py) runs this file as
a subprocess whenever ``op_staleness`` gives a reason, so no rank ever compiles inside a test.

Imported by conftest.py (``ensure_env``, ``op_staleness``: no heavy imports) and run as a script by
the ``deepspeed_ops`` fixture and ``.ci/deepspeed_setup.sh``:

    python suites/zero/build_deepspeed_ops.py            # build (or load) into the cache, write the stamp
    python suites/zero/build_deepspeed_ops.py --print-dir
    python suites/zero/build_deepspeed_ops.py --check    # exit 0 when ready, 1 (and why) otherwise
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

SHM_OP = "deepspeed_shm_comm"
STAMP = "pytest-nccl-build.json"  # in the op's folder: the build_signature its .so was built under
STALE_LOCK_S = 900  # torch's build lock older than this is left over from a killed build, whatever runs


def _version(dist_name: str) -> str:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _package_dir(name: str) -> str:
    """Where a package is installed, without importing it (editable installs included)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "none"
    locations = list(spec.submodule_search_locations or [])
    return os.path.realpath(locations[0] if locations else os.path.dirname(spec.origin or ""))


def _ninja(environ=os.environ) -> str:
    found = shutil.which("ninja", path=environ.get("PATH"))
    return os.path.realpath(found) if found else "none"


def build_signature(environ=os.environ) -> dict:
    """Everything besides the sources that torch's JIT build of the op depends on: what goes into
    build.ninja's commands (paths of this interpreter and environment, the compiler) and the ninja
    binary that reads the build log. Equal signatures mean identical build.ninja files."""
    return {
        "python": sys.version.split()[0],
        "executable": os.path.realpath(sys.executable),
        "prefix": os.path.realpath(sys.prefix),
        "python_include": sysconfig.get_paths().get("include", ""),
        "torch": _version("torch"),
        "torch_dir": _package_dir("torch"),
        "deepspeed": _version("deepspeed"),
        "deepspeed_dir": _package_dir("deepspeed"),
        "cxx": environ.get("CXX", "c++"),
        "ninja": _ninja(environ),
    }


def default_extensions_dir(environ=os.environ) -> str:
    """~/.cache/pytest-nccl/torch_extensions/<python>-torch<v>-ds<v>-<hash of build_signature>: one
    build per interpreter, environment, versions and ninja, so environments never share (and
    rebuild) one op folder."""
    sig = build_signature(environ)
    digest = hashlib.sha256(json.dumps(sig, sort_keys=True).encode()).hexdigest()[:10]
    tag = (f"py{sys.version_info.major}{sys.version_info.minor}-torch{sig['torch']}"
           f"-ds{sig['deepspeed']}-{digest}").replace("+", "_")
    return str(Path.home() / ".cache" / "pytest-nccl" / "torch_extensions" / tag)


def ensure_env(environ=os.environ) -> None:
    """Put this interpreter's bin dir first on PATH, where pip puts ``ninja`` (torch runs ``ninja -v``
    from PATH to build); then setdefault DS_ACCELERATOR=cpu and TORCH_EXTENSIONS_DIR (keyed by the
    ninja now found first on PATH)."""
    bindir = os.path.dirname(sys.executable)
    entries = environ.get("PATH", "").split(os.pathsep) if environ.get("PATH") else []
    if bindir and entries[:1] != [bindir]:  # first, so every caller finds the same ninja
        environ["PATH"] = os.pathsep.join([bindir] + [e for e in entries if e != bindir])
    environ.setdefault("DS_ACCELERATOR", "cpu")
    environ.setdefault("TORCH_EXTENSIONS_DIR", default_extensions_dir(environ))


def op_folder(ext_dir: str) -> Path:
    return Path(ext_dir) / SHM_OP


def read_stamp(ext_dir: str) -> dict | None:
    try:
        return json.loads((op_folder(ext_dir) / STAMP).read_text())
    except (OSError, ValueError):
        return None


def op_staleness(ext_dir: str, environ=os.environ) -> str | None:
    """None when a rank of this environment loads the op without compiling anything; otherwise why
    it would compile (or wait). Cheap: no DeepSpeed or torch import, one ``ninja -n`` (~10 ms)."""
    folder = op_folder(ext_dir)
    stamp = read_stamp(ext_dir)
    if stamp is None:
        return f"no build stamp in {folder} (never built here, or by an older script)"
    sig = build_signature(environ)
    changed = sorted(k for k in set(sig) | set(stamp.get("signature", {}))
                     if sig.get(k) != stamp.get("signature", {}).get(k))
    if changed:
        return f"built under another environment ({', '.join(changed)} differ)"
    if not stamp.get("used", True):
        return None  # DeepSpeed does not build this op on this platform: nothing to load
    lock = folder / "lock"
    if lock.exists():
        return f"{lock} exists: a build is running, or one was killed (loads wait until it is gone)"
    if not (folder / (SHM_OP + ".so")).is_file():
        return f"no {SHM_OP}.so in {folder}"
    if sig["ninja"] == "none":
        return "no ninja on PATH (pip install ninja)"
    try:
        proc = subprocess.run([sig["ninja"], "-n"], cwd=folder, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"ninja -n failed: {exc}"
    if proc.returncode != 0 or "no work to do" not in proc.stdout:
        first = (proc.stdout or proc.stderr).strip().splitlines()[:1]
        return f"ninja would rebuild ({first[0][:200] if first else f'exit {proc.returncode}'})"
    return None


def _lock_is_stale(lock: Path) -> bool:
    """torch's build lock (a bare file, no owner recorded) outlives a build that was killed, and then
    every later load of the op waits for it forever. Stale: older than STALE_LOCK_S, or (Linux) a
    few seconds old while no process works in the build folder (ninja and the compiler run there)."""
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return False
    if age > STALE_LOCK_S:
        return True
    if age < 5 or not os.path.isdir("/proc"):
        return False
    folder = os.path.realpath(lock.parent)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/cwd") == folder:
                    return False  # a build is at work there
            except OSError:
                continue
    return True


def _drop_stale_lock(folder: Path) -> None:
    lock = folder / "lock"
    if lock.exists() and _lock_is_stale(lock):
        print(f"removing {lock}: left over from a killed build (loads would wait for it forever)")
        lock.unlink(missing_ok=True)


def _write_stamp(ext_dir: str, used: bool) -> None:
    folder = op_folder(ext_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{STAMP}.{os.getpid()}"
    tmp.write_text(json.dumps({"signature": build_signature(), "used": used}, indent=1, sort_keys=True))
    os.replace(tmp, folder / STAMP)


def build() -> int:
    """The code path of deepspeed.comm.torch.build_shm_op, which every rank runs; then the stamp."""
    t0 = time.time()
    ext_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        print("ShareMemCommBuilder: not used on this platform, nothing to build")
        _write_stamp(ext_dir, used=False)
        return 0
    _drop_stale_lock(op_folder(ext_dir))
    builder.load(verbose=False)
    _write_stamp(ext_dir, used=True)
    print(f"{builder.NAME} ready in {ext_dir} ({time.time() - t0:.1f} s)")
    stale = op_staleness(ext_dir)
    if stale:
        print(f"{builder.NAME}: still not loadable without a rebuild: {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    ensure_env()
    if "--print-dir" in sys.argv[1:]:
        print(os.environ["TORCH_EXTENSIONS_DIR"])
        sys.exit(0)
    if "--check" in sys.argv[1:]:
        reason = op_staleness(os.environ["TORCH_EXTENSIONS_DIR"])
        print(f"{SHM_OP}: {reason or 'ready (loads without a rebuild)'}")
        sys.exit(1 if reason else 0)
    sys.exit(build())
