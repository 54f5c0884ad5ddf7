"""The forked transport's own waits and polls (no rule reads them; the rules' are ``core/referee.py``'s)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForkedTiming:
    stacks_wait: float = 1.0         # once decided, for the ranks' reader threads to answer with their stacks
    flight_recorder_wait: float = 0.5  # a Flight Recorder poll while the call runs, for every rank's answer
    faulthandler_wait: float = 0.2   # SIGUSR1 sent: for faulthandler to write a stuck rank's stacks
    term_wait: float = 0.5           # between SIGTERM and SIGKILL of a rank's session
    join_poll: float = 0.5           # how often a starting group reads its sockets and exits
    dead_rank_drain: float = 0.05    # a rank died before joining: for its exit status to come
    exit_status_wait: float = 1.0    # for the fork server to report a dead rank's exit status
    exit_status_poll: float = 0.01   # how often the fork server's reports are read meanwhile
    gpu_lease_poll: float = 0.2      # how often a group waiting for free GPUs tries again
    fork_server_start: float = 300.0  # the fork server imports torch and the test modules


TIMING = ForkedTiming()
