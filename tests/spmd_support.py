"""Running a pytest session under torchrun (SPMD mode) for the tests: ``launch`` writes a test module
and runs it under one or several real torchrun launchers on localhost, bounded in time, after which
no process carrying the run's tag may be alive (tests/test_spmd.py, tests/test_spmd_endings.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass

import pytest

LAUNCH_TIMEOUT = 150  # one torchrun run; longer is itself a hang
# what an outer launcher or session could leak into the inner runs
DROP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "ROLE_RANK", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")


@dataclass
class Launched:
    outputs: list[str]     # per launcher: its stdout and stderr (torchrun passes the ranks' through)
    codes: list[int]
    elapsed: float
    tag: str

    @property
    def text(self) -> str:
        return "\n".join(self.outputs)

    @property
    def reported_once_text(self) -> str:
        """All output but the short test summary, whose lines repeat a headline in full where pytest
        does not truncate them (CI=true)."""
        return "\n".join(line for line in self.text.splitlines() if not line.startswith(("FAILED ", "ERROR ")))

    @property
    def report(self) -> str:
        """The output of the launcher that printed the session (rank 0's)."""
        reports = [o for o in self.outputs if "test session starts" in o]
        assert len(reports) == 1, self.text
        return reports[0]

    def section(self, test_name: str) -> str:
        lines = self.report.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("_") and f" {test_name} " in line), None)
        if start is None:
            return ""
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("___", "==="))), len(lines))
        return "\n".join(lines[start:end])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def launch(pytester: pytest.Pytester):
    """Write ``source`` as test_inner.py and run it under torchrun: ``nodes`` launchers of ``nproc``
    ranks each. Afterwards no process of the run (tagged through the environment, which torchrun's
    ranks inherit) may be alive."""
    from conftest import assert_no_leftovers  # here: conftest imports this module for the fixture

    tags = []

    def run(source: str, *args: str, nodes: int = 1, nproc: int = 2, files: dict | None = None) -> Launched:
        tag = uuid.uuid4().hex
        tags.append(tag)
        if source:
            pytester.makepyfile(test_inner=textwrap.dedent(source))
        for name, text in (files or {}).items():
            pytester.makepyfile(**{name: textwrap.dedent(text)})
        env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and not k.startswith("TORCHELASTIC_")}
        env.update(PYTEST_NCCL_TEST_TAG=tag, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        port = _free_port()
        runner = [sys.executable, "-m", "torch.distributed.run"]
        if nodes == 1:
            runner += [f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}"]
        else:
            runner += [f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={tag}"]
        command = runner + ["-m", "pytest", "-p", "no:cacheprovider", "-rA", *args]
        t0 = time.monotonic()
        procs = [subprocess.Popen(command, cwd=pytester.path, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True) for _ in range(nodes)]
        outputs, codes = [], []
        try:
            for proc in procs:
                out, _ = proc.communicate(timeout=max(1.0, LAUNCH_TIMEOUT - (time.monotonic() - t0)))
                outputs.append(out)
                codes.append(proc.returncode)
        except subprocess.TimeoutExpired:
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            pytest.fail(f"torchrun did not finish within {LAUNCH_TIMEOUT} s:\n"
                        + "\n".join(p.communicate()[0] or "" for p in procs))
        launched = Launched(outputs, codes, time.monotonic() - t0, tag)
        assert_no_leftovers(tag, wait=5.0)
        return launched

    yield run
    for tag in tags:
        assert_no_leftovers(tag, wait=0.5)
