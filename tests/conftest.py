"""Helpers for testing the plugin through real inner pytest sessions (pytester)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest
from memcg_support import small_memory_cgroup  # noqa: F401 (a fixture: tests of the OOM killer's kills)
from spmd_support import launch  # noqa: F401 (a fixture: pytest under torchrun, SPMD mode)

# The inner sessions write gate reports: on GitHub Actions they would land in the real job summary
# (a test of the summary sets its own). Removed at import, so every subprocess inherits it too.
os.environ.pop("GITHUB_STEP_SUMMARY", None)
# and their failures would be annotations of this repository's run, their output not what a user's
# sees off GitHub (tests/test_github.py sets its own)
os.environ.pop("GITHUB_ACTIONS", None)

INNER_TIMEOUT = 240  # an inner session that takes longer than this is itself a hang


@dataclass
class Inner:
    result: pytest.RunResult
    elapsed: float
    tag: str

    @property
    def text(self) -> str:
        return self.result.stdout.str() + "\n" + self.result.stderr.str()

    def section(self, test_name: str) -> str:
        """The failure section of one test in the inner session's output."""
        lines = self.result.stdout.lines
        start = next((i for i, line in enumerate(lines) if line.startswith("_") and f" {test_name} " in line), None)
        if start is None:
            return ""
        end = next((i for i in range(start + 1, len(lines))
                    if (lines[i].startswith("___") or lines[i].startswith("===")) ), len(lines))
        return "\n".join(lines[start:end])

    def headline(self, test_name: str) -> str:
        """The failure's headline: its report's first line less the exception class it starts with
        ('CollectiveMismatch: shape mismatch in ...')."""
        lines = self.section(test_name).splitlines()
        first = lines[1] if len(lines) > 1 else ""
        return re.sub(r"^[A-Z]\w*: ", "", first, count=1)


def line_of(source: str, snippet: str) -> int:
    """1-based line of ``snippet`` in the module that ``run_inner`` writes from ``source``."""
    lines = textwrap.dedent(source).lstrip("\n").splitlines()
    return next(i for i, line in enumerate(lines, 1) if snippet in line)


def processes_with_tag(tag: str) -> list[str]:
    """Live processes whose environment carries the tag: the inner session's fork server, ranks and
    anything they started. Zombies count as gone."""
    found = []
    needle = f"PYTEST_NCCL_TEST_TAG={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid}: {cmdline}")
        except OSError:
            continue
    return found


def assert_no_leftovers(tag: str, wait: float = 3.0) -> None:
    deadline = time.monotonic() + wait
    left = processes_with_tag(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_with_tag(tag)
    if left:
        kill_tagged(tag)  # the test fails, and what it left does not outlive it
    assert not left, f"processes outlived the inner session: {left}"


def kill_tagged(tag: str) -> None:
    """SIGKILL every live process carrying the tag (a failed test's inner session, its launcher's
    ranks in their own sessions, anything they started)."""
    for entry in processes_with_tag(tag):
        try:
            os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture
def run_inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Write ``source`` as a test module, run a real inner pytest in a subprocess, return Inner.
    Afterwards, no process of that inner session may be alive."""
    tags = []

    def run(source: str, *args: str, name: str = "test_inner", timeout: float = INNER_TIMEOUT) -> Inner:
        tag = uuid.uuid4().hex
        tags.append(tag)
        monkeypatch.setenv("PYTEST_NCCL_TEST_TAG", tag)
        pytester.makepyfile(**{name: textwrap.dedent(source)})
        t0 = time.monotonic()
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args, timeout=timeout)
        inner = Inner(result, time.monotonic() - t0, tag)
        assert_no_leftovers(tag)
        return inner

    yield run
    for tag in tags:
        assert_no_leftovers(tag, wait=0.5)


def run_inner_once(tmp_path_factory, source: str, *args: str, name: str = "test_inner",
                   timeout: float = INNER_TIMEOUT) -> Inner:
    """As ``run_inner``, for a module-scoped fixture: one inner session whose outcome several tests
    check, one scenario each (so a failure names its scenario, and start-up is paid once)."""
    directory = tmp_path_factory.mktemp(name)
    (directory / f"{name}.py").write_text(textwrap.dedent(source).lstrip("\n"))  # as pytester writes it
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTEST_NCCL_TEST_TAG=tag)
    env.pop("PYTEST_ADDOPTS", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - t0
    result = pytest.RunResult(proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines(), elapsed)
    assert_no_leftovers(tag)
    return Inner(result, elapsed, tag)


def run_scenarios(tmp_path_factory, source: str, *args: str) -> tuple[Inner, dict, dict]:
    """One inner session of scenarios (``run_inner_once``), with what each test's JUnit properties
    say ((test, property) -> value: ``nccl_diagnosis``, ``nccl_exception``) and each call's duration
    (test -> seconds)."""
    junit_path = tmp_path_factory.mktemp("junit") / "junit.xml"
    inner = run_inner_once(tmp_path_factory, source, *args, f"--junitxml={junit_path}", "--durations=0",
                           "--durations-min=0", name="test_inner")
    junit = ET.parse(junit_path).getroot()
    props = {(case.get("name"), p.get("name")): p.get("value")
             for case in junit.iter("testcase") for p in case.iter("property")}
    durations = {m.group(2): float(m.group(1)) for line in inner.result.stdout.lines
                 for m in [re.match(r"\s*([\d.]+)s call\s+test_inner.py::(\w+)", line)] if m}
    return inner, props, durations


def run_fresh(code: str, timeout: float = 180) -> str:
    """``code`` in a fresh interpreter (installing the tracer patches torch.distributed for the whole
    process), without the launched-ranks hook this test's children get (docs/launched.md: it would
    install the tracer at torch's import, before the code under test does); its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
