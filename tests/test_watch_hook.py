"""The watch's start-up hook on real processes: it sees torch's import however it happens, a process
becomes a rank when it creates a default group whatever gave it its rank and world, and a process
that never does stays idle. Each case is one Python process run with the hook as the watch sets it
up (its directory first on PYTHONPATH, the job directory in the environment), without the watch;
its files in the job directory say what the hook did. Then bad input through the real watch: a
command that is not a distributed job, a job that never creates a group, peers that never appear."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import assert_no_leftovers
from watch_support import JOBS, REPO, free_port, job_env, line_in, run_watch

from pytest_nccl.core import jobdir
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import RankState
from pytest_nccl.watch.engine.control import STARTUP_DIR

HOOK_TIMEOUT = 120


def hooked(tmp_path: Path, argv: list, pythonpath: list | None = None, cwd: Path | None = None,
           name: str = "job") -> tuple[dict, Path]:
    """Run one process with the hook; (its JSON line, the job directory)."""
    directory = tmp_path / name
    directory.mkdir()
    tag = uuid.uuid4().hex
    env = job_env(tag, pythonpath, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR, env["PYTHONPATH"]])
    env.update({jobdir.ENV_DIR: str(directory), jobdir.ENV_PKG: str(REPO)})
    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd or tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=HOOK_TIMEOUT)
    except subprocess.TimeoutExpired:
        # the hook's faulthandler writes every thread's stack to the job directory on SIGABRT: a
        # process that does not end says where it waits (one did, on CI, after its last line)
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate()
        stacks = "\n".join(p.read_text() for p in directory.rglob("fatal-*.txt"))
        pytest.fail(f"the process did not end within {HOOK_TIMEOUT} s; its threads:\n{stacks}\n{err}\n{out}")
    assert_no_leftovers(tag)
    assert proc.returncode == 0, err
    assert "pytest-nccl watch" not in err, err  # no warning from the hook
    return json.loads(out.strip().splitlines()[-1]), directory


def _lazy_loader_imports_torch() -> bool:
    """Whether importlib's LazyLoader can import torch here at all, without the hook."""
    probe = ("import importlib.util, sys; spec = importlib.util.find_spec('torch'); "
             "spec.loader = importlib.util.LazyLoader(spec.loader); m = importlib.util.module_from_spec(spec); "
             "sys.modules['torch'] = m; spec.loader.exec_module(m); m.ones(1)")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=HOOK_TIMEOUT).returncode == 0


def assert_rank(directory: Path) -> None:
    info = json.loads((directory / "rank-0.json").read_text())
    assert info["rank"] == 0 and info["world"] == 1 and info["backend"] == "gloo", info
    assert "\tall_reduce\t" in (directory / "journal-0.txt").read_text()
    assert RankReport.from_json((directory / "exit-0.json").read_text()).state == RankState.PASSED


@pytest.mark.parametrize("how, group", [
    ("import", "env"),
    ("probe", "args-url"),            # find_spec("torch") first: the finder must stay armed
    ("import_module", "store"),
    ("lazy", "store"),
])
def test_every_import_of_torch_and_every_way_to_a_group(tmp_path, how, group):
    if how == "lazy" and not _lazy_loader_imports_torch():
        pytest.skip("this Python's LazyLoader cannot import torch even without the hook (CPython 3.12's "
                    "_LazyModule.__delattr__ recurses on the delattr torch/__init__.py does)")
    seen, directory = hooked(tmp_path, [str(JOBS / "hook_job.py"), how, group, str(free_port())])
    assert seen["traced"] is True, seen
    assert_rank(directory)


@pytest.mark.parametrize("library", ["transformers", "datasets"])
def test_a_script_whose_first_import_is_a_hugging_face_library(tmp_path, library):
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed")
    seen, directory = hooked(tmp_path, [str(JOBS / "hook_job.py"), library, "store"])
    assert seen["traced"] is True, seen
    assert_rank(directory)


def test_torch_imported_by_a_chained_sitecustomize(tmp_path):
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import torch  # the user's start-up code\nUSER_MARK = 1\n")
    seen, directory = hooked(tmp_path, [str(JOBS / "hook_job.py"), "chained", "store"], pythonpath=[user])
    assert seen["traced"] is True, seen
    assert_rank(directory)


def test_a_second_install_of_pytest_nccl_on_the_path(tmp_path):
    """A GPU host with a 'pip install --target' copy beside a checkout: both copies' start-up hooks are
    on a launched job's PYTHONPATH (the outer session's and the inner one's). Each ran the other as the
    sitecustomize it shadows, and their torch finders asked each other: RecursionError at start-up and
    at 'import torch' (seen on an H200). The user's own sitecustomize behind both still runs once."""
    other = tmp_path / "site" / "pytest_nccl" / "watch" / "inrank" / "startup"
    other.mkdir(parents=True)
    (other / "sitecustomize.py").write_text((Path(STARTUP_DIR) / "sitecustomize.py").read_text())
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import torch  # the user's start-up code\nUSER_MARK = 1\n")
    seen, directory = hooked(tmp_path, [str(JOBS / "hook_job.py"), "chained", "store"], pythonpath=[other, user])
    assert seen["traced"] is True, seen
    assert_rank(directory)


