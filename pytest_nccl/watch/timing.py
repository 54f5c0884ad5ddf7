"""The watch's own waits and polls (no rule reads them; the rules' are ``core/referee.py``'s).
Standard library only: the agent inside every rank of a watched job reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WatchTiming:
    stacks_wait: float = 1.0      # once decided, for the ranks' agents to answer with stacks and Flight Recorder
    poll: float = 0.05            # waiting on the other nodes' watches, how often it looks
    # on several nodes: how long a watch waits for the other nodes' watches to be in sync before it
    # judges, and for the verdict of the watch of rank 0's node (which collects the stacks of every
    # node's ranks first) before it gives its own
    agree_wait: float = 5.0
    status_every: float = 1.0     # how often each rank's Flight Recorder progress is asked for
    scan_every: float = 0.05      # how often the directory is listed for ranks not seen yet
    serve_every: float = 0.05     # several nodes: how often a node publishes its summary and looks for questions
    ask_poll: float = 0.02        # several nodes: how often an asking watch looks for the answer
    details_wait: float = 5.0     # several nodes: for a node's records of its ranks, when a rule reads them
    verdict_poll: float = 0.1     # several nodes: how often a watch that does not decide looks for the verdict
    beat_every: float = 1.0       # several nodes: a node's summary is set at least this often (its watch lives)
    # ... and a node whose summary did not move for this long has lost its watch: its ranks are unseen
    # (a loaded host's relay may stall for seconds; a watch killed stays silent)
    node_silent: float = 10.0
    job_term_wait: float = 5.0    # between SIGTERM and SIGKILL when the watch ends the job
    reap_poll: float = 0.05       # ending the job, how often it looks whether its processes are gone
    orphan_kill_after: float = 10.0  # a rank whose watch is gone: for its own handler
    agent_close_wait: float = 5.0  # at a rank's exit, for its agent to finish the answer in progress


TIMING = WatchTiming()
