"""Whether accelerate's own bare ``PartialState()`` counts the plugin's CPU group: the test resets
accelerate's state first, the one the plugin builds (``rank/libraries.py``) included. The probe of
``pytest-nccl bisect accelerate`` in docs/support.md, and one of the canary's checks."""

import pytest


@pytest.mark.nccl(world=2)
def test_bare_partial_state_counts_the_group(world_size):
    from accelerate import PartialState
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)  # a warm rank may hold an earlier test's singletons
    GradientState._reset_state()
    state = PartialState()
    assert state.num_processes == world_size, f"accelerate counts {state.num_processes}: {state.distributed_type}"
