"""verl's own single controller under ``pytest-nccl watch`` (issue 29 item 2): the driver
suites/verl/ray_worker_group.py starts a local Ray cluster (two CPUs, no dashboard), a
``RayWorkerGroup`` of two verl ``Worker`` actors on a ``RayResourcePool(use_gpu=False)``, and runs
one ``compute_log_prob`` of verl's FSDP actor (gloo) on rollouts whose lengths give the ranks
different micro-batch counts (suites/verl/dynamic_batching.py).

- verl 0.7.1 (verl#6176/#6178: the actor syncs no micro-batch count): the verdict names the ranks,
  the ops and verl's line in dp_actor.py, exit 3, within --timeout + 10 s.
- a good release with the legacy actor (0.7.0): untouched, the driver's own status.
- either way, no process of the Ray cluster (raylet, GCS, workers) is left (``run_watch`` checks).

Runs with this interpreter's verl (the verl venvs; see README "verl"): without verl or Ray it skips,
and so it does on a release without the legacy actor (0.8.0 on).
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from watch_support import HF_OFFLINE, REPO, run_watch, untouched, verdict_ok

verl = pytest.importorskip("verl", reason="verl is not installed (pip install verl; .ci/verl_stacks.sh builds them)")
pytest.importorskip("ray", reason="ray is not installed (verl's single controller runs on Ray)")

TIMEOUT = 20.0
DRIVER = REPO / "suites" / "verl" / "ray_worker_group.py"
# the releases whose FSDP actor syncs no micro-batch count (suites/verl/test_dynamic_batching.py):
# #5051 first shipped in 0.7.1, the fix (#5591) in no release, 0.8.0 removed the legacy actor
BAD_RELEASES = {"0.7.1"}
FORWARD = "self.actor_module("  # the actor's forward in _forward_micro_batch: the second micro-batch's all-gather


@pytest.fixture(scope="module")
def actor_source():
    """verl's dp_actor.py; skips on a release without the legacy actor."""
    try:
        spec = importlib.util.find_spec("verl.workers.actor.dp_actor")
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        pytest.skip(f"verl {verl.__version__} has no legacy FSDP actor (verl.workers.actor.dp_actor)")
    return spec.origin


def _ray_can_serialize() -> None:
    """Ray's serializer imports pyarrow when it is installed; a pyarrow built for NumPy 2 next to the
    NumPy 1 that verl 0.7 pins raises there, in the driver's first ray.get (not a verl bug)."""
    try:
        import pyarrow  # noqa: F401
    except ModuleNotFoundError:
        pass
    except ImportError as exc:
        pytest.skip(f"Ray cannot serialize here: pyarrow does not import ({exc}); with verl 0.7's numpy<2, "
                    "install pyarrow<26")


def watch_driver(tmp_path, rows: str, *more: str):
    _ray_can_serialize()
    return run_watch(tmp_path, [sys.executable, str(DRIVER), rows, *more], "--timeout", f"{TIMEOUT:g}", timeout=300,
                     RAY_USAGE_STATS_ENABLED="0", **HF_OFFLINE)


# --second-pool: a second worker group on a resource pool of its own is a second default world of the
# job (its own store); its rank 0 wrote the first world's rank-0.json before worlds were kept apart
@pytest.mark.parametrize("pools", [[], ["--second-pool"]], ids=["one-pool", "two-pools"])
def test_ragged_micro_batch_counts(tmp_path, actor_source, pools):
    run = watch_driver(tmp_path, "ragged", *pools)
    if verl.__version__ not in BAD_RELEASES:
        untouched(run)
        assert "driver: log-prob metric per rank" in run.stdout, run.text
        return
    verdict_ok(run, TIMEOUT)
    headline = run.summary["headline"]
    # rank 0 (one micro-batch) reduces the step's metric; rank 1 all-gathers for its second forward
    found = re.match(r"op mismatch at collective #\d+ of group default: rank 0 all_reduce, rank 1 all_gather_single "
                     r"\(from \S*dynamic_batching\.py:\d+ .*; rank 1 from verl/workers/actor/dp_actor\.py:(\d+) ",
                     headline)
    assert found, headline
    line = int(found.group(1))
    with open(actor_source) as f:
        assert FORWARD in f.read().splitlines()[line - 1], (line, headline)
    assert run.summary["kind"] == "op-mismatch" and run.summary["job_exit_code"] != 0, run.summary


def test_even_micro_batch_counts_untouched(tmp_path, actor_source):
    """Control: one micro-batch on every rank; untouched on every release, the bad one too."""
    run = watch_driver(tmp_path, "even")
    untouched(run)
    assert "driver: log-prob metric per rank" in run.stdout, run.text
