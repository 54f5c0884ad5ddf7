"""ZeRO suite: the documented all-gather hangs of DeepSpeed ZeRO-2/3 and PyTorch FSDP2, reproduced on
N CPU ranks (gloo) through the plugin, at any ``--nccl-world`` (checked at 2, 3 and 4). Run:
``pytest --nccl-world=2 suites/zero`` (see README.md).

Runs in the controller, before the fork server starts (it inherits this environment):
- ``PATH`` gets this interpreter's bin dir (pip's ``ninja`` lives there; torch looks it up on PATH).
- ``DS_ACCELERATOR=cpu``: DeepSpeed's CPU accelerator. Without oneCCL it talks gloo through
  torch.distributed, but still JIT-builds its ``deepspeed_shm_comm`` op (g++ + ninja, 45-110 s on 2
  shared cores) the first time a process sets up DeepSpeed's comm backend.
- ``TORCH_EXTENSIONS_DIR``: a persistent build cache, ``~/.cache/pytest-nccl/torch_extensions/
  <python>-torch<ver>-ds<ver>-<hash>`` unless already set; the hash covers this interpreter, its
  environment's paths and the ninja binary (what makes ninja rebuild). Right after collection
  (``pytest_collection_finish``), when a selected test needs the op and it is not loadable without
  a rebuild (``build_deepspeed_ops.op_staleness``), it is built there in a subprocess: before any
  test, not in a fixture's set-up (pytest-timeout's bound covers set-up too). The session fixture
  ``deepspeed_ops`` re-checks, so no rank ever compiles inside a test's bound;
  ``.ci/deepspeed_setup.sh`` builds the same directory ahead of time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pytest_nccl

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # pytest's default (prepend) import mode has put it there already
    sys.path.insert(0, str(HERE))
from build_deepspeed_ops import SHM_OP, ensure_env, op_staleness  # noqa: E402
from headlines import describe, named_rank_sets, names_ranks  # noqa: E402

ensure_env()

from pytest_nccl.testing import hf_offline_env  # noqa: E402

hf_offline_env()

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
BUILD_TIMEOUT_S = 900

# The outcome of building the op in this process: None (not tried), "" (ready) or why it failed.
_build_outcome: str | None = None


def _needs_deepspeed_op(item) -> bool:
    names = getattr(item, "fixturenames", ())
    if "deepspeed_ops" in names:
        return True
    kind = getattr(getattr(item, "callspec", None), "params", {}).get("engine_kind", "")
    return "engine_ready" in names and str(kind).startswith("deepspeed")


def ensure_deepspeed_op(announce=None) -> str:
    """Build the op in a subprocess unless it loads without a rebuild; '' when ready, else why not.
    Done once per process (the outcome is kept)."""
    global _build_outcome
    if _build_outcome is not None:
        return _build_outcome
    ext_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    stale = op_staleness(ext_dir)
    if not stale:
        _build_outcome = ""
        return _build_outcome
    (announce or (lambda line: print(line, file=sys.stderr)))(
        f"suites/zero: building DeepSpeed's {SHM_OP} op in {ext_dir} before the tests ({stale}); "
        "45-110 s on 2 cores, once per environment")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(HERE / "build_deepspeed_ops.py")],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _build_outcome = f"building DeepSpeed's {SHM_OP} op took over {BUILD_TIMEOUT_S} s"
        return _build_outcome
    if proc.returncode != 0:
        _build_outcome = (f"building DeepSpeed's {SHM_OP} op failed (needs g++ and ninja):\n"
                          f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return _build_outcome
    still = op_staleness(ext_dir)
    _build_outcome = f"DeepSpeed's {SHM_OP} op would still be rebuilt inside a test: {still}" if still else ""
    if announce and not still:
        announce(f"suites/zero: {SHM_OP} ready ({time.monotonic() - t0:.0f} s)")
    return _build_outcome


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Build the op, when a selected test needs it and it would be rebuilt, right after collection:
    in no test's set-up (pytest-timeout's bound covers set-up, session fixtures included), and
    before the plugin starts its fork server."""
    if not HAVE_DEEPSPEED or session.config.option.collectonly:
        return
    if not any(_needs_deepspeed_op(item) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    announce = (lambda line: reporter.write_line(line)) if reporter is not None else None
    ensure_deepspeed_op(announce)


@pytest.fixture(scope="session")
def deepspeed_ops() -> str:
    """Skip without DeepSpeed; otherwise make sure its CPU comm op loads from the cache without a
    rebuild. The build itself normally ran after collection (``pytest_collection_finish``); this
    only re-checks (~10 ms), building in a subprocess (the controller never imports DeepSpeed's
    comm backend) if it must, and fails rather than let a rank compile inside a test's bound.
    Returns the cache dir."""
    if not HAVE_DEEPSPEED:
        pytest.skip("deepspeed is not installed (pip install 'pytest-nccl[zero]')")
    problem = ensure_deepspeed_op()
    if problem:
        pytest.fail(problem)
    ext_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    stale = op_staleness(ext_dir)  # changed since the build (another session rebuilding it?)
    if stale:
        pytest.fail(f"DeepSpeed's {SHM_OP} op would be rebuilt inside a test: {stale}")
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
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N or {N, M, ...})``: run ``fn`` on every
    rank through the plugin and require that it fails as ``exc`` with a headline that names the
    collective (``op``, a regex) and, in one mention, exactly the rank(s) that diverged: "rank 3",
    or "ranks 1,3" / "ranks 1-3" for a set. Returns the exception."""

    def check(fn, *args, exc=pytest_nccl.CollectiveMismatch, op: str, rank):
        __tracebackhide__ = True
        with pytest.raises(pytest_nccl.DistributedTestFailure) as info:
            nccl_world.run(fn, *args)
        err = info.value
        diag = err.diagnosis
        headline = diag.headline if diag is not None else str(err)
        print(f"diagnosis (world {nccl_world.size}): {type(err).__name__} [{getattr(diag, 'kind', '?')}] "
              f"ranks at fault {getattr(diag, 'ranks', '?')}: {headline}")
        assert isinstance(err, exc), f"expected {exc.__name__}, got {type(err).__name__}: {headline}"
        assert re.search(op, headline), f"headline does not name /{op}/: {headline}"
        assert names_ranks(headline, rank), (
            f"headline does not name {describe(rank)} (it names "
            f"{[sorted(s) for s in named_rank_sets(headline)]}): {headline}")
        return err

    return check
