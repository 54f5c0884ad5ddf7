"""The public exception hierarchy.

Imported on both sides (controller and ranks), so it imports nothing heavy. A user names these in
``pytest.mark.xfail(raises=...)``; the plugin raises exactly one of them for a failed distributed test.
"""

from __future__ import annotations


class DistributedTestFailure(Exception):
    """A distributed test failed. ``diagnosis`` holds the analysis (kind, headline, ranks, ...)."""

    def __init__(self, message: str, diagnosis=None, report: str = ""):
        super().__init__(message)
        self.diagnosis = diagnosis
        #: the full text the plugin shows under the headline (trace table, per-rank sections)
        self.report = report


class RankRaised(DistributedTestFailure):
    """A rank raised: an exception, a failed assert, ``pytest.fail``."""


class RankDied(DistributedTestFailure):
    """A rank left the process: ``os._exit``, ``sys.exit`` or a signal (SIGKILL, SIGSEGV, ...)."""


class CollectiveTimeout(DistributedTestFailure):
    """The test reached its bound: every rank stuck in the same collective, or a slow rank."""


class CollectiveMismatch(DistributedTestFailure):
    """Ranks ran different collective sequences: op, shape or dtype differ at the same sequence
    number, or a rank left or skipped while the others wait in a collective it never entered."""


class NcclUsageError(Exception):
    """Bad input from the user (options, marker arguments, fixtures, functions): one clear line.

    ``infrastructure``: the test could not be run at all for a reason that is not its fault, as when
    no rank can load the test function because a library does not import (``git bisect`` must skip
    such a commit, not blame it: ``--nccl-exitcode-infra``)."""

    def __init__(self, message: str, infrastructure: bool = False):
        super().__init__(message)
        self.infrastructure = infrastructure


class RankSetupError(DistributedTestFailure):
    """The group could not be started or the test could not be loaded in a rank (infrastructure)."""
