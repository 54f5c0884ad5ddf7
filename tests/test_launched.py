"""Ranks a test starts itself (launched.py, docs/launched.md), on real launchers: accelerate's
``debug_launcher`` over accelerate's own test script and over a desync, ``torch.multiprocessing.spawn``,
``torchrun`` and ``accelerate launch`` in a subprocess (as TRL's tests/distributed run it). One inner
pytest session runs every scenario (each a test of its own there); the tests here check one each.
A good job is untouched; a desync fails its test within seconds with the watch's headline and report,
as the exception a marked test gets; nothing the inner session started is left, nor in /dev/shm."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import run_inner_once
from watch_support import line_in

from pytest_nccl.budget import Budget
from pytest_nccl.core.messages import LaunchedVerdict
from pytest_nccl.launched import boot_ticks, decide, stall_bound

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "launched"
VERDICT_WITHIN = 30.0   # seconds from the ranks' group to the verdict (issue 28: under 30 s)

INNER = f"""
import os, socket, subprocess, sys
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from accelerate import debug_launcher
from accelerate.state import PartialState
from accelerate.test_utils import test_ops
from accelerate.utils import gather

sys.path.insert(0, {str(REPO / "tests" / "watch")!r})
from spawn_job import train

JOBS = {str(JOBS)!r}
BIN = os.path.dirname(sys.executable)


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_started():
    assert "PYTEST_NCCL_WATCH_DIR" in os.environ  # the test's environment, for what it would start


def test_debug_launcher_accelerate_ops():
    debug_launcher(test_ops.main)


def _desync():
    state = PartialState(cpu=True)
    if state.process_index == 0:
        gather(dist.get_rank() * __import__("torch").ones(2))  # rank 0 gathers
    else:
        state.wait_for_everyone()  # rank 1 waits


def test_debug_launcher_desync():
    debug_launcher(_desync)


def _raises():
    state = PartialState(cpu=True)
    if state.process_index == 1:
        raise ValueError("rank 1 gives up")
    state.wait_for_everyone()


def test_debug_launcher_expected_failure():
    with pytest.raises(Exception, match="rank 1 gives up"):
        debug_launcher(_raises)


def _hang():
    state = PartialState(cpu=True)
    peer = 1 - state.process_index
    dist.recv(__import__("torch").zeros(1), src=peer)  # each rank waits for the other


@pytest.mark.timeout(20)  # pytest-timeout's budget: the plugin's bound is what it leaves, less 3 s
def test_debug_launcher_hang():
    debug_launcher(_hang)


def test_spawn_good():
    mp.spawn(train, args=("good", port()), nprocs=2)


def test_spawn_bad():
    mp.spawn(train, args=("bad", port()), nprocs=2)


def torchrun(case):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                           "--master-addr=127.0.0.1", f"--master-port={{port()}}", f"{{JOBS}}/env_job.py", case],
                          capture_output=True, text=True)


def test_torchrun_good():
    run = torchrun("good")
    print(run.stdout)
    assert run.returncode == 0, run.stderr


def test_torchrun_desync():
    run = torchrun("desync")
    assert run.returncode == 0, run.stderr[-300:]


def test_left_running():
    # a process the test never waits for: ended with the test (the inner session's leftover check)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


class TestUnittestStyle(__import__("unittest").TestCase):  # as accelerate's tests/test_cpu.py
    def test_desync(self):
        debug_launcher(_desync)


def accelerate_launch(case):
    # a CPU job (gloo): with CUDA visible, accelerate puts rank 1 on cuda:1, which a one-GPU host lacks
    subprocess.run([os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes=2",
                    "--num_machines=1", f"--main_process_port={{port()}}", "--mixed_precision=no",
                    "--dynamo_backend=no", f"{{JOBS}}/accelerate_job.py", case], check=True,
                   env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))


def test_accelerate_launch_good():
    accelerate_launch("good")


def test_accelerate_launch_desync():
    accelerate_launch("desync")
