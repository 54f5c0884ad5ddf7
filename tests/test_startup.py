"""Cold start: the fork server starts with the session (it imports torch while pytest collects), gets
the test modules and the environment collection left (conftest files set variables), and does not
linger in sessions without distributed tests."""

import textwrap

CONFTEST_ENV = """
import os
os.environ["SET_BY_A_CONFTEST"] = "yes"
"""

READS_ENV = """
import os
import pytest, torch
import torch.distributed as dist

LEVEL = os.environ.get("SET_BY_A_CONFTEST")      # module level: runs in the fork server

@pytest.mark.nccl(world=2)
def test_ranks_see_what_conftest_set(rank):
    assert LEVEL == "yes" and os.environ.get("SET_BY_A_CONFTEST") == "yes"
    dist.all_reduce(torch.ones(1))
"""


def test_environment_set_by_a_conftest_during_collection_reaches_the_ranks(run_inner, pytester):
    sub = pytester.mkpydir("sub")
    (sub / "conftest.py").write_text(textwrap.dedent(CONFTEST_ENV))
    (sub / "test_env.py").write_text(textwrap.dedent(READS_ENV))
    inner = run_inner("def test_plain():\n    pass\n", ".")
    assert inner.result.parseoutcomes() == {"passed": 2}, inner.text


NO_DISTRIBUTED_TESTS = """
import os, time

def fork_servers():
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        tag = ("PYTEST_NCCL_TEST_TAG=" + os.environ["PYTEST_NCCL_TEST_TAG"]).encode()
        if b"pytest_nccl.rank.zygote" in cmd and tag in env:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(pid)
    return found

def test_no_fork_server_lingers():
    deadline = time.monotonic() + 5
    while fork_servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fork_servers() == []
"""


def test_a_session_without_distributed_tests_stops_the_fork_server(run_inner):
    inner = run_inner(NO_DISTRIBUTED_TESTS)
    assert inner.result.parseoutcomes() == {"passed": 1}, inner.text


COUNTS_FORK_SERVERS = NO_DISTRIBUTED_TESTS.split("def test_no_fork_server_lingers")[0] + """
def pytest_collection_finish(session):
    time.sleep(1.0)  # a fork server started with the session would be up by now
    with open("fork_servers.txt", "w") as f:
        f.write(str(len(fork_servers())))
"""


def test_collect_only_starts_no_fork_server(run_inner, pytester):
    pytester.makeconftest(COUNTS_FORK_SERVERS)
    inner = run_inner(READS_ENV, "--collect-only")
    assert "test_ranks_see_what_conftest_set" in inner.text and inner.result.ret == 0, inner.text
    assert (pytester.path / "fork_servers.txt").read_text() == "0"
    started = run_inner(READS_ENV, "-k", "nothing_matches")  # a real session does start one
    assert (pytester.path / "fork_servers.txt").read_text() == "1", started.text
