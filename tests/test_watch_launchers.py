"""``pytest-nccl watch`` on real jobs of every common launcher (gloo, world 2): torchrun with elastic
restarts, ``accelerate launch``, the ``deepspeed`` launcher, ``torch.multiprocessing.spawn``, plain
multiprocessing (fork and spawn), a shell launcher with SLURM's variables, Ray actors. The jobs are
the scripts in tests/watch/. Bad version: the verdict names the rank, the op, the per-rank shapes and
the line, exit 3, within --timeout + 10 s; healthy version: untouched, its own exit status. No
process of the job outlives its test (``run_watch`` checks)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from watch_support import (
    HF_OFFLINE,
    JOBS,
    REPO,
    free_port,
    line_in,
    run_watch,
    untouched,
    verdict_ok,
)

TIMEOUT = 20.0
GATHER = "# the gather"


def gather_headline(script: str, first: str = "rank 0 [2], rank 1 [3]") -> str:
    return (f"shape mismatch in all_gather #4 of group default: {first} "
            f"(from {JOBS / script}:{line_in(JOBS / script, GATHER)}")


def tool(name: str) -> str:
    """A launcher's console script, from this interpreter's environment."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} is not installed next to {sys.executable}")
    return path


def _watch(tmp_path, launch, **env):
    return run_watch(tmp_path, launch, "--timeout", f"{TIMEOUT:g}", **env)


# -- torch.multiprocessing.spawn and plain multiprocessing: no RANK, rank= and world_size= given ------

@pytest.mark.parametrize("how", ["mp-spawn", "mp-fork", "mp-spawn-process"])
@pytest.mark.parametrize("case", ["good", "bad"])
def test_multiprocessing_ranks(tmp_path, how, case):
    run = _watch(tmp_path, [sys.executable, str(JOBS / "spawn_job.py"), case, how, str(free_port())])
    if case == "good":
        untouched(run)
        assert run.stdout.count("trained") == 2
        return
    verdict_ok(run, TIMEOUT)
    assert gather_headline("spawn_job.py") in run.stderr, run.stderr
    assert run.summary["kind"] == "shape-mismatch" and run.summary["job_exit_code"] != 0


# -- torchrun: elastic restarts ------------------------------------------------------------------------

def _restart_job(tmp_path, case):
    launch = [tool("torchrun"), "--nproc-per-node=2", "--max-restarts=1", "--master-addr=127.0.0.1",
              f"--master-port={free_port()}", str(JOBS / "restart_job.py"), case]
    return _watch(tmp_path, launch)


def test_torchrun_failed_attempt_is_reported_and_the_restart_followed(tmp_path):
    run = _restart_job(tmp_path, "flaky")
    raised = line_in(JOBS / "restart_job.py", "# rank 0 waits here")
    assert "pytest-nccl watch: attempt 1 of 2 failed; the launcher restarts it" in run.stderr, run.text
    assert "rank 1 raised ValueError: bad node in attempt 0 after 3 collectives in group default" in run.stderr
    assert "pytest-nccl watch: following the launcher's attempt 2 (restart 1)" in run.stderr
    assert "rank 0 trained in attempt 1" in run.stdout and "rank 1 trained in attempt 1" in run.stdout
    # the job recovered: its own status, and the first attempt's verdict in --json
    assert run.code == 0 and run.summary["exit_code"] == run.summary["job_exit_code"] == 0, run.text
    assert not run.summary["verdict"] and run.summary["restart"] == 1
    (earlier,) = run.summary["earlier_attempts"]
    assert earlier["restart"] == 0 and earlier["kind"] in ("rank-raised", "rank-died"), earlier
    assert earlier["kind"] != "rank-raised" or f"restart_job.py:{raised}" in earlier["headline"]


