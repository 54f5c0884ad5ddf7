"""A side group under ``pytest-nccl watch``: OpenRLHF's weight-sync group (the trainer's rank 0 and
inference engines over a ``tcp://`` rendezvous of their own; no process creates a default group),
one engine never joining. The watch names the group, how many joined of how many, the member that
never connected and the line that created it, within ``--timeout`` of the others waiting, and ends
the job (exit 3): not 30 minutes later as torch's "1/5 clients joined". A healthy job is untouched.

- the rule, on data with a fake clock (``outcome.waited_for_peers``, ``peers_line``);
- plain torch (torch's ``rendezvous`` + ``ProcessGroupGloo``, OpenRLHF's steps in a few lines), on
  this interpreter's torch;
- OpenRLHF's own ``init_process_group`` (0.6.1, March 2025; it runs on torch before 2.10): with
  ``PYTEST_NCCL_OPENRLHF_PYTHON`` naming an interpreter that has it (e.g. a venv made with ``pip
  install torch==2.6.0 openrlhf==0.6.1 --no-deps``), or this one when it has it; skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from watch_support import JOBS, free_port, line_in, run_watch

from pytest_nccl.watch.engine.outcome import (
    Joining,
    Waits,
    peers_line,
    side_group_notice,
    side_group_verdict,
    waited_for_peers,
)

TIMEOUT = 8
JOB = JOBS / "side_group_job.py"


def member(rank, since=100.0, pid=None, group="openrlhf", world=4, store="127.0.0.1:29500"):
    return Joining(pid or 10 + rank, since, rank, world, "openrlhf/utils/distributed_util.py:47 <- job.py:40",
                   Waits.GROUP, group, store)


def test_members_waiting_for_one_that_never_connected_are_a_verdict_after_the_timeout():
    waiting = [member(2, since=103.0), member(0), member(1, group="")]
    assert waited_for_peers(waiting, ranks_seen=0, now=109.9, timeout=10) == []  # not yet
    found = waited_for_peers(waiting, ranks_seen=2, now=110.0, timeout=10)  # a default group exists too
    assert [j.rank for j in found] == [0, 1, 2] and side_group_verdict(found)
    assert peers_line(found, 10) == (
        "group openrlhf: 3 of 4 members joined (store 127.0.0.1:29500); member 3 never connected (the others "
        "waited 10 s, --timeout: 0: pid 10, 1: pid 11, 2: pid 12); created at "
        "openrlhf/utils/distributed_util.py:47 <- job.py:40")


def test_a_complete_or_unknown_side_group_is_only_slow():
    complete = [member(r) for r in range(4)]
    assert waited_for_peers(complete, ranks_seen=0, now=1000.0, timeout=10) == []
    unknown = [Joining(5, 100.0, None, None, "", Waits.GROUP, "", "h:1")]
    assert waited_for_peers(unknown, ranks_seen=0, now=1000.0, timeout=10) == []
    # two groups on two stores: each counted on its own (the second lacks member 1)
    other = [member(0, pid=50, store="h:2", world=2)]
    found = waited_for_peers(complete + other, ranks_seen=0, now=1000.0, timeout=10)
    assert [(j.pid, j.store) for j in found] == [(50, "h:2")]
    assert "1 of 2 members joined (store h:2); member 1 never connected" in peers_line(found, 10)


def test_a_missing_member_is_said_after_15_s_once_and_the_verdict_waits_for_the_timeout():
    """An engine loading a large model may join minutes late: a line at 15 s, the verdict at --timeout."""
    waiting, said = [member(0), member(1), member(2, since=104.0)], set()
    assert side_group_notice(waiting, 114.9, 300.0, said) is None  # rank 2 waited 10.9 s only
    assert side_group_notice(waiting, 119.0, 300.0, said) == (
        "group openrlhf: 3 of 4 members joined (store 127.0.0.1:29500); member 3 not connected after 15 s; "
        "created at openrlhf/utils/distributed_util.py:47 <- job.py:40; a verdict at --timeout (300 s) unless "
        "it connects")
    assert side_group_notice(waiting, 130.0, 300.0, said) is None  # said once
    assert waited_for_peers(waiting, ranks_seen=0, now=130.0, timeout=300.0) == []  # no verdict yet
    assert side_group_notice(waiting, 119.0, 15.0, set()) is None  # the verdict itself comes as soon


def test_peers_of_the_default_group_are_still_no_verdict():
    init = Joining(7, 100.0, 0, 2, "x.py:3", Waits.INIT)
    found = waited_for_peers([init], ranks_seen=0, now=200.0, timeout=10)
    assert found == [init] and not side_group_verdict(found)
    assert Waits.of("group") == Waits.GROUP and Waits.of("anything") == Waits.INIT


def openrlhf_python() -> str | None:
    """An interpreter with OpenRLHF, and a torch it runs on."""
    named = os.environ.get("PYTEST_NCCL_OPENRLHF_PYTHON")
    if named:
        return named
    import importlib.util

    return sys.executable if importlib.util.find_spec("openrlhf") is not None else None


def watch_job(tmp_path: Path, case: str, how: str, python: str, *extra: str, timeout: float = TIMEOUT):
    return run_watch(tmp_path, [python, str(JOB), case, how, str(free_port()), *extra], "--timeout", f"{timeout:g}",
                     python=python, inherit_pythonpath=python == sys.executable)


def waited_from(run) -> float:
    return float(next(line for line in run.stdout.splitlines() if line.startswith("trainer waits from")).split()[-1])


def assert_named(run, group: str, site: str, ended_at: float, timeout: float = TIMEOUT) -> None:
    assert run.code == 3, run.text
    assert f"pytest-nccl watch: group {group}: 3 of 4 members joined (store 127.0.0.1:" in run.stderr, run.stderr
    assert f"member 3 never connected (the others waited {timeout:g} s, --timeout: 0: pid " in run.stderr, run.stderr
    assert f"created at {site}" in run.stderr, run.stderr
    # shaped as every verdict: the banner, the report, and the verdict again as the watch's last line
    assert "pytest-nccl watch: diagnosed (rendezvous, side group) =====" in run.stderr, run.stderr
    assert f"-- where each member of group {group} is --" in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pytest-nccl watch: verdict (exit 3): group {group}: 3 of 4 members joined"), last
    s = run.summary
    assert s is not None and s["exit_code"] == 3 and s["ended_by_watch"] and s["verdict"], s
    assert s["headline"] == s["peers_missing"] and s["headline"].startswith(f"group {group}: 3 of 4"), s
    assert s["kind"] == "rendezvous", s  # as a test's side group whose member never joined
    # named within --timeout of the trainer waiting, with a wide margin (start-up, a loaded host)
    assert ended_at - waited_from(run) < timeout + 30, (ended_at, waited_from(run))


def assert_untouched(run) -> None:
    assert run.code == 0, run.text
    assert "never connected" not in run.stderr and "=====" not in run.stderr, run.stderr
    assert run.stdout.count("synced") == 4, run.text
    s = run.summary
    assert s is not None and s["exit_code"] == 0 and not s["peers_missing"] and not s["verdict"], s


@pytest.mark.parametrize("trainer", ["engines-only", "trainer-group"])
def test_plain_torch_side_group_with_a_missing_member_is_named(tmp_path, trainer):
    """``trainer-group``: the trainer's rank 0 is a rank of a default group too (OpenRLHF's trainer
    is, of its DeepSpeed group): the side group is followed beside it."""
    import time

    # engines-only: a --timeout past the 15 s notice, which comes first, once
    timeout = TIMEOUT if trainer == "trainer-group" else 22
    run = watch_job(tmp_path, "bad", "torch", sys.executable, *([trainer] if trainer == "trainer-group" else []),
                    timeout=timeout)
    line = line_in(JOB, "store, rank, world = next(dist.rendezvous(")
    assert_named(run, "weight-sync", f"{JOB}:{line}", time.time(), timeout)
    notice = ("pytest-nccl watch: group weight-sync: 3 of 4 members joined (store 127.0.0.1:")
    if timeout > 15:
        assert run.stderr.count("not connected after 15 s") == 1, run.stderr
        at = run.stderr.index("not connected after 15 s")
        assert run.stderr.rfind(notice, 0, at) >= 0 and at < run.stderr.index("never connected"), run.stderr
        assert f"a verdict at --timeout ({timeout:g} s) unless it connects" in run.stderr, run.stderr


def test_plain_torch_side_group_healthy_is_untouched(tmp_path):
    assert_untouched(watch_job(tmp_path, "good", "torch", sys.executable))


@pytest.fixture(scope="module")
def openrlhf():
    python = openrlhf_python()
    if python is None:
        pytest.skip("no interpreter with OpenRLHF: set PYTEST_NCCL_OPENRLHF_PYTHON to one (pip install "
                    "torch==2.6.0 openrlhf==0.6.1 --no-deps)")
    probe = subprocess.run([python, "-c", "import importlib.util, torch; print(torch.__version__, "
                            "importlib.util.find_spec('openrlhf') is not None)"],
                           capture_output=True, text=True, timeout=120)
    if not probe.stdout.strip().endswith("True"):
        pytest.skip(f"{python} has no OpenRLHF ({probe.stdout.strip() or probe.stderr.strip()[-200:]})")
    return python


def test_openrlhf_weight_sync_group_with_an_engine_that_never_joins(tmp_path, openrlhf):
    import time

    run = watch_job(tmp_path, "bad", "openrlhf", openrlhf)
    assert_named(run, "openrlhf", "openrlhf/utils/distributed_util.py:", time.time())
    assert f"<- {JOB}:{line_in(JOB, 'return openrlhf_util().init_process_group(')}" in run.stderr, run.stderr


def test_openrlhf_weight_sync_group_healthy_is_untouched(tmp_path, openrlhf):
    assert_untouched(watch_job(tmp_path, "good", "openrlhf", openrlhf))
