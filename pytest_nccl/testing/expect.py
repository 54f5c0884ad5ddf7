"""Asserting a diagnosis in a suite: ``expect_diagnosis`` runs a failing form on every rank of a
``nccl_world`` and requires the exception class and a headline that names the collective, exactly
the diverging rank(s) in one mention, and the call site; ``expect_diagnosis_fixture`` is that call
as a suite's fixture. Imports pytest, never torch."""

from __future__ import annotations

import functools
import re
import time

import pytest

# "rank 3", "ranks 1,3", "ranks 0-2", "ranks 0,2-4": one mention of ranks in a headline
MENTION = re.compile(r"\branks? (\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\b")


def named_rank_sets(headline: str) -> list[frozenset]:
    """Every set of ranks the headline names, one per mention."""
    sets = []
    for m in MENTION.finditer(headline):
        ranks: set[int] = set()
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            ranks.update(range(int(lo), int(hi or lo) + 1))
        sets.append(frozenset(ranks))
    return sets


def expect_diagnosis(nccl_world, fn, *args, exc=None, op: str, rank, site: str):
    """Run ``fn(*args)`` on every rank of ``nccl_world``; it must fail as ``exc`` (default
    ``CollectiveMismatch``) with a headline naming the collective (``op``, a regex), exactly ``rank``
    (an int or a set) in one mention, and the call site (``site``, a regex: "test_x.py:42").
    Prints the headline with the time it took; returns the error."""
    __tracebackhide__ = True
    import pytest_nccl

    exc = exc or pytest_nccl.CollectiveMismatch
    t0 = time.monotonic()
    with pytest.raises(pytest_nccl.DistributedTestFailure) as info:
        nccl_world.run(fn, *args)
    err = info.value
    diag = err.diagnosis
    headline = diag.headline if diag is not None else str(err)
    wanted = frozenset([rank]) if isinstance(rank, int) else frozenset(rank)
    span = next((line for line in err.report.splitlines() if line.startswith("-- collective trace")), "")
    print(f"diagnosis (world {nccl_world.size}, {time.monotonic() - t0:.1f} s; {span.strip('- ')}): "
          f"{type(err).__name__} [{getattr(diag, 'kind', '?')}] {headline}")
    assert isinstance(err, exc), f"expected {exc.__name__}, got {type(err).__name__}: {headline}"
    assert re.search(op, headline), f"headline does not name /{op}/: {headline}"
    assert wanted in named_rank_sets(headline), f"headline does not name ranks {sorted(wanted)}: {headline}"
    assert re.search(site, headline), f"headline does not name the call site /{site}/: {headline}"
    return err


@pytest.fixture(name="expect_diagnosis")
def expect_diagnosis_fixture(nccl_world):
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N or {N, ...}, site=REGEX)`` on this
    test's world. A suite takes it by importing it into its conftest.py: a conftest.py in the folder
    above the suites would put that folder on ``sys.path``, where ``suites/verl`` shadows verl."""
    return functools.partial(expect_diagnosis, nccl_world)
