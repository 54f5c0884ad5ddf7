"""Running real jobs under ``pytest-nccl watch`` in the tests: one bounded ``python -m pytest_nccl
watch`` process per job, its environment tagged so that every process of the job (the launcher, its
ranks, a Ray cluster's daemons) can be found afterwards; none may be left."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import assert_no_leftovers

from pytest_nccl.testing import HF_OFFLINE_ENV as HF_OFFLINE  # noqa: F401 (the jobs' environment)

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "watch"
JOB_TIMEOUT = 120  # one watched job; longer is itself a hang
DROP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "ROLE_RANK", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
            "SLURM_PROCID", "SLURM_NTASKS", "PYTEST_NCCL_WATCH_DIR", "PYTEST_NCCL_WATCH_PKG")
# a tiny model and a dataset into argv[1] (``write_sft_inputs``), by the interpreter of the release
# that will read them; every row another length: each rank pads its batch to its own
FIXTURES = ("import sys; from pytest_nccl.testing import write_sft_inputs; "
            "write_sft_inputs(sys.argv[1], [3 + 2 * i for i in range(16)])")


@dataclass
class Watched:
    code: int
    stdout: str
    stderr: str
    elapsed: float
    tag: str
    summary: dict | None

    @property
    def text(self) -> str:
        return self.stdout + "\n" + self.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inherited_pythonpath(python: str = sys.executable) -> list[str]:
    """This interpreter's own PYTHONPATH entries, for children that run it: where packages are installed
    on PYTHONPATH (``pip install --target``, as on a GPU host that carries wheels) the job needs them.
    None for another interpreter (a release stack's venv), whose packages they would shadow."""
    if python != sys.executable:
        return []
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def job_env(tag: str, pythonpath: list | None = None, inherit_pythonpath: bool = True, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and not k.startswith("TORCHELASTIC_")}
    paths = [str(p) for p in (pythonpath or [])] + [str(REPO)]
    if inherit_pythonpath:
        paths += [p for p in inherited_pythonpath() if p not in paths]
    # CPU jobs: on a GPU host, accelerate and transformers would put rank 1 on cuda:1, which a one-GPU
    # host lacks ("invalid device ordinal" in accelerate's barrier, seen on an H200)
    env.update(PYTEST_NCCL_TEST_TAG=tag, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(paths))
    env.update(extra)  # a job on the GPU names CUDA_VISIBLE_DEVICES here
    # the launchers the tests name (torchrun, accelerate, deepspeed) from this interpreter's environment
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def run_watch(tmp_path: Path, launch: list, *watch_args: str, pythonpath: list | None = None,
              timeout: float = JOB_TIMEOUT, python: str = sys.executable, inherit_pythonpath: bool = True,
              **env) -> Watched:
    """``python -m pytest_nccl watch [watch_args] --json F -- launch...`` in ``tmp_path``. ``python``
    runs the watch; the launch command names its own interpreter (``inherit_pythonpath=False`` when it
    is another one than this test's: see ``inherited_pythonpath``)."""
    tag = uuid.uuid4().hex
    summary_path = tmp_path / f"verdict-{tag[:8]}.json"
    command = [python, "-m", "pytest_nccl", "watch", *watch_args, "--json", str(summary_path), "--", *launch]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=tmp_path, env=job_env(tag, pythonpath, inherit_pythonpath, **env),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        assert_no_leftovers(tag, wait=30.0)
        pytest.fail(f"the watch did not finish within {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    elapsed = time.monotonic() - t0
    assert_no_leftovers(tag, wait=15.0)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return Watched(proc.returncode, proc.stdout, proc.stderr, elapsed, tag, summary)


def torchrun(*args: str, nproc: int = 2, python: str = sys.executable) -> list:
    return [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", *args]


def line_in(path: Path, snippet: str) -> int:
    """1-based line of ``snippet`` in a job script."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if snippet in line)


def verdict_ok(run: Watched, timeout: float) -> None:
    """A verdict: exit 3, the launcher's own status kept in --json, decided within --timeout + 10 s
    of the first group."""
    assert run.code == 3, run.text
    s = run.summary
    assert s is not None and s["verdict"] and s["exit_code"] == 3, run.text
    assert s["elapsed_s"] is not None and s["elapsed_s"] <= timeout + 10, s


def untouched(run: Watched, ranks: int = 2) -> None:
    """A healthy job: its own exit status, no report, and every rank was watched."""
    assert run.code == 0, run.text
    assert "=====" not in run.stderr and "diagnosed" not in run.stderr, run.stderr
    s = run.summary
    assert s is not None and not s["verdict"] and s["exit_code"] == 0 == s["job_exit_code"], run.text
    assert len(s["watched"]) == ranks and all(n > 0 for n in s["watched"].values()), s


class Running:
    """``python -m pytest_nccl watch --timeout 300 ... -- LAUNCH...`` running, its stderr read line by
    line as it comes (each line with the time it came), to be signalled (tests/test_watch_endings.py).
    A job that touches ``$ENDINGS_READY.R`` once ready (R: its rank) is waited for by ``wait_ready``."""

    def __init__(self, tmp_path: Path, launch: list, *watch_args: str, ready: Path | None = None,
                 env: dict | None = None):
        self.tag = uuid.uuid4().hex
        self.ready = ready or tmp_path / "ready"
        self.summary = tmp_path / "summary.json"
        environ = job_env(self.tag, ENDINGS_READY=str(self.ready), **(env or {}))
        command = [sys.executable, "-m", "pytest_nccl", "watch", "--timeout", "300", *watch_args,
                   "--json", str(self.summary), "--", *launch]
        self.proc = subprocess.Popen(command, cwd=tmp_path, env=environ, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for text in self.proc.stderr:
            self.lines.append((time.monotonic(), text))

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.lines)

    def wait_ready(self, ranks: int = 2, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(Path(f"{self.ready}.{r}").exists() for r in range(ranks)):
            assert self.proc.poll() is None, f"the watch ended first:\n{self.text}"
            assert time.monotonic() < deadline, f"the ranks never got ready:\n{self.text}"
            time.sleep(0.1)
        time.sleep(1.0)  # rank 0 into its 4th all_reduce, rank 1 into its sleep

    def first(self, snippet: str, after: float = 0.0) -> float | None:
        """When the first line holding ``snippet`` came (after ``after``), None if none did."""
        return next((t for t, text in self.lines if snippet in text and t >= after), None)

    def end(self, timeout: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the watch outlived its signal by {timeout} s:\n{self.text}")
        self.reader.join(10)
        assert_no_leftovers(self.tag, wait=15.0)
        return code