"""


def _shm() -> set:
    """/dev/shm's entries, less the fork servers' working directories of every pytest session here."""
    try:
        return {n for n in os.listdir("/dev/shm") if not n.startswith("pytest-nccl-")}
    except OSError:
        return set()


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("ranks run on Linux only")
    for module in ("accelerate",):
        pytest.importorskip(module)
    shm = _shm()
    run = run_inner_once(tmp_path_factory, INNER, "--durations=0", "-vv", "-p", "no:randomly",
                         name="test_launched_inner", timeout=600)
    left = _shm() - shm
    run.shm_left = left - _held(left)
    return run


def _held(names: set) -> set:
    """Those of ``names`` (in /dev/shm) some live process has open or mapped: in use by another session
    on the host (a second pytest run beside this one), never left behind by this one, whose processes
    are gone. By inode: a POSIX semaphore is mapped under the temporary name glibc made it with."""
    files = {}
    for name in names:
        try:
            st = os.stat(f"/dev/shm/{name}")
        except OSError:
            continue
        files[st.st_dev, st.st_ino] = name
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:  # address perms offset major:minor inode path
                    if "/dev/shm/" in line:
                        major, minor = (int(x, 16) for x in line.split()[3].split(":"))
                        held.add((os.makedev(major, minor), int(line.split()[4])))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                held.add((st.st_dev, st.st_ino))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return {files[key] for key in held & set(files)}


def _outcome(inner, test: str) -> str:
    for line in inner.result.stdout.lines:
        m = re.match(rf"test_launched_inner\.py::{test} (PASSED|FAILED|ERROR|SKIPPED)", line)
        if m:
            return m[1]
    raise AssertionError(f"{test} did not run:\n{inner.text}")


def _elapsed(section: str) -> float:
    m = re.search(r"\(gloo, 2 ranks, ([\d.]+) s after init_process_group, --nccl-timeout", section)
    assert m, section
    return float(m[1])


def test_the_session_header_says_so(inner):
    assert "nccl: ranks a test starts itself (torchrun, mp.spawn" in inner.text, inner.text


def test_a_test_that_starts_nothing_passes(inner):
    assert _outcome(inner, "test_nothing_started") == "PASSED"


@pytest.mark.parametrize("test", ["test_debug_launcher_accelerate_ops", "test_spawn_good", "test_torchrun_good",
                                  "test_accelerate_launch_good", "test_debug_launcher_expected_failure"])
def test_a_good_job_is_untouched(inner, test):
    assert _outcome(inner, test) == "PASSED", inner.section(test) or inner.text


def test_debug_launcher_desync_fails_within_seconds(inner):
    assert _outcome(inner, "test_debug_launcher_desync") == "FAILED"
    section = inner.section("test_debug_launcher_desync")
    assert "op mismatch at collective #1 of group default: rank 0 all_gather, rank 1 barrier" in section, section
    assert "test_launched_inner.py:" in section and "via accelerate" in section, section
    assert ">>   #1 all_gather [2]" in section  # the collective trace
    assert _elapsed(section) < VERDICT_WITHIN
    assert "FAILED test_launched_inner.py::test_debug_launcher_desync - CollectiveMismatch: op mismatch" in inner.text


def test_a_hang_fails_at_the_bound_before_pytest_timeout(inner):
    assert _outcome(inner, "test_debug_launcher_hang") == "FAILED"
    section = inner.section("test_debug_launcher_hang")
    assert re.search(r"every rank is inside recv #1 of group default:p2p from test_launched_inner\.py:\d+ .*and "
                     r"none completed within [\d.]+ s \(--nccl-timeout\)", section), section
    assert section.split("\n")[1].startswith("CollectiveTimeout: every rank"), section  # ours, not pytest-timeout's
    assert "CollectiveTimeout" in inner.text or "every rank is inside" in inner.text


def test_a_unittest_test_fails_the_same_way(inner):
    assert _outcome(inner, "TestUnittestStyle::test_desync") == "FAILED"
    section = inner.section("TestUnittestStyle.test_desync")
    assert "op mismatch at collective #1 of group default: rank 0 all_gather, rank 1 barrier" in section, section
    assert "The test itself raised ProcessExitedException" in section, section


def test_a_process_left_running_ends_with_its_test(inner):
    assert _outcome(inner, "test_left_running") == "PASSED"  # and no process of it is left (run_inner_once)


def test_spawn_bad_fails_with_the_mismatch(inner):
    assert _outcome(inner, "test_spawn_bad") == "FAILED"
    section = inner.section("test_spawn_bad")
    job = REPO / "tests" / "watch" / "spawn_job.py"
    assert (f"shape mismatch in all_gather #4 of group default: rank 0 [2], rank 1 [3] (from "
            f"{job}:{line_in(job, '# the gather')})") in section, section
    assert "The test itself raised" in section  # mp.spawn's own error, kept under the report


def test_torchrun_subprocess_desync_fails_within_seconds(inner):
    assert _outcome(inner, "test_torchrun_desync") == "FAILED"
    section = inner.section("test_torchrun_desync")
    job = JOBS / "env_job.py"
    assert (f"op mismatch at collective #4 of group default: rank 0 all_gather, rank 1 barrier (from "
            f"{job}:{line_in(job, '# the gather')}; rank 1 from {job}:{line_in(job, '# the barrier')})") in section, \
        section
    assert _elapsed(section) < VERDICT_WITHIN
    # the desync is a failure whatever the test asserted: its own assertion passed on the ended job or not
    assert "CollectiveMismatch" in section or "op mismatch" in section


def test_accelerate_launch_subprocess_desync_fails_within_seconds(inner):
    assert _outcome(inner, "test_accelerate_launch_desync") == "FAILED"
    section = inner.section("test_accelerate_launch_desync")
    job = JOBS / "accelerate_job.py"
    assert (f"op mismatch at collective #4 of group default: rank 0 all_gather, rank 1 barrier (from "
            f"{job}:{line_in(job, '# the gather')}, via accelerate") in section, section
    assert _elapsed(section) < VERDICT_WITHIN
    assert "The test itself raised CalledProcessError" in section


def test_nothing_is_left(inner):
    # run_inner_once checked the processes (every one carried the inner session's tag)
    assert not inner.shm_left, f"left in /dev/shm: {sorted(inner.shm_left)}"


# -- the rule, on data ------------------------------------------------------------------------------------

def _verdict(live: bool, launcher_sees: bool) -> LaunchedVerdict:
    return LaunchedVerdict("h", "CollectiveMismatch", "r", live=live, launcher_sees=launcher_sees)


def test_a_hang_or_desync_fails_the_test_whatever_it_asserted():
    assert decide(_verdict(live=True, launcher_sees=False), failed=False)
    assert decide(_verdict(live=True, launcher_sees=False), failed=True)


def test_a_failure_the_launcher_reports_is_the_tests_to_judge():
    # a rank raised or died (mp.spawn raised, torchrun exited non-zero): a test that expects it passes
    assert not decide(_verdict(live=True, launcher_sees=True), failed=False)
    assert not decide(_verdict(live=False, launcher_sees=False), failed=False)
    # ... and when the test fails on it, the report replaces its error
    assert decide(_verdict(live=True, launcher_sees=True), failed=True)
    assert decide(_verdict(live=False, launcher_sees=True), failed=True)
    assert not decide(None, failed=True)


def test_boot_ticks_is_the_unit_of_a_process_start():
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19])
    assert started <= boot_ticks()


def test_the_start_up_hook_is_the_watchs():
    from pytest_nccl import launched
    from pytest_nccl.watch.engine import control

    assert launched.STARTUP_DIR == control.STARTUP_DIR


def test_durations_for_the_record(inner, capsys):
    with capsys.disabled():
        print("\ninner session, per test:\n" + "\n".join(line for line in inner.result.stdout.lines
                                                         if re.match(r"[\d.]+s call ", line)))


def test_the_stall_bound_leaves_pytest_timeout_room_for_the_ranks_to_start():
    import time

    assert stall_bound(Budget(120.0)) == 120.0
    now = time.monotonic()
    assert 12 < stall_bound(Budget(120.0, now + 20)) < 14      # 17 s left, a quarter kept
    assert 106 < stall_bound(Budget(120.0, now + 120)) < 108   # 117 s left, 10 s kept
