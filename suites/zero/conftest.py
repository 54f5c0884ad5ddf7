"""ZeRO suite: the documented all-gather hangs of DeepSpeed ZeRO-2/3 and PyTorch FSDP2, reproduced on
2 CPU ranks (gloo) through the plugin. Run: ``pytest --nccl-world=2 suites/zero`` (see README.md).

Runs in the controller, before the fork server starts (it inherits this environment):
- ``DS_ACCELERATOR=cpu``: DeepSpeed's CPU accelerator. Without oneCCL it talks gloo through
  torch.distributed, but still JIT-builds its ``deepspeed_shm_comm`` op (g++ + ninja, 45-110 s on 2
  shared cores) the first time a process sets up DeepSpeed's comm backend.
- ``PATH`` gets this interpreter's bin dir (pip's ``ninja`` lives there; torch looks it up on PATH).
- ``TORCH_EXTENSIONS_DIR``: a persistent build cache, ``~/.cache/pytest-nccl/torch_extensions/
  <python>-torch<ver>-ds<ver>`` unless already set. The session fixture ``deepspeed_ops`` builds
  the op there once, in a subprocess, before the first DeepSpeed test (so the build never runs
  inside a test's bound); ``.ci/deepspeed_setup.sh`` does the same ahead of time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_nccl

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # pytest's default (prepend) import mode has put it there already
    sys.path.insert(0, str(HERE))
from build_deepspeed_ops import SHM_OP, ensure_env, shm_op_built  # noqa: E402

ensure_env()

from pytest_nccl.testing import hf_offline_env  # noqa: E402

hf_offline_env()

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout absent: the plugin still reads it
        config.addinivalue_line("markers", "timeout(seconds): bound for a test (read by pytest-nccl)")


@pytest.fixture(scope="session")
def deepspeed_ops() -> str:
    """Skip without DeepSpeed; otherwise make sure its CPU comm op is built in the cache (a
    subprocess: the controller never imports DeepSpeed's comm backend). Returns the cache dir."""
    if not HAVE_DEEPSPEED:
        pytest.skip("deepspeed is not installed (pip install 'pytest-nccl[zero]')")
    ext_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    if not shm_op_built(ext_dir):
        proc = subprocess.run([sys.executable, str(HERE / "build_deepspeed_ops.py")],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"building DeepSpeed's {SHM_OP} op failed (needs g++ and ninja):\n"
                        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return ext_dir


@pytest.fixture
def engine_ready(request, engine_kind):
    """For tests parametrized over ``engine_kind``: needs ``deepspeed_ops`` for DeepSpeed kinds
    (skips without DeepSpeed), nothing for FSDP2. Its value (a str or None) pickles to the ranks."""
    if engine_kind.startswith("deepspeed"):
        return request.getfixturevalue("deepspeed_ops")
    return None


@pytest.fixture
def expect_diagnosis(nccl_world):
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N)``: run ``fn`` on every rank through
    the plugin and require that it fails as ``exc`` with a headline that names the collective
    (``op``, a regex) and the rank that diverged. Returns the exception."""

    def check(fn, *args, exc=pytest_nccl.CollectiveMismatch, op: str, rank: int):
        __tracebackhide__ = True
        with pytest.raises(pytest_nccl.DistributedTestFailure) as info:
            nccl_world.run(fn, *args)
        err = info.value
        diag = err.diagnosis
        headline = diag.headline if diag is not None else str(err)
        print(f"diagnosis: {type(err).__name__} [{getattr(diag, 'kind', '?')}] {headline}")
        assert isinstance(err, exc), f"expected {exc.__name__}, got {type(err).__name__}: {headline}"
        assert re.search(op, headline), f"headline does not name /{op}/: {headline}"
        assert re.search(rf"\brank {rank}\b", headline), f"headline does not name rank {rank}: {headline}"
        return err

    return check
