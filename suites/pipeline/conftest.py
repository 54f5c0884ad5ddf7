"""Pipeline suite: point-to-point hang and corruption classes of pipeline parallelism, on megatron-core's
own ``P2PCommunicator`` and torch.distributed.pipelining, on N CPU ranks (gloo), at any
``--nccl-world``. Run: ``pytest --nccl-world=2 suites/pipeline`` (see README.md).

``expect_diagnosis`` runs a failing form on every rank through ``nccl_world`` and requires the
exception class and a headline that names the p2p ops, the rank(s) and the ``file:line`` of the call.
"""

from __future__ import annotations

import functools

import pytest

from pytest_nccl.testing.expect import expect_diagnosis as expect


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout absent: the plugin still reads it
        config.addinivalue_line("markers", "timeout(seconds): bound for a test (read by pytest-nccl)")


@pytest.fixture
def expect_diagnosis(nccl_world):
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N or {N, ...}, site=REGEX)`` on this
    test's world (``pytest_nccl.testing.expect_diagnosis``)."""
    return functools.partial(expect, nccl_world)
