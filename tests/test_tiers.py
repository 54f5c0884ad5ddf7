"""The test tiers (tests/conftest.py): every collected test lands in exactly one of fast, groups and
jobs, by what it starts; the fast tier imports no torch and starts no process but pytest's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TIERS, run_inner_once, tier_of
from watch_support import run_watch

REPO = Path(__file__).resolve().parents[1]


def _session(tmp_path: Path, *args: str) -> dict:
    """This repository's own tests in a pytest subprocess; what conftest.py reported of it."""
    report = tmp_path / "tiers.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTEST_NCCL_TIERS_REPORT"] = str(report)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode in (0, 1) and report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(report.read_text())


def test_every_test_lands_in_exactly_one_tier(tmp_path):
    tiers = _session(tmp_path, "--collect-only")["tiers"]
    wrong = {nodeid: marks for nodeid, marks in tiers.items() if len(marks) != 1 or marks[0] not in TIERS}
    assert not wrong, wrong
    assert {marks[0] for marks in tiers.values()} == set(TIERS)


def test_the_fast_tier_imports_no_torch_and_starts_no_process(tmp_path):
    """``pytest -m fast`` as a contributor runs it: torch never imported (collection included), and
    no fast test started a process (the guard in conftest.py names any that did)."""
    report = _session(tmp_path, "-m", "fast")
    assert ["fast"] in report["tiers"].values()
    assert report["started"] == {}, report["started"]
    assert not report["torch"], "the fast tier imported torch"


# What the rule reads: functions of tests/ a test calls (never run here)
def _sorts():
    return sorted([3, 1, 2])


def _starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _imports_torch():
    import torch
    return torch.ones(1)


def _inner_session(tmp_path_factory):
    return run_inner_once(tmp_path_factory, "def test_x(): pass")


def _watches_a_job(tmp_path):
    return run_watch(tmp_path, [sys.executable, "-c", "pass"])


def _runs_a_launcher():
    subprocess.run(["torchrun", "--nproc-per-node=2", "job.py"], check=True)


@pytest.mark.parametrize("function, tier", [
    (_sorts, "fast"), (_starts_a_process, "groups"), (_imports_torch, "groups"), (_inner_session, "groups"),
    (_watches_a_job, "jobs"), (_runs_a_launcher, "jobs")])
def test_a_test_s_tier_follows_from_what_its_code_starts(function, tier):
    item = SimpleNamespace(module=None, _fixtureinfo=None, function=function)
    assert tier_of(item) == tier
