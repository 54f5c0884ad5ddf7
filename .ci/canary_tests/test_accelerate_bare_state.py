"""A bare ``PartialState()`` counts the plugin's CPU group at world 2, the state built by the plugin
(``rank/libraries.py``): on import, before a test, and again after a test reset it. Run alone (no other
module may import accelerate first: the first test proves the import's path); the canary runs it with
the newest releases, tests/test_accelerate_cpu.py as an inner session."""

import sys

import pytest


@pytest.mark.nccl
def test_bare_partial_state_imported_in_the_body(world_size):
    assert "accelerate.state" not in sys.modules  # else this proves the per-test path, not the import's
    from accelerate import PartialState
    assert PartialState().num_processes == world_size


@pytest.mark.nccl
def test_a_test_resets_accelerates_state():
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(True)


@pytest.mark.nccl
def test_the_next_test_counts_the_group_again(world_size):
    from accelerate import PartialState
    assert PartialState().num_processes == world_size
