"""Modern-stack suite: DTensor tensor parallelism, FSDP2 checkpoints and micro-batches, a weight-sync
side group, torch.compile, on N CPU ranks (gloo) at any ``--nccl-world``. Run:
``pytest --nccl-world=2 suites/modern`` (see README.md).

``expect_diagnosis`` runs a hanging form on every rank through ``nccl_world`` and requires the
exception class and a headline that names the collective, exactly the diverging rank(s) in one
mention, and the ``file:line`` of the diverging call.
"""

from __future__ import annotations

import functools

import pytest

from pytest_nccl.testing import hf_offline_env
from pytest_nccl.testing.expect import expect_diagnosis as expect

hf_offline_env()

def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout absent: the plugin still reads it
        config.addinivalue_line("markers", "timeout(seconds): bound for a test (read by pytest-nccl)")


@pytest.fixture
def expect_diagnosis(nccl_world):
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N or {N, ...}, site=REGEX)`` on this
    test's world (``pytest_nccl.testing.expect_diagnosis``)."""
    return functools.partial(expect, nccl_world)
