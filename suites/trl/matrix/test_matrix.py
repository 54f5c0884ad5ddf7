"""The TRL compatibility matrix: every trainer the installed TRL has, under every per-rank data
stressor that applies to it (``pytest_nccl.testing.trl_matrix``), one test per cell.

    pytest --nccl-world=2 suites/trl/matrix         # and --nccl-world=4
    python -m pytest_nccl matrix trl ...            # over releases: suites/trl/MATRIX.md

A cell the installed TRL cannot run (no such trainer, no such option) skips with the reason. What
is known about the cells that fail on some release (the upstream issue, the first bad and the fixed
release, or why it is not a collective bug) is in ``notes.toml``, which the matrix page shows.
"""

import pytest

from pytest_nccl.testing import trl_compat as compat  # first: offline HF environment
from pytest_nccl.testing import trl_matrix as matrix

# Trainer modules load lazily (seconds): pay that once, in the plugin's fork server.
compat.preload(*matrix.BY_NAME, missing_ok=True)


@pytest.mark.nccl
@pytest.mark.parametrize("trainer,stressor", matrix.cells(), ids=[f"{t}-{s}" for t, s in matrix.cells()])
def test_cell(rank, world_size, tmp_path, trainer, stressor):
    why = matrix.unsupported(trainer, stressor)
    if why:
        pytest.skip(why)
    matrix.run_cell(trainer, stressor, rank=rank, world=world_size, output_dir=tmp_path)
