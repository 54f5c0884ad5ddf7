"""DeepSpeed on CPU for suites/zero: the environment, and the one op it JIT-compiles.

With ``DS_ACCELERATOR=cpu`` and no oneCCL, ``deepspeed.init_distributed()`` wraps the existing gloo
process group (TorchBackend), but first JIT-builds ``deepspeed_shm_comm`` (csrc/cpu/comm/shm*.cpp:
g++ + ninja + Python headers; 45-110 s on 2 shared cores, ~1 MB) into ``TORCH_EXTENSIONS_DIR``.
Later loads from the cache take well under a second.

Imported by conftest.py (``ensure_env``, ``default_extensions_dir``: no heavy imports) and run as a
script by the ``deepspeed_ops`` fixture and ``.ci/deepspeed_setup.sh``:

    python suites/zero/build_deepspeed_ops.py            # build (or load) into the cache
    python suites/zero/build_deepspeed_ops.py --print-dir
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from pathlib import Path

SHM_OP = "deepspeed_shm_comm"


def _version(dist_name: str) -> str:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def default_extensions_dir() -> str:
    """~/.cache/pytest-nccl/torch_extensions/<python>-torch<v>-ds<v>: one build per combination."""
    tag = (f"py{sys.version_info.major}{sys.version_info.minor}-torch{_version('torch')}"
           f"-ds{_version('deepspeed')}").replace("+", "_")
    return str(Path.home() / ".cache" / "pytest-nccl" / "torch_extensions" / tag)


def ensure_env(environ=os.environ) -> None:
    """setdefault DS_ACCELERATOR=cpu and TORCH_EXTENSIONS_DIR; put this interpreter's bin dir on
    PATH, where pip puts ``ninja`` (torch runs ``ninja -v`` from PATH to build)."""
    environ.setdefault("DS_ACCELERATOR", "cpu")
    environ.setdefault("TORCH_EXTENSIONS_DIR", default_extensions_dir())
    bindir = os.path.dirname(sys.executable)
    path = environ.get("PATH", "")
    if bindir and bindir not in path.split(os.pathsep):
        environ["PATH"] = bindir + (os.pathsep + path if path else "")


def shm_op_built(ext_dir: str) -> bool:
    folder = Path(ext_dir) / SHM_OP
    return folder.is_dir() and any(folder.glob(SHM_OP + "*.so"))


def build() -> int:
    """The code path of deepspeed.comm.torch.build_shm_op, which every rank runs."""
    t0 = time.time()
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        print("ShareMemCommBuilder: not used on this platform, nothing to build")
        return 0
    builder.load(verbose=False)
    print(f"{builder.NAME} ready in {os.environ['TORCH_EXTENSIONS_DIR']} ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    ensure_env()
    if "--print-dir" in sys.argv[1:]:
        print(os.environ["TORCH_EXTENSIONS_DIR"])
        sys.exit(0)
    sys.exit(build())
