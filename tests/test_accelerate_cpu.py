"""accelerate on a CPU group (issue 53): the ranks get what accelerate's own CPU launcher
(``debug_launcher``) sets, so ``Accelerator()`` and accelerate's own distributed test programs count
the group; a user's setting wins and GPU groups get nothing (``Placement.library_env``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_inner_once

from pytest_nccl.core.states import Backend
from pytest_nccl.placement import CPU_RANK_ENV, Placement, place
from pytest_nccl.rank.libraries import accelerate_on_cpu

# the modules the canary runs with the newest releases (.ci/canary.py): one source for both
CANARY_TESTS = Path(__file__).parent.parent / ".ci" / "canary_tests"
PROGRAMS = CANARY_TESTS / "test_accelerate_programs.py"
BARE_STATE = CANARY_TESTS / "test_accelerate_bare_state.py"

CASES = ("test_accelerator_counts_the_group", "test_partial_state_as_accelerate_scripts_make_it",
         "test_accelerate_ops_program", "test_accelerate_sync_program")


@pytest.fixture(scope="module")
def cpu_session(tmp_path_factory):
    """One inner session of the cases at world 2 on the CPU path (CUDA hidden, as on a CPU runner)."""
    pytest.importorskip("accelerate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        for key in CPU_RANK_ENV:  # an outer session's own setting would stand in for the plugin's
            mp.delenv(key, raising=False)
        return run_inner_once(tmp_path_factory, PROGRAMS.read_text(), "--nccl-world=2")


@pytest.mark.parametrize("case", CASES)
def test_forked_cpu_group(cpu_session, case):
    assert f"PASSED test_inner.py::{case}" in cpu_session.text, cpu_session.text


SPMD_CASE = """
import pytest


@pytest.mark.nccl
def test_accelerator_counts_the_launch(world_size):
    from accelerate import Accelerator, PartialState
    assert world_size == 2
    assert PartialState().num_processes == world_size  # bare: built by the plugin, as on a GPU
    assert Accelerator().num_processes == world_size
"""


@pytest.fixture(scope="module")
def bare_session(tmp_path_factory):
    """One inner session of the bare-state module at world 2 on the CPU path, alone (as it must run)."""
    pytest.importorskip("accelerate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        for key in CPU_RANK_ENV:
            mp.delenv(key, raising=False)
        return run_inner_once(tmp_path_factory, BARE_STATE.read_text(), "--nccl-world=2")


@pytest.mark.parametrize("case", ("test_bare_partial_state_imported_in_the_body",
                                  "test_the_next_test_counts_the_group_again"))
def test_bare_partial_state_counts_the_group(bare_session, case):
    assert f"PASSED test_inner.py::{case}" in bare_session.text, bare_session.text


def test_spmd_cpu_launch(launch, monkeypatch):
    pytest.importorskip("accelerate")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for key in CPU_RANK_ENV:
        monkeypatch.delenv(key, raising=False)
    run = launch(SPMD_CASE, "test_inner.py", "--nccl-timeout=60")
    assert run.codes == [0], run.text
    assert "1 passed" in run.report, run.text


def test_cpu_path_gets_the_launchers_settings():
    assert place("auto", 2, 0).library_env({}) == CPU_RANK_ENV
    assert place(Backend.GLOO, 2, 0).library_env({}) == CPU_RANK_ENV
    # fewer GPUs than ranks: auto hides CUDA, the CPU path
    assert place("auto", 2, 1).library_env({}) == CPU_RANK_ENV


def test_a_users_setting_wins():
    env = place("auto", 2, 0).library_env({"ACCELERATE_USE_CPU": "false", "PATH": "/bin"})
    assert "ACCELERATE_USE_CPU" not in env
    assert env == {k: v for k, v in CPU_RANK_ENV.items() if k != "ACCELERATE_USE_CPU"}


@pytest.mark.parametrize(("value", "on_cpu"), [("yes", True), ("1", True), (" True ", True), ("on", True),
                                               ("false", False), ("0", False), ("", False), ("maybe", False)])
def test_accelerate_on_cpu_reads_the_flag_as_accelerate_does(value, on_cpu):
    assert accelerate_on_cpu({"ACCELERATE_USE_CPU": value}) is on_cpu


def test_gpu_groups_get_nothing():
    assert place("auto", 2, 2).library_env({}) == {}
    assert place(Backend.GLOO, 2, 2).library_env({}) == {}  # a GPU per rank
    assert place(Backend.GLOO, 2, 1).library_env({}) == {}  # ranks share the GPU
    assert Placement(Backend.NCCL, "requested", gpus=True).library_env({}) == {}
