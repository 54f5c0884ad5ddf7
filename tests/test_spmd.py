"""SPMD mode: pytest launched by torchrun (one node x 2 ranks, two launchers x 1 rank with a c10d
rendezvous), every launched process one rank. Each scenario is a real torchrun run on localhost,
bounded in time, after which no process carrying the run's tag may be alive."""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import line_of
from spmd_support import Launched

from pytest_nccl import spmd
from pytest_nccl.core.messages import Collected
from pytest_nccl.errors import NcclUsageError
from pytest_nccl.spmd.collection import collection_difference
from pytest_nccl.spmd.release import abort_connections

REPO = Path(__file__).resolve().parents[1]

SPMD_CASES = """
import os
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl
def test_a_passes(rank, world_size):
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t)
    print(f"rank {rank} of {world_size} says hello")
    assert t.tolist() == [3.0, 3.0]

@pytest.mark.nccl
def test_b_fails_on_one_rank(rank):
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.all_reduce(t)  # the second

@pytest.mark.nccl(timeout=2)
def test_c_hangs(rank):
    dist.recv(torch.zeros(1), src=1 - rank)  # each rank waits for the other

@pytest.mark.nccl
def test_d_after_the_hang(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size

@pytest.fixture
def broken_on_rank_1(rank):
    if rank == 1:
        raise RuntimeError("fixture broke on rank 1")

@pytest.mark.nccl
def test_e_fixture_fails_on_one_rank(rank, broken_on_rank_1):
    dist.all_reduce(torch.ones(1))

@pytest.mark.nccl(world=4)
def test_f_needs_four(rank):
    pass

def test_g_plain():
    assert os.environ["WORLD_SIZE"] == "2"

def test_h_controller_side(nccl_world):  # plugin mode only: skipped under a launcher
    pass
"""

# a rank whose main thread no abort reaches: the session ends there, with rank 0's report
STUCK_CASE = """

@pytest.mark.nccl(timeout=2)
def test_i_stuck_outside_python(rank):
    if rank == 1:
        torch.futures.Future().wait()  # a C++ wait: no socket to shut, no signal returns from it
    dist.barrier()

@pytest.mark.nccl
def test_j_never_runs(rank):
    dist.barrier()
"""


def _check_spmd_cases(run: Launched) -> None:
    report = run.report
    # one report: the header, the summary and each headline once, from rank 0
    assert run.text.count("test session starts") == 1, run.text
    assert "nccl: SPMD mode: rank 0 of 2 launched by torchrun" in report
    assert re.search(r"=+ 3 failed, 3 passed, 2 skipped in [\d.]+s =+", report), report
    assert "PASSED test_inner.py::test_a_passes" in report and "PASSED test_inner.py::test_d_after_the_hang" in report
    assert "Captured output rank 1" in report and "rank 1 of 2 says hello" in report

    raised = ("rank 1 raised ValueError: boom on rank 1 after 1 collective in group default; rank 0 waits in "
              f"all_reduce #2 of group default from test_inner.py:{line_of(SPMD_CASES, '# the second')}")
    assert run.reported_once_text.count(raised) == 1, run.section("test_b_fails_on_one_rank")
    assert "-- traceback of rank 1 --" in run.section("test_b_fails_on_one_rank")

    hang = ("p2p deadlock: both ranks receive first: rank 0 waits in recv(src=1, tag=0) from test_inner.py:"
            f"{line_of(SPMD_CASES, 'dist.recv(')}, which rank 1 never sends; rank 1 waits in recv(src=0, tag=0)")
    assert run.reported_once_text.count(hang) == 1, run.section("test_c_hangs")
    section = run.section("test_c_hangs")
    assert "-- Python stack of ranks 0,1 (all threads) --" in section and "dist.recv(torch.zeros(1)" in section
    # the bound is enforced: the stack is the test's, not pytest's
    assert "_pytest" not in section and "pluggy" not in section

    setup = ("rank 1 raised RuntimeError: fixture broke on rank 1 (in the test's setup) after 0 collectives in "
             "group default; rank 0 waits in all_reduce #1 of group default")
    assert run.reported_once_text.count(setup) == 1, run.section("test_e_fixture_fails_on_one_rank")
    assert "needs world 4; the launched group has 2 ranks" in report and "nccl_world drives a group" in report


