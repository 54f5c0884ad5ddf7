"""MoE suite: expert-parallel dispatch and combine through megatron-core's own ``all_to_all`` (the
function its all-to-all token dispatcher calls), with routing that differs across ranks, on N CPU
ranks (gloo), at any ``--nccl-world``. Run: ``pytest --nccl-world=2 suites/moe`` (see README.md).

``expect_diagnosis`` runs a failing form on every rank through ``nccl_world`` and requires the
exception class and a headline that names the collective, the rank(s) and the ``file:line``.
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
