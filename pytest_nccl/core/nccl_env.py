"""What pytest-nccl sets in the environment of the ranks it starts (forked groups, a watched job) for
NCCL, each only where the user has not set it; why each, and why not the others, is in
docs/diagnosis.md ("Backends: when a collective is complete"). Standard library only."""

from __future__ import annotations

from collections.abc import Mapping

RANK_ENV = {
    # The Flight Recorder: every collective with its state (scheduled, started, completed) and a
    # sequence id, C++-issued ones (DDP's reducer) included; dumped from the stuck ranks at a verdict.
    # torch 2.7 and newer read the first name, older ones the second.
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    # NCCL's watchdog takes the process down when a collective times out (the process group's timeout:
    # the test's bound plus a margin, so the verdict comes first) or fails: a rank whose controller is
    # gone still ends, and nothing runs on after a communicator error.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
}
# Not set: TORCH_NCCL_BLOCKING_WAIT (it makes Work.wait() block the CPU, which hides the asynchrony the
# tests are for; the tracer handles either way), TORCH_NCCL_ENABLE_TIMING (a cost on every collective
# for durations no rule reads).


def nccl_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings of RANK_ENV that ``environ`` does not set already."""
    return {key: value for key, value in RANK_ENV.items() if key not in environ}
