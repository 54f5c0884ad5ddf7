"""What the suites share: ``expect_diagnosis`` on a test's world (suites/zero has its own, without
the call site)."""

from __future__ import annotations

import functools

import pytest

from pytest_nccl.testing.expect import expect_diagnosis as expect


@pytest.fixture
def expect_diagnosis(nccl_world):
    """``expect_diagnosis(fn, *args, exc=..., op=REGEX, rank=N or {N, ...}, site=REGEX)`` on this
    test's world (``pytest_nccl.testing.expect_diagnosis``)."""
    return functools.partial(expect, nccl_world)
