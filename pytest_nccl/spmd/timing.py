"""The SPMD transport's own waits and polls (no rule reads them; the rules' are ``core/referee.py``'s).
Rank 0's decider and every rank read the same ones: a rank's patience is the decider's plus a margin."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpmdTiming:
    # once decided, for every rank's watchdog to publish a snapshot through the launcher's store,
    # which the decider polls: slower than a socket, hence longer than the forked stacks_wait
    snapshot_wait: float = 3.0
    release_wait: float = 5.0     # after the abort, for every rank to leave the test
    store_poll_max: float = 0.05  # slowest store polling interval (starts at 2 ms, doubles)
    journal_push: float = 0.1     # how often a running rank appends its journal to the store
    liveness_poll: float = 0.2    # how often rank 0 looks for ranks whose process ended (its host's)
    verdict_margin: float = 30.0  # a rank gives rank 0 this long past the bound before giving up
    collect_wait: float = 600.0   # for the other ranks to finish collecting (imports can be slow)
    finish_wait: float = 120.0    # at the end, for the other ranks to finish the session
    # after an ending signal, for the session to end here (the report written): then the rank ends
    # anyway, within the launcher's grace (torchrun's 30 s, Slurm's KillWait of 30 s by default)
    interrupt_wait: float = 20.0
    interrupted_finish_wait: float = 3.0  # then, at the session's end, for the other ranks
    group_wait_min: float = 30.0  # for every rank to come to a (re-)created process group


TIMING = SpmdTiming()