def test_torchrun_gives_up_after_the_last_attempt(tmp_path):
    run = _restart_job(tmp_path, "broken")
    verdict_ok(run, TIMEOUT)
    assert run.summary["restart"] == 1 and len(run.summary["earlier_attempts"]) == 1, run.summary
    assert "bad node in attempt 1" in run.summary["headline"] or run.summary["kind"] == "rank-died", run.summary
    assert run.summary["job_exit_code"] != 0


def test_a_restart_that_cannot_form_its_group_is_said_with_the_launchers_status(tmp_path):
    """The restart's ranks raise in init_process_group (torch 2.13's gloo meets the first attempt's
    addresses so, issue 40): the watch says which ranks, where and what, not only the launcher's status."""
    run = _restart_job(tmp_path, "rejoin")
    assert run.code == run.summary["job_exit_code"] != 0, run.text  # the launcher's own status: no collective verdict
    line = line_in(JOBS / "restart_job.py", "# never completes")
    assert re.search(rf"pytest-nccl watch: attempt 2: ranks 0,1 failed in init_process_group at "
                     rf"{re.escape(str(JOBS / 'restart_job.py'))}:{line - 1}: DistStoreError: .*timeout.* \(the "
                     rf"launcher's exit status {run.code}\)", run.stderr), run.text


def test_torchrun_hang_ends_the_job_although_restarts_are_left(tmp_path):
    run = _restart_job(tmp_path, "hang")
    verdict_ok(run, TIMEOUT)
    line = line_in(JOBS / "restart_job.py", "# each rank waits for the other")
    assert (f"every rank is inside recv #1 of group default:p2p from {JOBS / 'restart_job.py'}:{line} and none "
            f"completed within {TIMEOUT:g} s (--timeout)") in run.stderr, run.stderr
    assert run.summary["ended_by_watch"] and run.summary["restart"] == 0 and not run.summary["earlier_attempts"]


# -- accelerate launch: a script whose first imports are datasets and transformers ---------------------

