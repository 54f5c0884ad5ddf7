"""Modern-stack suite: DTensor tensor parallelism, FSDP2 checkpoints and micro-batches, a weight-sync
side group, torch.compile, on N CPU ranks (gloo) at any ``--nccl-world``. Run:
``pytest --nccl-world=2 suites/modern`` (see README.md).

``expect_diagnosis`` (``pytest_nccl.testing.expect``) runs a hanging form on every rank through ``nccl_world``
and requires the exception class and a headline that names the collective, exactly the diverging
rank(s) in one mention, and the ``file:line`` of the diverging call.
"""

from __future__ import annotations

from pytest_nccl.testing import hf_offline_env
from pytest_nccl.testing.expect import expect_diagnosis_fixture  # noqa: F401 (the expect_diagnosis fixture)

hf_offline_env()
