"""SPMD mode's liveness (spmd/liveness.py): rank 0 tells a rank whose process ended, where its pids
mean the same thing (the same boot, the same PID namespace)."""

from __future__ import annotations

import subprocess
import sys
import time

from pytest_nccl.spmd.liveness import RankProcess, pid_space


def test_a_running_process_has_not_ended_and_its_text_round_trips():
    me = RankProcess.mine()
    assert me.pid > 0 and me.started > 0 and not me.ended()
    assert RankProcess.from_text(me.to_text()) == me


def test_a_process_that_exited_has_ended_and_so_has_a_reused_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert RankProcess(pid_space(), child.pid, 1).ended()
    me = RankProcess.mine()
    assert RankProcess(me.space, me.pid, me.started + 1).ended()  # another process under the same pid


def test_a_zombie_has_ended_before_its_launcher_reaps_it():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = RankProcess(pid_space(), child.pid, 0)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # not reaped: a zombie once it exits
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert started.ended()
    finally:
        child.wait()


def test_a_process_of_another_machine_or_pid_namespace_is_never_said_to_have_ended():
    """A container with the host's network shares its hostname, not its pids: pid 1 there is not ours."""
    boot, namespace = pid_space().split("/", 1)
    assert not RankProcess(f"{boot}/pid:[1]", 999999, 1).ended()       # another container on this machine
    assert not RankProcess(f"other-boot/{namespace}", 999999, 1).ended()  # another machine
    assert not RankProcess("", 999999, 1).ended()                         # nothing known of where it runs