def test_torchrun_one_node_two_ranks(launch, pytester):
    run = launch(SPMD_CASES, "test_inner.py", "--nccl-timeout=60", "--junitxml=junit.xml")
    _check_spmd_cases(run)
    assert run.codes == [1], run.text  # tests failed, on every rank
    # two 2 s hangs, the other failures within about a second each, plus start-up
    assert run.elapsed < 90, run.elapsed
    props = _junit_properties(pytester.path / "junit.xml")  # rank 0's: the other rank writes none
    assert props[("test_c_hangs", "nccl_diagnosis_kind")] == "p2p-mismatch"
    assert props[("test_b_fails_on_one_rank", "nccl_diagnosis")].startswith("rank 1 raised ValueError")


def test_torchrun_two_nodes_one_rank_each(launch):
    """Two launchers (as on two nodes) with a c10d rendezvous; the session ends at a rank that no
    abort releases, with rank 0's report, and every process exits."""
    # gloo: both "nodes" are this host, so on a GPU host each would pick its local GPU 0 for NCCL
    run = launch(SPMD_CASES + STUCK_CASE, "test_inner.py", "--nccl-timeout=60", "--nccl-backend=gloo",
                 nodes=2, nproc=1)
    report = run.report
    assert run.text.count("test session starts") == 1, run.text
    assert "rank 1 raised ValueError: boom on rank 1 after 1 collective" in report
    assert "p2p deadlock: both ranks receive first: rank 0 waits in recv(src=1, tag=0)" in report
    assert "PASSED test_inner.py::test_d_after_the_hang" in report
    stuck = run.section("test_i_stuck_outside_python")
    assert ("slow rank: rank 1 is busy outside any collective at test_inner.py:"  # the user's line, not torch's
            in stuck and "torch.futures.Future().wait()" in stuck), report
    assert "rank 0 waited for the whole 2 s bound in barrier #1" in stuck
    assert "rank 1 could not be released from test_inner.py::test_i_stuck_outside_python" in report
    assert "Interrupted: pytest-nccl: rank 1 could not be released" in report
    assert re.search(r"=+ 4 failed, 3 passed, 2 skipped in [\d.]+s =+", report), report
    assert "test_j_never_runs" not in report.split("short test summary info")[-1]
    assert sorted(run.codes) == [1, 1], run.text
    assert run.elapsed < 100, run.elapsed


LAUNCH_SUITE = REPO / "suites" / "launch"


def _suite_files() -> dict:
    return {f"{p.stem}": p.read_text() for p in LAUNCH_SUITE.glob("test_*.py")}


def _junit_properties(junit: Path) -> dict:
    root = ET.parse(junit).getroot()
    return {(tc.get("name"), p.get("name")): p.get("value")
            for tc in root.iter("testcase") for p in tc.iter("property")}


def _check_suite_stacks(trace_dir: Path) -> None:
    """--nccl-trace-dir: the stuck rank's stack is the one that explains the failure."""
    import json
    traces = {p.name: json.loads(p.read_text()) for p in trace_dir.glob("*.json")
              if not p.name.endswith(".trace.json")}  # the Chrome trace beside it (docs/views.md)
    rendezvous = next(t for n, t in traces.items() if "engine_never_joins" in n)
    assert rendezvous["diagnosis"]["ranks"] == [0]
    assert "store = dist.TCPStore(" in rendezvous["ranks"][0]["stack"]
    slow = next(t for n, t in traces.items() if "slow_rank" in n)
    assert slow["diagnosis"]["ranks"] == [1] and slow["diagnosis"]["kind"] == "slow-rank"
    assert "time.sleep(DECODE_STEP_S)" in slow["ranks"][1]["stack"]


def _check_suite_headlines(props: dict, folder: str) -> None:
    rendezvous = props[("test_weight_sync_group_engine_never_joins", "nccl_diagnosis")]
    # the default store's line, or the legacy store's where this torch's default refuses a listen fd
    init_lines = "|".join(str(i) for i, line in enumerate(_suite_files()["test_rendezvous"].splitlines(), 1)
                          if "store = dist.TCPStore(" in line)
    barrier_line = line_of(_suite_files()["test_rendezvous"], "dist.barrier()  # the other trainer ranks")
    # the tracer saw rank 0 enter the store's rendezvous: it names the store and who never joined
    assert re.match(rf"(slow rank: )?rank 0 (is busy outside any collective|waits in a rendezvous|waits in "
                    rf"TCPStore\(127\.0\.0\.1:\d+\) as a server of 2 members) at "
                    rf"{folder}test_rendezvous.py[ :(]+(line )?({init_lines})\b", rendezvous), rendezvous
    assert (f"rank 1 waited for the whole 5 s bound in barrier #1 of group default from "
            f"{folder}test_rendezvous.py:{barrier_line}") in rendezvous
    slow = props[("test_uneven_rollout_lengths_slow_rank", "nccl_diagnosis")]
    sleep_line = line_of(_suite_files()["test_slow_rank"], "time.sleep(DECODE_STEP_S)")
    gather_line = line_of(_suite_files()["test_slow_rank"], "dist.all_gather(sizes, n)")
    assert re.fullmatch(rf"slow rank: rank 1 is busy outside any collective at {folder}test_slow_rank.py:"
                        rf"{sleep_line}( \(in generate_rollout\))?: time\.sleep\(DECODE_STEP_S\), after 0 "
                        rf"collectives in group default; rank 0 waited for the whole 3 s bound in all_gather #1 of "
                        rf"group default from {folder}test_slow_rank.py:{gather_line}", slow), slow


