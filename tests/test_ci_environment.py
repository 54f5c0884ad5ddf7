"""The project's tests never write into the real GitHub job summary: the inner sessions they start
write gate reports, and $GITHUB_STEP_SUMMARY would carry them into the job's page (tests/conftest.py
removes it; a test that checks the summary sets its own)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


def test_the_test_environment_has_no_step_summary():
    assert "GITHUB_STEP_SUMMARY" not in os.environ


def test_a_session_of_these_tests_leaves_the_real_summary_alone(tmp_path):
    summary = tmp_path / "summary.md"
    env = dict(os.environ, GITHUB_STEP_SUMMARY=str(summary))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{HERE}::test_the_test_environment_has_no_step_summary"],
                          cwd=HERE.parents[1], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not summary.exists()


@pytest.mark.parametrize("path", [".github/workflows/ci.yml"])
def test_the_workflow_leaves_the_summary_to_the_plugin(path):
    """--nccl-report appends the gate report to the job summary itself: a step that appends it too
    writes it twice."""
    text = (HERE.parents[1] / path).read_text()
    assert "GITHUB_STEP_SUMMARY" not in text
