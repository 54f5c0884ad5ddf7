"""pytest-nccl: run tests on N-rank torch.distributed groups; every hang, crash or desync becomes a
bounded-time failure with a collective trace and a one-line diagnosis."""

from .errors import (CollectiveMismatch, CollectiveTimeout, DistributedTestFailure, NcclUsageError,
                     RankDied, RankRaised, RankSetupError)

__all__ = ["DistributedTestFailure", "RankRaised", "RankDied", "CollectiveTimeout",
           "CollectiveMismatch", "RankSetupError", "NcclUsageError"]
__version__ = "0.1.0"