def test_launch_suite_is_green_and_diagnosed_in_plugin_mode(run_inner, pytester):
    files = _suite_files()
    for name, text in files.items():
        pytester.makepyfile(**{name: text})
    inner = run_inner("", "--nccl-world=2", "--junitxml=junit.xml", "--nccl-trace-dir=traces",
                      *[f"{n}.py" for n in files], name="conftest")
    outcomes = inner.result.parseoutcomes()
    assert outcomes.get("passed") == 2 and outcomes.get("xfailed") == 2, inner.text
    _check_suite_headlines(_junit_properties(pytester.path / "junit.xml"), "")
    _check_suite_stacks(pytester.path / "traces")


def test_launch_suite_is_green_and_diagnosed_under_torchrun(launch, pytester):
    run = launch("", "--junitxml=junit.xml", "--nccl-trace-dir=traces", "test_rendezvous.py", "test_slow_rank.py",
                 files=_suite_files())
    assert re.search(r"=+ 2 passed, 2 xfailed in [\d.]+s =+", run.report), run.text
    assert run.codes == [0], run.text
    _check_suite_headlines(_junit_properties(pytester.path / "junit.xml"), "")
    _check_suite_stacks(pytester.path / "traces")


# -- pieces, without processes ------------------------------------------------------------------

def test_detect_reads_the_launchers_environment():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    launch = spmd.detect("auto", env)
    assert (launch.rank, launch.world, launch.local_rank, launch.local_world) == (1, 4, 1, 2)
    assert (launch.launcher, launch.agent_store, launch.run_id, launch.attempt) == ("torchrun", True, "job", 2)
    assert spmd.detect("off", env) is None
    assert spmd.detect("auto", {"RANK": "0", "WORLD_SIZE": "2"}) is None  # no store address: plugin mode
    with pytest.raises(NcclUsageError, match="missing: MASTER_ADDR, MASTER_PORT"):
        spmd.detect("on", {"RANK": "0", "WORLD_SIZE": "2"})
    slurm = spmd.detect("on", {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                               "SLURM_JOB_ID": "7", "MASTER_ADDR": "n0", "MASTER_PORT": "1234"})
    assert (slurm.rank, slurm.world, slurm.local_rank, slurm.launcher, slurm.agent_store) == (3, 4, 1, "srun", False)
    with pytest.raises(NcclUsageError, match="RANK=4 is not within WORLD_SIZE=4"):
        spmd.detect("auto", {"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "1"})


def test_collection_difference_names_the_first_differing_test():
    same = Collected(["a::t1", "a::t2"])
    assert collection_difference({0: same, 1: same}, 2, []) is None
    other = Collected(["a::t1", "a::t3"])
    message = collection_difference({0: same, 1: same, 2: other}, 3, [])
    assert message.endswith("rank 2 collected 2 tests, rank 0 2; first difference at test #2: rank 0 "
                            "'a::t2', rank 2 'a::t3'")
    assert "rank 1 ended before collecting" in collection_difference({0: same}, 2, [1])


def test_abort_connections_releases_a_blocked_reader_and_keeps_the_store_port():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    port = listener.getsockname()[1]
    kept_client = socket.create_connection(("127.0.0.1", port))
    kept_server, _ = listener.accept()
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    client = socket.create_connection(other.getsockname())
    server, _ = other.accept()
    try:
        assert abort_connections({port}) >= 2  # both ends of the other connection
        client.settimeout(2)
        assert client.recv(1) == b""  # released at once: end of stream
        kept_client.sendall(b"x")
        assert kept_server.recv(1) == b"x"  # the store's connection still works
        listener.settimeout(0.01)
        with pytest.raises(TimeoutError):
            listener.accept()  # listening sockets are left alone
    finally:
        for s in (listener, kept_client, kept_server, other, client, server):
            s.close()
