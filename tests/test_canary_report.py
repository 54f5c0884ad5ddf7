"""The canary's drift report (.ci/canary.py): a test a newer release kept from setting up is said,
and the verdict is not green."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from pytest_nccl.testing.releases import setup_break

CANARY = Path(__file__).parent.parent / ".ci" / "canary.py"


@pytest.fixture(scope="module")
def canary():
    if not CANARY.exists():
        pytest.skip("no .ci/canary.py beside these tests (an installed copy)")
    spec = importlib.util.spec_from_file_location("canary", CANARY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def junit(tmp_path, skipped_message: str) -> Path:
    path = tmp_path / "junit.xml"
    skip = '<skipped type="pytest.skip" message={}/>'
    path.write_text(f"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="suites.trl.test_sft" name="test_sft_uneven">{skip.format(quoteattr(skipped_message))}</testcase>
<testcase classname="suites.trl.test_sft" name="test_sft_baseline"/>
<testcase classname="suites.zero.test_x" name="test_no_ds">{skip.format(quoteattr("no deepspeed"))}</testcase>
</testsuite></testsuites>""")
    return path


def test_a_setup_broken_by_a_newer_release_is_reported_and_not_green(canary, tmp_path):
    reason = setup_break("SFTConfig", TypeError("unexpected keyword argument 'max_length'"), {"trl": "9.0.0"})
    path = junit(tmp_path, reason)
    unjudged = canary.unjudged_tests(canary.junit_cases(path))
    assert unjudged == [f"suites.trl.test_sft::test_sft_uneven: {reason}"]
    run = canary.Run("suites at world 2", ["suites/"], rc=0, unjudged=unjudged)
    probe = canary.Run("bare PartialState", [], rc=1)
    text = canary.report("2026-12-06", {"trl": "1.16.0"}, {"trl": "9.0.0"}, {}, [run], probe, [])
    assert "## Verdict: the suites cannot set up on the newest releases" in text
    assert f"- set-up broke (skipped): suites.trl.test_sft::test_sft_uneven: {reason}" in text


def test_other_skips_are_not_drift(canary, tmp_path):
    path = junit(tmp_path, "trl has no such trainer")
    assert canary.unjudged_tests(canary.junit_cases(path)) == []
    run = canary.Run("suites at world 2", ["suites/"], rc=0)
    text = canary.report("2026-12-06", {}, {}, {}, [run], canary.Run("bare PartialState", [], rc=1), [])
    assert "## Verdict: green with the newest releases" in text
