"""Pipeline suite: point-to-point hang and corruption classes of pipeline parallelism, on megatron-core's
own ``P2PCommunicator`` and torch.distributed.pipelining, on N CPU ranks (gloo), at any
``--nccl-world``. Run: ``pytest --nccl-world=2 suites/pipeline`` (see README.md).

``expect_diagnosis`` (``pytest_nccl.testing.expect``) runs a failing form on every rank through ``nccl_world``
and requires the exception class and a headline that names the p2p ops, the rank(s) and the
``file:line`` of the call.
"""

from pytest_nccl.testing.expect import expect_diagnosis_fixture  # noqa: F401 (the expect_diagnosis fixture)
