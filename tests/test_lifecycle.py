"""Bad input gives one clear line; no process outlives the session (pass, SIGKILL; Ctrl-C, SIGTERM and
SIGHUP: tests/test_interrupts.py);
xdist workers never collide; pytest-timeout's bound does not pre-empt ours."""

import os
import subprocess
import sys
import time
import uuid

import pytest
import torch
from conftest import assert_no_leftovers, processes_with_tag

GPUS = torch.cuda.device_count()  # NVML: no CUDA initialized in this process

SIMPLE = """
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl
def test_ok(rank):
    dist.all_reduce(torch.ones(1))
"""


@pytest.mark.parametrize("args, message", [
    (["--nccl-world=0"], "--nccl-world must be a whole number of ranks >= 1, got '0'"),
    (["--nccl-world=-1"], "--nccl-world must be a whole number of ranks >= 1, got '-1'"),
    (["--nccl-world=abc"], "--nccl-world must be a whole number of ranks >= 1, got 'abc'"),
    (["--nccl-backend=mpi"], "--nccl-backend must be one of auto, nccl, gloo, got 'mpi'"),
    (["--nccl-timeout=0"], "--nccl-timeout must be a number of seconds > 0, got '0'"),
    (["--nccl-rank-start=vfork"], "--nccl-rank-start must be one of auto, fork, spawn, got 'vfork'"),
])
def test_bad_options_one_line(pytester, args, message):
    pytester.makepyfile(SIMPLE)
    result = pytester.runpytest_subprocess(*args, timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # ours is the one line about pytest-nccl (a host's other plugins may warn before it)
    ours = [line for line in result.stderr.lines if "pytest-nccl" in line]
    assert ours == [f"ERROR: pytest-nccl: {message}"], result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_too_few_gpus_for_nccl_fails_the_test_when_its_group_starts(pytester):
    """Not at configure: collection (an IDE on a laptop) works; the test that needs the GPUs fails."""
    pytester.makepyfile(SIMPLE)
    result = pytester.runpytest_subprocess("--nccl-backend=nccl", f"--nccl-world={GPUS + 1}", "-rf", timeout=60)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAILED *::test_ok*"])
    assert f"pytest-nccl: --nccl-backend=nccl needs {GPUS + 1} CUDA devices for world {GPUS + 1}; this machine " \
           f"has {GPUS}" in result.stdout.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


BAD_MARKERS = """
import os
import pytest, torch
import torch.distributed as dist
import only_in_the_controller  # made by conftest.py, which ranks do not run

@pytest.mark.nccl(world="abc")
def test_bad_world():
    pass

@pytest.mark.nccl(world=2, colour="red")
def test_unknown_argument():
    pass

@pytest.mark.nccl(world=2)
def test_not_importable_in_rank(rank):
    pass

def test_rank_fixture_outside(rank):
    pass
"""


def test_bad_marker_and_unloadable_module(run_inner, pytester):
    pytester.makeconftest("import sys, types\nsys.modules['only_in_the_controller'] = types.ModuleType('x')\n")
    inner = run_inner(BAD_MARKERS)
    assert inner.result.parseoutcomes() == {"failed": 3, "errors": 1}, inner.text
    assert "pytest-nccl: @pytest.mark.nccl(world=...) must be a whole number of ranks >= 1, got 'abc'" \
        in inner.section("test_bad_world")
    assert "pytest-nccl: @pytest.mark.nccl got unknown argument(s) colour" in inner.section("test_unknown_argument")
    assert "pytest-nccl: cannot load test_inner.test_not_importable_in_rank in the ranks: ModuleNotFoundError: " \
           "No module named 'only_in_the_controller'" in inner.section("test_not_importable_in_rank")
    assert "pytest-nccl: the 'rank' fixture exists only inside a test marked @pytest.mark.nccl" in inner.text
    assert "Traceback" not in inner.text


HANG = """
import time
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
def test_hangs(rank):
    print("ranks started", flush=True)
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    time.sleep(600)
"""


def _wait_for_ranks(tag: str, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(processes_with_tag(tag)) < expected:
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.2)


def test_sigkill_of_pytest_takes_ranks_down(pytester):
    """Even when pytest cannot clean up (SIGKILL), the fork server and the ranks die with it."""
    pytester.makepyfile(test_hang=HANG)
    tag = uuid.uuid4().hex
    # without the launched-ranks hook (docs/launched.md): the outer test's watch directory, which its
    # own watch removes after this test, would count among the inner session's
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR"}
    env["PYTEST_NCCL_TEST_TAG"] = tag
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_hang.py"],
                            cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_ranks(tag, expected=4)
        workdirs = _workdirs(tag)  # the session's journals (in /dev/shm where there is one)
        assert workdirs
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_no_leftovers(tag, wait=5)
    deadline = time.monotonic() + 10
    while any(os.path.exists(d) for d in workdirs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(d) for d in workdirs), f"{workdirs} outlived pytest"


def test_sigkill_of_pytest_leaves_no_directory_of_the_helper_that_follows_tests_own_ranks(pytester):
    """The helper process that follows the ranks tests start themselves (docs/launched.md) has a
    directory; pytest removes it at its session's end, and the helper when pytest was killed."""
    import glob
    import shutil
    import tempfile

    pytester.makepyfile(test_sleeps="import time\n\n\ndef test_sleeps():\n    time.sleep(600)\n")
    tag = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix="k", dir="/tmp")  # short: the directory holds unix sockets
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR"}
    env.update(PYTEST_NCCL_TEST_TAG=tag, TMPDIR=tmp)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_sleeps.py"],
                            cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not glob.glob(os.path.join(tmp, "pytest-nccl-watch-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        made = glob.glob(os.path.join(tmp, "pytest-nccl-watch-*"))
        assert made, "the helper's directory never appeared"
        proc.kill()
        proc.wait(10)
        assert_no_leftovers(tag, wait=10)
        deadline = time.monotonic() + 10
        while any(os.path.exists(d) for d in made) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(os.path.exists(d) for d in made), f"{made} outlived pytest"
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _workdirs(tag: str) -> set:
    """The ``pytest-nccl-*`` directories that the tagged processes have files open in."""
    found = set()
    for entry in processes_with_tag(tag):
        pid = entry.split(":", 1)[0]
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            head, sep, rest = target.partition("/pytest-nccl-")
            if sep and "/" in rest:
                found.add(head + sep + rest.split("/", 1)[0])
    return found


XDIST = """
import os
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=2)
@pytest.mark.parametrize("i", range(6))
def test_many(rank, i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""


def test_xdist_workers_do_not_collide(run_inner):
    inner = run_inner(XDIST, "-n", "2")
    assert inner.result.parseoutcomes() == {"passed": 6}, inner.text


PYTEST_TIMEOUT = """
import time
import pytest, torch
import torch.distributed as dist

@pytest.mark.timeout(6)
@pytest.mark.nccl(world=2)
def test_hang_under_pytest_timeout(rank):
    if rank == 1:
        time.sleep(60)
    dist.all_reduce(torch.ones(1))
"""


def test_our_bound_fires_before_pytest_timeout(run_inner):
    inner = run_inner(PYTEST_TIMEOUT, "-p", "timeout", "--nccl-timeout=120")
    assert inner.result.parseoutcomes() == {"failed": 1}, inner.text
    section = inner.section("test_hang_under_pytest_timeout")
    assert "slow rank: rank 1 is busy outside any collective" in section
    assert section.splitlines()[1].startswith("CollectiveTimeout: slow rank")  # ours, not pytest-timeout's
    assert "+++ Timeout +++" not in inner.text
