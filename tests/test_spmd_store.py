"""SPMD mode's store waits (pure: fake clock not needed, the waits are short): one store error is a
hiccup of a loaded host and is retried; errors in a row are the store's host gone (issue 30)."""

import time

from pytest_nccl.spmd.store import STORE_TRIES, poll


def test_one_store_error_is_retried_and_the_wait_goes_on():
    calls = []

    def ready():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("Broken pipe")
        return len(calls) == 3
    assert poll(ready, time.monotonic() + 5) and len(calls) == 3


def test_errors_in_a_row_end_the_wait_as_false_at_once():
    calls = []

    def gone():
        calls.append(1)
        raise RuntimeError("Connection reset by peer")
    t0 = time.monotonic()
    assert not poll(gone, time.monotonic() + 30)
    assert len(calls) == STORE_TRIES and time.monotonic() - t0 < 5


def test_a_harness_verdict_says_pytest_nccl_once_on_rank_0():
    """A verdict the harness gives itself ("pytest-nccl: rank 0's decider failed: ...") was shown as
    "pytest-nccl: pytest-nccl: ..." on rank 0; other headlines get the prefix once."""
    from types import SimpleNamespace

    from pytest_nccl.spmd.testrun import setup_verdict
    from pytest_nccl.spmd.verdicts import setup_failure_report

    harness = "pytest-nccl: rank 0's decider failed: OSError"
    for headline, shown in ((harness, harness), ("rank 1 raised ValueError", "pytest-nccl: rank 1 raised ValueError")):
        rep = SimpleNamespace(outcome="passed", longrepr=None)
        item = SimpleNamespace(session=SimpleNamespace(shouldstop=False))
        setup_failure_report(SimpleNamespace(rank=0), item, rep, None, setup_verdict(headline))
        assert (rep.outcome, rep.longrepr) == ("failed", shown)
