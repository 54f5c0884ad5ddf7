"""CI: the project's tests never write into the real GitHub job summary (the inner sessions they start
write gate reports, and $GITHUB_STEP_SUMMARY would carry them into the job's page: tests/conftest.py
removes it; a test that checks the summary sets its own); the workflow writes the gate report once;
every install on a hosted runner gets PyTorch's CPU index; the workflow's matrix runs the ends of the
support range that pyproject.toml and the README state."""

import os
import re
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


ROOT = HERE.parents[1]


def test_the_workflow_leaves_the_summary_to_the_plugin():
    """--nccl-report appends the gate report to the job summary itself: a step that appends it too
    writes it twice."""
    text = (ROOT / ".github/workflows/ci.yml").read_text()
    assert not re.search(r">>\s*\"?\$\{?GITHUB_STEP_SUMMARY", text)


def pip_installs(text: str) -> list[str]:
    """Each pip install command of a shell script or workflow, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines()
            if re.search(r"\bpip install\b|^\s*quiet_pip ", line) and not line.strip().startswith("#")
            and "quiet_pip()" not in line]


@pytest.mark.parametrize("path", [".ci/run", ".ci/stacks_lib.sh"])
def test_every_install_of_the_ci_scripts_gets_the_cpu_index(path):
    installs = pip_installs((ROOT / path).read_text())
    assert installs
    for command in installs:
        assert "TORCH_INDEX_URL" in command, f"{path}: {command}"


def test_every_install_of_the_hosted_jobs_gets_the_cpu_index():
    text = (ROOT / ".github/workflows/ci.yml").read_text()
    hosted = text[:text.index("\n  gpu:")]
    assert "TORCH_INDEX_URL: https://download.pytorch.org/whl/cpu" in hosted
    for command in pip_installs(hosted):
        assert "$TORCH_INDEX_URL" in command, command


def test_the_workflow_runs_the_ends_of_the_stated_support_range():
    from pytest_nccl.bisect import tomlcompat

    project = tomlcompat.loads((ROOT / "pyproject.toml").read_text())["project"]
    pythons = sorted(c.rsplit(" ", 1)[-1] for c in project["classifiers"]
                     if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    pythons.sort(key=lambda v: tuple(map(int, v.split("."))))
    pytest_floor = next(r for r in project["dependencies"] if r.startswith("pytest"))
    torch_floor = project["optional-dependencies"]["torch"][0]
    workflow = (ROOT / ".github/workflows/ci.yml").read_text()
    floor = re.search(r"name: floor, python: \"([\d.]+)\", pytest: \"pytest==([\d.]+)\", torch: \"torch==([\d.]+)\"",
                      workflow)
    assert floor, "the workflow has no floor job"
    assert floor.group(1) == pythons[0] == project["requires-python"].removeprefix(">=")
    assert pytest_floor == "pytest>=" + ".".join(floor.group(2).split(".")[:2])
    assert torch_floor == "torch>=" + ".".join(floor.group(3).split(".")[:2])
    assert re.search(rf"name: newest, python: \"{re.escape(pythons[-1])}\", pytest: \"pytest\", torch: \"torch\"",
                     workflow)
    readme = (ROOT / "README.md").read_text()
    assert (f"Python {pythons[0]}–{pythons[-1]}, pytest {floor.group(2).rsplit('.', 1)[0]} and newer, "
            f"torch {floor.group(3).rsplit('.', 1)[0]} to ") in readme
