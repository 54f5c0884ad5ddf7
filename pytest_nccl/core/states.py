"""Every state the analysis knows, as an enum: how a rank ended (or where it is), where one collective
is, where a record came from, why a call stopped being watched, what kind of failure it was, how pytest
ended a test case and in which phase.

The enums are ``str`` subclasses that print as their value, so reports, headlines and JSON keep the
words a person reads ("passed", "shape-mismatch"); code compares members, never the words.
Standard library only: every rank imports it.
"""

from __future__ import annotations

import enum
from typing import TypeVar

W = TypeVar("W", bound="Word")


class Word(str, enum.Enum):
    """An enum member that prints as its value in reports, headlines and JSON."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    @classmethod
    def read(cls: type[W], word: object) -> W | None:
        """The member a word names, None for a word this version does not know (a newer or foreign
        file, another version's request): the caller decides what an unknown word means, nothing raises."""
        try:
            return cls(word)
        except ValueError:
            return None


class Backend(Word):
    """``--nccl-backend``, and the backend a group runs (torch names it by the same words)."""
    AUTO = "auto"
    NCCL = "nccl"
    GLOO = "gloo"


class RankState(Word):
    """How one rank ended a call, or where it is while the call runs (the same in every mode)."""
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    ERROR = "error"              # the call could not run (the function cannot be loaded, the result pickled)
    RUNNING = "running"          # still in the call: stuck, or busy
    DEAD = "dead"                # its process ended inside the call
    NOT_STARTED = "not-started"  # never reached the call (SPMD: still in an earlier test)
    UNSEEN = "unseen"            # runs on another node, which this transport cannot see (a watch alone)

    @property
    def judged(self) -> "RankState":
        """The state the rules and the diagnosis see: a rank that could not run the call failed."""
        return RankState.FAILED if self is RankState.ERROR else self

    @property
    def finished(self) -> bool:
        """Out of the call for good."""
        return self not in (RankState.RUNNING, RankState.NOT_STARTED, RankState.UNSEEN)

    @property
    def failure(self) -> bool:
        """A failure starts the referee's grace period."""
        return self in (RankState.FAILED, RankState.ERROR, RankState.DEAD)


CLEAN_STATES = frozenset({RankState.PASSED, RankState.SKIPPED, RankState.XFAILED})


class Phase(Word):
    """Where in a test's run pytest reported on it (pytest's ``report.when``; ``collect`` for a
    collection report, which has none)."""
    COLLECT = "collect"
    SETUP = "setup"
    CALL = "call"
    TEARDOWN = "teardown"


class CaseOutcome(Word):
    """How pytest ended one test case, as a report (JUnit, the gate report, the release matrix) says it.

    Not a :class:`RankState`: it is the test's outcome as pytest reports it (one per test, xpassed
    included), where a rank's state is one rank's end of one call."""
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"        # failed outside the test's call: collection, setup or teardown
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"

    @property
    def failed(self) -> bool:
        """Red: the test failed, in its call or around it."""
        return self in (CaseOutcome.FAILED, CaseOutcome.ERROR)

    @property
    def ran_clean(self) -> bool:
        """The test ran and did what it was expected to (an expected failure counts)."""
        return self in (CaseOutcome.PASSED, CaseOutcome.XFAILED, CaseOutcome.XPASSED)


class RecordState(Word):
    """Where one collective is on the rank that issued it."""
    ENTERED = "entered"      # issued, not completed (a synchronous one: the rank sits in it)
    WAITING = "waiting"      # an async one whose Work.wait the rank sits in
    # the call (or its Work.wait) returned before the work completed: NCCL enqueued it on a stream and
    # the CPU went on; the rank waits for it at its next sync point (docs/diagnosis.md, "Backends")
    IN_FLIGHT = "in-flight"
    COMPLETED = "completed"


# An async collective's states in which the rank waits for it: it sits in its Work.wait, or it waits
# at a sync point for one enqueued and not completed (or will, at its next one)
WAITED_ON = frozenset({RecordState.WAITING, RecordState.IN_FLIGHT})


class Source(Word):
    """Where a record came from."""
    PYTHON = "python"                    # the tracer's journal, written before the rank entered it
    FLIGHT_RECORDER = "flight-recorder"  # torch's Flight Recorder: issued from C++ (DDP's reducer)
    OUTSIDE = "outside"                  # a wait outside any collective the tracer journaled (a store or a
                                         # group being created, a store read: journal v3)


class Reason(Word):
    """Why a call stopped being watched."""
    COMPLETED = "completed"   # every rank finished
    DECIDED = "decided"       # a rule found the outcome before every rank finished
    TIMEOUT = "timeout"       # the bound was reached
    # another hand ended the call first (Ctrl-C, a scheduler's SIGTERM): judged on what was known then
    INTERRUPTED = "interrupted"
    # read after the fact from the ranks' Flight Recorder dumps (``pytest-nccl explain``): where each
    # rank was when it wrote its dump, for however long it had been there
    DUMPED = "dumped"


class Kind(Word):
    """What kind of failure a diagnosis names (docs/diagnosis.md shows each with its headline)."""
    SHAPE_MISMATCH = "shape-mismatch"
    DTYPE_MISMATCH = "dtype-mismatch"
    OP_MISMATCH = "op-mismatch"
    ROOT_MISMATCH = "root-mismatch"
    REDUCE_OP_MISMATCH = "reduce-op-mismatch"
    SPLIT_MISMATCH = "split-mismatch"
    P2P_MISMATCH = "p2p-mismatch"
    DEADLOCK = "deadlock"
    RANK_LEFT = "rank-left"
    GROUP_MISMATCH = "group-mismatch"
    RAISED = "rank-raised"
    DIED = "rank-died"
    HANG = "hang"
    SLOW_RANK = "slow-rank"
    TIMEOUT = "timeout"
    SKIP_MISMATCH = "skip-mismatch"
    SETUP = "setup"
    RENDEZVOUS = "rendezvous"
    UNSEEN = "unseen-ranks"      # ranks wait for ranks of other nodes that the watch cannot see

    @property
    def exception_name(self) -> str:
        """The public exception (errors.py) a failure of this kind raises."""
        return EXCEPTION_FOR_KIND.get(self, "DistributedTestFailure")


# Arguments the ranks disagree on at the same position of a group
MISMATCH_KINDS = frozenset({Kind.SHAPE_MISMATCH, Kind.DTYPE_MISMATCH, Kind.OP_MISMATCH, Kind.ROOT_MISMATCH,
                            Kind.REDUCE_OP_MISMATCH, Kind.SPLIT_MISMATCH})

EXCEPTION_FOR_KIND = {
    **{kind: "CollectiveMismatch" for kind in MISMATCH_KINDS},
    Kind.P2P_MISMATCH: "CollectiveMismatch", Kind.DEADLOCK: "CollectiveMismatch",
    Kind.RANK_LEFT: "CollectiveMismatch", Kind.GROUP_MISMATCH: "CollectiveMismatch",
    Kind.RAISED: "RankRaised", Kind.DIED: "RankDied",
    Kind.HANG: "CollectiveTimeout", Kind.SLOW_RANK: "CollectiveTimeout", Kind.TIMEOUT: "CollectiveTimeout",
    Kind.RENDEZVOUS: "CollectiveTimeout", Kind.UNSEEN: "CollectiveTimeout",
    Kind.SKIP_MISMATCH: "DistributedTestFailure", Kind.SETUP: "RankSetupError",
}