@pytest.mark.parametrize("case", ["good", "bad"])
def test_accelerate_launch_script_importing_datasets_first(tmp_path, case):
    for module in ("datasets", "transformers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    # on CPU, --multi_gpu is the launcher that starts torchrun's workers (--cpu would want mpirun)
    launch = [tool("accelerate"), "launch", "--multi_gpu", "--num_processes=2",
              "--num_machines=1", f"--main_process_port={free_port()}", "--mixed_precision=no",
              "--dynamo_backend=no", str(JOBS / "accelerate_job.py"), case]
    run = _watch(tmp_path, launch, **HF_OFFLINE)
    if case == "good":
        untouched(run)
        return
    verdict_ok(run, TIMEOUT)
    job = JOBS / "accelerate_job.py"
    assert (f"shape mismatch in all_gather #4 of group default: rank 0 [1, 2], rank 1 [1, 3] (from "
            f"{job}:{line_in(job, GATHER)}, via accelerate)") in run.stderr


# -- the deepspeed launcher ------------------------------------------------------------------------------

BUILD_OPS = REPO / "suites" / "zero" / "build_deepspeed_ops.py"


@pytest.fixture(scope="module")
def deepspeed_ops() -> str:
    """DeepSpeed's CPU comm op, built before the test into the cache ``.ci/deepspeed_setup.sh`` and
    suites/zero use (a rank that compiles it takes minutes on a loaded host, and a build killed by
    a test's bound leaves torch's lock for the next); its directory, for TORCH_EXTENSIONS_DIR."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    ext = os.environ.get("TORCH_EXTENSIONS_DIR") or subprocess.run(
        [sys.executable, str(BUILD_OPS), "--print-dir"], capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext)
    if subprocess.run([sys.executable, str(BUILD_OPS), "--check"], env=env, capture_output=True).returncode:
        build = subprocess.run([sys.executable, str(BUILD_OPS)], env=env, capture_output=True, text=True, timeout=1200)
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return ext


def _shm_names(prefix: str) -> set:
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)} if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("case", ["good", "bad"])
def test_deepspeed_launcher(tmp_path, case, deepspeed_ops):
    port = free_port()
    launch = [tool("deepspeed"), "--num_gpus=2", f"--master_port={port}", str(JOBS / "deepspeed_job.py"), case]
    before = _shm_names("deepspeed_")
    run = run_watch(tmp_path, launch, "--timeout", f"{TIMEOUT:g}", timeout=300, DS_ACCELERATOR="cpu",
                    TORCH_EXTENSIONS_DIR=deepspeed_ops)
    # the ranks' deepspeed_allreduce_buffer_<...>_<port>_<rank> (66 MB each): DeepSpeed 0.19 unlinks
    # them neither when its ranks are ended nor when they end on their own
    left = _shm_names("deepspeed_") - before
    if case == "good":
        untouched(run)  # a job that ended on its own keeps what it left: the watch removes nothing
        _clean_up_after_deepspeed(left, port)
        return
    verdict_ok(run, TIMEOUT)
    assert gather_headline("deepspeed_job.py") in run.stderr, run.stderr
    if run.summary["ended_by_watch"]:
        assert not left, f"{sorted(left)} outlived the ranks the watch ended\n{run.text}"
    else:  # a rank aborted and its launcher ended the job before the watch concluded (seen on a loaded
        # host): a job that ended on its own keeps what it left, as a healthy one does
        assert "the job ended on its own" in run.stderr, run.stderr
        _clean_up_after_deepspeed(left, port)


def _clean_up_after_deepspeed(left: set, port: int) -> None:
    """DeepSpeed's own leak, not the watch's: the test removes it, and the job left nothing else."""
    leaked = {n for n in left if f"_{port}_" in n}
    for name in leaked:
        os.unlink(f"/dev/shm/{name}")
    assert left == leaked, f"the job left {sorted(left - leaked)} in /dev/shm"


# -- a launcher that is not Python, with SLURM's variables (as srun sets them) ---------------------------

@pytest.mark.parametrize("case", ["good", "bad"])
def test_shell_launcher_with_slurm_variables(tmp_path, case):
    port = free_port()
    launcher = tmp_path / "fake_srun.sh"
    launcher.write_text(
        "#!/bin/sh\n# as srun starts tasks: SLURM_PROCID and SLURM_NTASKS, no RANK\nstatus=0\n"
        f"SLURM_PROCID=0 SLURM_NTASKS=2 {sys.executable} {JOBS / 'slurm_job.py'} {case} {port} & a=$!\n"
        f"SLURM_PROCID=1 SLURM_NTASKS=2 {sys.executable} {JOBS / 'slurm_job.py'} {case} {port} & b=$!\n"
        "wait $a || status=$?\nwait $b || status=$?\nexit $status\n")
    launcher.chmod(0o755)
    run = _watch(tmp_path, ["sh", str(launcher)])
    if case == "good":
        untouched(run)
        return
    verdict_ok(run, TIMEOUT)
    assert gather_headline("slurm_job.py") in run.stderr, run.stderr


# -- Ray: the driver starts a local cluster; actors set RANK/MASTER_* themselves -------------------------

@pytest.mark.parametrize("case", ["good", "bad"])
def test_ray_actors(tmp_path, case):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install ray)")
    run = run_watch(tmp_path, [sys.executable, str(JOBS / "ray_job.py"), case, str(free_port())],
                    "--timeout", f"{TIMEOUT:g}", timeout=180, RAY_USAGE_STATS_ENABLED="0")
    if case == "good":
        untouched(run)
        assert "driver: trained [16.0, 16.0]" in run.stdout
        return
    verdict_ok(run, TIMEOUT)
    # the actors' ranks, the op, their shapes, the line in the actor's method; run_watch checked that
    # no process of the cluster (raylet, GCS, workers) is left
    assert gather_headline("ray_job.py") in run.stderr, run.stderr
