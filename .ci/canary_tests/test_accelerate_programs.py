"""accelerate's own distributed test programs (``accelerate.test_utils.scripts``) on the plugin's
group at world 2, and what they rely on: ``Accelerator()`` counts the group. The canary runs this
module with the newest releases; tests/test_accelerate_cpu.py runs it as an inner session."""

import pytest


def fresh_state():
    """Forget accelerate's process-wide singletons: a warm rank keeps an earlier test's."""
    from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.nccl
def test_accelerator_counts_the_group(world_size):
    fresh_state()
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    accelerator = Accelerator()
    assert (accelerator.num_processes, accelerator.distributed_type) == (world_size, DistributedType.MULTI_CPU)


@pytest.mark.nccl
def test_partial_state_as_accelerate_scripts_make_it(world_size):
    fresh_state()
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env
    assert PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).num_processes == world_size


@pytest.mark.nccl
def test_accelerate_ops_program():
    fresh_state()
    from accelerate.test_utils.scripts import test_ops
    test_ops.main()


@pytest.mark.nccl
def test_accelerate_sync_program(world_size):
    fresh_state()
    from accelerate import Accelerator
    from accelerate.test_utils.scripts import test_sync
    # counted as one process, main() would take its one-process path and prove nothing
    assert Accelerator().num_processes == world_size
    test_sync.main()
