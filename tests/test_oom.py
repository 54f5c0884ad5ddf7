"""The OOM killer's kill of a rank, on data (``core.oom``): the counter files and /proc texts parsed,
the decision (did the counter grow, for a rank that died how), and the words a report says; the
reader (``memcg``) on this host's own files. No torch, no processes started."""

from __future__ import annotations

import os

import pytest
from collective_records import record, view

from pytest_nccl.core.diagnosis import diagnose
from pytest_nccl.core.oom import (
    CgroupVersion,
    MemoryCgroup,
    OomCount,
    OomKill,
    exiting,
    killed_by_oom,
    memory_cgroup,
    oom_kill,
    parse_oom_kills,
)
from pytest_nccl.core.reports import RankReport
from pytest_nccl.core.states import RankState
from pytest_nccl.memcg import OomWatch

# this container's: cgroup v1 with the memory controller, and an empty v2 hierarchy beside it
HYBRID_CGROUP = """9:name=systemd:/
4:memory:/process_api/d19
1:cpu:/
0::/
"""
HYBRID_MOUNTS = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
MEMORY_EVENTS = "low 0\nhigh 0\nmax 14\noom 1\noom_kill 1\noom_group_kill 0\n"

CG = MemoryCgroup("/x/y", CgroupVersion.V1, "/sys/fs/cgroup/memory/x/y/memory.oom_control")


def test_the_counter_is_read_from_either_file():
    assert parse_oom_kills(OOM_CONTROL) == 2
    assert parse_oom_kills(MEMORY_EVENTS) == 1  # not oom_group_kill, not oom
    assert parse_oom_kills("oom 3\n") is None and parse_oom_kills("") is None


def test_the_memory_cgroup_of_a_hybrid_host_is_the_v1_controllers():
    assert memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTS) == MemoryCgroup(
        "/process_api/d19", CgroupVersion.V1, "/sys/fs/cgroup/memory/process_api/d19/memory.oom_control")


def test_the_memory_cgroup_of_a_v2_host_is_its_memory_events():
    assert memory_cgroup("0::/system.slice/job.scope\n", V2_MOUNTS) == MemoryCgroup(
        "/system.slice/job.scope", CgroupVersion.V2, "/sys/fs/cgroup/system.slice/job.scope/memory.events")


def test_a_mount_of_part_of_the_hierarchy_is_followed_and_one_that_does_not_show_it_is_not():
    docker = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    assert memory_cgroup("4:memory:/docker/abc/job\n", docker).counter == \
        "/sys/fs/cgroup/memory/job/memory.oom_control"
    assert memory_cgroup("4:memory:/docker/abcd\n", docker) is None  # a sibling, not under the mount
    assert memory_cgroup("4:memory:/x\n", V2_MOUNTS) is None  # memory on v1, no v1 mount: unknown
    assert memory_cgroup("1:cpu:/\n", HYBRID_MOUNTS) is None and memory_cgroup("", "") is None


def test_a_mount_point_with_a_space_is_unescaped():
    mounts = "35 31 0:32 / /mnt/cg\\040v1 rw - cgroup cgroup rw,memory\n"
    assert memory_cgroup("4:memory:/a\n", mounts).counter == "/mnt/cg v1/a/memory.oom_control"


def test_an_exiting_task_is_told_by_its_flags():
    """On cgroup v1 an exiting task's /proc/PID/cgroup names the root: no move to follow."""
    alive = "4242 (python (x)) S 1 4242 4242 0 -1 4194560 5 0 0 0"
    assert not exiting(alive) and exiting(alive.replace(" 4194560 ", " 4194564 "))
    assert exiting("") and exiting("garbage")
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert not exiting(f.read())


def test_the_oom_killer_only_when_the_counter_of_the_same_cgroup_grew():
    assert oom_kill(OomCount(CG, 0), OomCount(CG, 1)) == OomKill("/x/y", 1)
    assert oom_kill(OomCount(CG, 2), OomCount(CG, 2)) is None  # a plain kill -9
    other = MemoryCgroup("/x/z", CgroupVersion.V1, "/z")
    assert oom_kill(OomCount(CG, 0), OomCount(other, 5)) is None  # another cgroup's count says nothing
    assert oom_kill(None, OomCount(CG, 1)) is None and oom_kill(OomCount(CG, 0), None) is None


@pytest.mark.parametrize("signal_name, exit_code, oom", [
    ("SIGKILL", None, True), (None, None, True),   # nothing said how: its launcher reaped it first
    ("SIGTERM", None, False), ("SIGSEGV", None, False), (None, 1, False), (None, 0, False)])
def test_only_a_rank_killed_by_sigkill_or_that_left_no_word_can_be_the_oom_killers(signal_name, exit_code, oom):
    found = killed_by_oom(signal_name, exit_code, OomCount(CG, 0), OomCount(CG, 1))
    assert (found is not None) == oom


def test_the_words_of_an_oom_kill():
    assert OomKill("/x/y", 1).describe() == \
        "killed by the kernel's OOM killer (SIGKILL; its memory cgroup /x/y counted 1 OOM kill)"
    assert OomKill("/", 2).describe().endswith("its memory cgroup / counted 2 OOM kills)")


def test_the_headline_names_the_oom_killer_and_the_ranks_last_journaled_place():
    oom = OomKill("/x/y", 1)
    ranks = [view(0, "running", [record(0, i) for i in range(1, 4)] + [record(0, 4, state="entered")]),
             view(1, "dead", [record(1, i) for i in range(1, 4)], signal_name="SIGKILL", oom=oom)]
    d = diagnose(ranks, "decided", 60)
    assert d.headline.startswith(
        "rank 1 killed by the kernel's OOM killer (SIGKILL; its memory cgroup /x/y counted 1 OOM kill) after 3 "
        "collectives in group default, the last all_reduce #3 of group default from "), d.headline
    plain = [ranks[0], view(1, "dead", ranks[1].records, signal_name="SIGKILL")]
    assert "OOM" not in diagnose(plain, "decided", 60).headline


def test_the_note_travels_in_the_reports_json_form():
    report = RankReport(1, RankState.DEAD, signal_name="SIGKILL", oom=OomKill("/x/y", 1))
    back = RankReport.from_json(report.to_json())
    assert back.oom == OomKill("/x/y", 1) and back.view().exit_description == OomKill("/x/y", 1).describe()
    assert RankReport.from_json('{"rank": 1, "state": "dead", "oom": {"cgroup": 3}}').oom is None
    assert RankReport.from_json(RankReport(1, RankState.DEAD).to_json()).oom is None


def test_the_reader_on_this_process_says_nothing_of_a_live_process_and_nothing_for_a_pid_never_there():
    watch = OomWatch(os.getpid())
    assert watch.killed("SIGKILL", None) is None  # its counter did not grow (or cannot be read here)
    assert OomWatch(2 ** 22 + 12345).killed("SIGKILL", None) is None
