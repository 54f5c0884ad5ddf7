"""MoE suite: expert-parallel dispatch and combine through megatron-core's own ``all_to_all`` (the
function its all-to-all token dispatcher calls), with routing that differs across ranks, on N CPU
ranks (gloo), at any ``--nccl-world``. Run: ``pytest --nccl-world=2 suites/moe`` (see README.md).

``expect_diagnosis`` (``pytest_nccl.testing.expect``) runs a failing form on every rank through ``nccl_world``
and requires the exception class and a headline that names the collective, the rank(s) and the
``file:line``.
"""

from pytest_nccl.testing.expect import expect_diagnosis_fixture  # noqa: F401 (the expect_diagnosis fixture)
