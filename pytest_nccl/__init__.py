"""pytest-nccl: run tests on N-rank torch.distributed groups; every hang, crash or desync becomes a
bounded-time failure with a collective trace and a one-line diagnosis."""

from .errors import (
    CollectiveMismatch,
    CollectiveTimeout,
    DistributedTestFailure,
    NcclUsageError,
    RankDied,
    RankRaised,
    RankSetupError,
)

__all__ = ["DistributedTestFailure", "RankRaised", "RankDied", "CollectiveTimeout",
           "CollectiveMismatch", "RankSetupError", "NcclUsageError", "__version__"]


def __getattr__(name: str):
    """``__version__``, from the installed distribution's metadata (pyproject.toml is the one place
    it is written); looked up on first use, since every rank imports this package."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pytest-nccl")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"