def test_run_with_dash_m_and_dash_c(tmp_path):
    seen, directory = hooked(tmp_path, ["-m", "hook_job", "import", "store"], cwd=JOBS)
    assert seen["traced"] is True
    assert_rank(directory)
    code = textwrap.dedent("""
        import json, torch, torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.all_reduce(torch.ones(1))
        print(json.dumps({"traced": getattr(dist.all_reduce, "_pytest_nccl_traced", False)}))
    """)
    seen, directory = hooked(tmp_path, ["-c", code], name="dash-c")
    assert seen["traced"] is True
    assert_rank(directory)


def test_idle_processes_stay_idle(tmp_path):
    """A process that imports torch but creates no group (a launcher, a DataLoader worker) is no
    rank; one that never imports torch loads nothing of ours."""
    seen, directory = hooked(tmp_path, [str(JOBS / "hook_job.py"), "import", "loader-workers"])
    assert_rank(directory)  # the process that created the group
    assert [p.name for p in directory.glob("rank-*.json")] == ["rank-0.json"]
    assert len(list(directory.glob("torch-*"))) == 3  # it and its 2 workers imported torch
    seen, directory = hooked(tmp_path, name="no-torch", argv=["-c", (
        "import json, sys; print(json.dumps({'ours': sorted(m for m in sys.modules if m.startswith('pytest_nccl')), "
        "'finders': [type(f).__name__ for f in sys.meta_path]}))")])
    assert seen["ours"] == [] and seen["finders"][0] == "_TorchFinder", seen
    assert not list(directory.iterdir())


# -- bad input, through the watch: one line each, the launcher's status kept, nothing left running ---

def test_a_job_that_never_creates_a_group(tmp_path):
    # each rank exits only once both imported torch: else torchrun may end the other before its import
    # (a fast host: seen on a 16-core one, "2 processes imported torch")
    (tmp_path / "nogroup.py").write_text(textwrap.dedent("""\
        import os, pathlib, sys, time, torch
        pathlib.Path(f"imported-{os.environ['LOCAL_RANK']}").touch()
        while not all(pathlib.Path(f"imported-{r}").exists() for r in (0, 1)):
            time.sleep(0.05)
        print(torch.ones(1).sum().item())
        sys.exit(5)
        """))
    run = run_watch(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                               "--master-addr=127.0.0.1", f"--master-port={free_port()}", "nogroup.py"])
    assert run.code != 3 and run.code == run.summary["job_exit_code"] != 0, run.text
    ours = [line for line in run.stderr.splitlines()
            if line.startswith("pytest-nccl watch: ") and "watching" not in line]
    assert ours == ["pytest-nccl watch: no rank reported: 3 processes imported torch, none created a default "
                    "process group (it ended before init_process_group, or never called it)"], run.stderr


def test_peers_that_never_appear_in_init_process_group(tmp_path):
    """Rank 0 of a world of 2 alone: it waits in init_process_group; after --timeout the watch says
    which ranks never joined and ends it."""
    (tmp_path / "alone.py").write_text(
        "import torch.distributed as dist\ndist.init_process_group('gloo')  # waits for rank 1\n")
    run = run_watch(tmp_path, [sys.executable, "alone.py"], "--timeout", "5", RANK="0", WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    line = line_in(tmp_path / "alone.py", "# waits for rank 1")
    assert ("pytest-nccl watch: peers never appeared: rank 0 (pid ") in run.stderr, run.stderr
    assert (f"waited 5 s (--timeout) in init_process_group at alone.py:{line}; rank 1 of 2 never joined "
            "(a node or process that never started, or another MASTER_ADDR/MASTER_PORT); ending the job") in run.stderr
    assert run.code != 3 and run.code == run.summary["job_exit_code"] and run.summary["peers_missing"], run.text
    # --timeout, and a loaded runner's start of the job (init_process_group's own wait is 30 min)
    assert run.elapsed < 5 + 60, run.elapsed


def test_a_node_whose_peers_never_appear(tmp_path):
    """torchrun node 0 of 2, node 1 never started: torchrun's agent waits in its rendezvous (no
    worker exists yet)."""
    (tmp_path / "node.py").write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    run = run_watch(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=0",
                               "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                               "node.py"], "--timeout", "5")
    assert ("pytest-nccl watch: peers never appeared: the launcher (pid ") in run.stderr, run.stderr
    assert ("waited 5 s (--timeout) in its rendezvous as node 0 of 2; node 1 of 2 never joined") in run.stderr
    assert run.code != 3 and run.code == run.summary["job_exit_code"], run.text
