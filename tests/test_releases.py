"""A newer release that breaks a suite's set-up skips with the reason; a known release's break fails
(``pytest_nccl.testing.releases``), and the releases known are CI's pins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_nccl.testing import releases
from pytest_nccl.testing.releases import TESTED_THROUGH, library_setup, newer_than_tested, setup_break

CONSTRAINTS = Path(__file__).parent.parent / ".ci" / "constraints.txt"
KNOWN = {"trl": "1.16.0"}


@pytest.mark.parametrize(("version", "newer"), [
    ("1.17.0", True), ("2.0", True), ("1.17.0rc1", True), ("1.16.1", True), ("main", True),
    ("1.16.0", False), ("1.16.0.dev0", False), ("1.16.0+local", False), ("1.15.2", False), ("0.19.1", False),
])
def test_newer_than_tested(version, newer):
    assert newer_than_tested("trl", version, KNOWN) is newer


def test_a_package_the_suites_do_not_track_is_never_newer():
    assert not newer_than_tested("tokenizers", "99.0", KNOWN)


def test_the_reason_names_the_release_and_what_it_raised():
    exc = TypeError("SFTConfig.__init__() got an unexpected keyword argument 'max_length'\nmore")
    reason = setup_break("SFTConfig", exc, {"trl": "1.17.0", "transformers": "5.25.0", "datasets": None}, KNOWN)
    assert reason == ("SFTConfig: the set-up broke on trl 1.17.0 (tested through 1.16.0), newer than the suites "
                      "know: TypeError: SFTConfig.__init__() got an unexpected keyword argument 'max_length' "
                      "(a setup change, not the bug under test: docs/support.md)")


def test_a_known_release_breaking_is_no_skip():
    assert setup_break("SFTConfig", TypeError("x"), {"trl": "1.16.0", "datasets": None}, KNOWN) is None


def test_library_setup_skips_on_a_newer_release_and_raises_on_a_known_one(monkeypatch):
    monkeypatch.setattr(releases, "installed_version", lambda p: {"trl": "1.17.0"}.get(p))
    with pytest.raises(pytest.skip.Exception, match=r"trl 1\.17\.0 \(tested through .*ValueError: bad"):
        with library_setup("a trainer", "trl"):
            raise ValueError("bad")
    monkeypatch.setattr(releases, "installed_version", lambda p: TESTED_THROUGH.get(p))
    with pytest.raises(ValueError, match="bad"):
        with library_setup("a trainer", "trl"):
            raise ValueError("bad")


def test_the_releases_known_are_cis_pins():
    """Moving a pin moves what the suites know, in the same change (docs/support.md)."""
    if not CONSTRAINTS.exists():
        pytest.skip("no .ci/constraints.txt beside these tests (an installed copy)")
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", CONSTRAINTS.read_text(), re.M))
    pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
    assert {p: pins.get(p) for p in TESTED_THROUGH} == TESTED_THROUGH
