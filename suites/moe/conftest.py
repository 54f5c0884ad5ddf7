"""MoE suite: expert-parallel dispatch and combine through megatron-core's own ``all_to_all`` (the
function its all-to-all token dispatcher calls), with routing that differs across ranks, on N CPU
ranks (gloo), at any ``--nccl-world``. Run: ``pytest --nccl-world=2 suites/moe`` (see README.md).

``expect_diagnosis`` runs a failing form on every rank through ``nccl_world`` and requires the
exception class and a headline that names the collective, the rank(s) and the ``file:line``.
"""

from __future__ import annotations

import re
import time

import pytest

import pytest_nccl

# "rank 3", "ranks 1,3", "ranks 0-2": one mention of ranks in a headline
MENTION = re.compile(r"\branks? (\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\b")


def named_rank_sets(headline: str) -> list[frozenset]:
    sets = []
    for m in MENTION.finditer(headline):
        ranks: set[int] = set()
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            ranks.update(range(int(lo), int(hi or lo) + 1))
        sets.append(frozenset(ranks))
    return sets


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout absent: the plugin still reads it
        config.addinivalue_line("markers", "timeout(seconds): bound for a test (read by pytest-nccl)")


@pytest.fixture
def expect_diagnosis(nccl_world):
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N or {N, ...}, site=REGEX)``: run ``fn``
    on every rank; it must fail as ``exc`` with a headline naming the collective (``op``), exactly
    ``rank`` in one mention, and the call site (``site``). Returns the error."""

    def check(fn, *args, exc=pytest_nccl.CollectiveMismatch, op: str, rank, site: str):
        __tracebackhide__ = True
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

    return check
