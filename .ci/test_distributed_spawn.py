"""PyTorch's own distributed suite, as test/distributed/test_distributed_spawn.py runs it: the torch
wheel's DistributedTest._DistTestBase through TestDistBackend. Needs BACKEND, WORLD_SIZE and
TEMP_DIR in the environment (.ci/run sets them); under pytest-nccl its ranks come from the fork
server (docs/adopt.md)."""

import torch
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
