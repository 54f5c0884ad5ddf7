"""vLLM's own weight-sync groups under ``pytest-nccl watch`` (issue 46): TRL's GRPO server mode makes
a ``StatelessProcessGroup`` (a TCPStore, outside c10d) and a ``PyNcclCommunicator`` over it; each
update is ``broadcast(weights, src=rank)`` then ``group.barrier()``. The watch names a member that
never connected, a call a member never entered, a store barrier that timed out, each with its line,
within ``--timeout`` (plus a loaded runner's slack, SLACK_S) of the last step any member made; a
healthy sync is untouched.

- the rule, on data (``core.sidecalls.judge``);
- real jobs (``tests/watch/vllm_sync_job.py``) at world 2 and 3 (the trainer and 1 or 2 server
  workers): vLLM's real ``StatelessProcessGroup`` and the CPU stand-in of ``PyNcclCommunicator``
  (``pytest_nccl.testing.pynccl_standin``), the trainer's lines as TRL writes them (``plain``) or
  TRL's own ``VLLMClient`` (``trl``: TRL before its weight-transfer engine, 0.19.1 tested) against
  an HTTP stand-in of ``trl vllm-serve``. Skipped without vLLM; the ``trl`` ones without such a TRL
  (``PYTEST_NCCL_TRL_PATH``: a directory holding it, e.g. made with ``pip install --no-deps --target
  DIR trl==0.19.1``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from pathlib import Path

import pytest
from watch_support import JOBS, free_port, line_in, run_watch

from pytest_nccl.core.sidecalls import CallState, SideCall, judge, notice
from pytest_nccl.watch.engine.outcome import no_rank_line, notice_after

JOB = JOBS / "vllm_sync_job.py"
TIMEOUT = 8
STORE = "127.0.0.1:51216"


def note(member, state=CallState.IDLE, seq=0, op="", since=100.0, world=3, store=STORE, **kw):
    return SideCall(pid=10 + member, store=store, world=world, member=member, state=state.value, since=since,
                    seq=seq, op=op, site=kw.pop("site", "trl/extras/vllm_client.py:282"),
                    created_at="trl/extras/vllm_client.py:259", **kw)


def test_members_that_never_connected_after_the_timeout():
    notes = [note(0, CallState.CREATING), note(2, CallState.IN_CALL, 1, "broadcast_obj", since=101.0)]
    assert judge(notes, 108.9, TIMEOUT) is None  # nothing moved for 7.9 s only
    found = judge(notes, 109.0, TIMEOUT)
    assert found is not None and found.headline == (
        "2 of 3 members joined vLLM's weight-sync group at 127.0.0.1:51216; member 1 never connected (the "
        "others waited 8 s, --timeout: 0: pid 10, 2: pid 12); created at trl/extras/vllm_client.py:259")
    assert "  member 0 (pid 10): still in the group's creation at trl/extras/vllm_client.py:259" in found.report


def test_a_broadcast_a_member_never_entered():
    notes = [note(0, CallState.IN_CALL, 4, "broadcast", detail="[4] float32 src=2"),
             note(1, CallState.IN_CALL, 4, "broadcast", detail="[4] float32 src=2"),
             note(2, CallState.IN_CALL, 4, "barrier", site="train.py:9")]
    found = judge(notes, 108.0, TIMEOUT)
    assert found is not None and found.headline == (
        "member 2 never entered broadcast #4 of vLLM's weight-sync group at 127.0.0.1:51216: member 2 is in "
        "barrier #4 from train.py:9; members 0,1 waited 8 s (--timeout) with no progress in broadcast #4 [4] "
        "float32 src=2 from trl/extras/vllm_client.py:282")


def test_a_store_barrier_that_timed_out_is_a_verdict_at_once():
    notes = [note(0, CallState.FAILED, 5, "barrier", error="RuntimeError: Barrier timed out after 30.00 seconds"),
             note(1, CallState.IDLE, 4, "broadcast", site="job.py:3", world=2)]
    notes[0].world = 2
    assert judge(notes, 100.5, TIMEOUT) is None  # a retry may follow (code that catches it): not yet
    assert judge(notes, 100.5, TIMEOUT, alive={10: False}) is not None  # the member's process ended
    found = judge(notes, 101.0, TIMEOUT)
    assert found is not None and found.headline == (
        "barrier #5 of vLLM's weight-sync group at 127.0.0.1:51216 failed on member 0: RuntimeError: Barrier "
        "timed out after 30.00 seconds (from trl/extras/vllm_client.py:282); member 1 never entered it (1: "
        "outside the group after broadcast #4 from job.py:3)")


def test_a_root_past_its_broadcast_entered_it_and_healthy_groups_say_nothing():
    """A root's broadcast returns before its receivers have the data: it is past it, not missing."""
    slow = [note(0, CallState.IN_CALL, 4, "broadcast", world=2), note(1, CallState.IN_CALL, 5, "barrier", world=2)]
    found = judge(slow, 200.0, TIMEOUT)
    assert found is not None and found.headline.startswith("no member completed broadcast #4 of vLLM's"), found
    idle = [note(m, CallState.IDLE, 5, "barrier") for m in range(3)]
    assert judge(idle, 1e9, TIMEOUT) is None
    # a server listening on every address and its client: one group (the port names the store)
    split = [note(0, CallState.CREATING, store="0.0.0.0:51216", world=2)]
    assert "member 1 never connected" in judge(split, 200.0, TIMEOUT).headline
    assert "at 127.0.0.1:51216" in judge(split + [note(1, CallState.IN_CALL, 1, "broadcast_obj", world=2)],
                                         200.0, TIMEOUT).headline
    # the server's workers under another watch: the trainer's watch does not call them absent
    trainer = [note(2, CallState.IN_CALL, 5, "barrier", since=100.0)]
    assert judge(trainer, 107.0, TIMEOUT) is None
    assert judge(trainer, 108.0, TIMEOUT).headline == (
        "member 2 waited 8 s (--timeout) with no progress in barrier #5 of vLLM's weight-sync group at "
        "127.0.0.1:51216 from trl/extras/vllm_client.py:282; members 0,1 are not seen by this watch (a process of "
        "another command or node)")
    assert SideCall.decode({"world": "x"}) is None and SideCall.decode([]) is None
    assert SideCall.decode(note(1).to_dict()) == note(1)


def test_a_wait_is_said_once_at_15_s_as_the_verdict_will_read_and_the_verdict_waits_for_the_timeout():
    """As a c10d side group's creation (``outcome.side_group_notice``): the same 15 s, said once per
    group, not where --timeout comes as soon (``outcome.notice_after``)."""
    after = notice_after(300.0)
    assert after == 15.0 and notice_after(15.0) is None
    skipped = [note(0, CallState.IN_CALL, 4, "broadcast", detail="[4] float32 src=2"),
               note(1, CallState.IN_CALL, 4, "broadcast", detail="[4] float32 src=2"),
               note(2, CallState.IN_CALL, 4, "barrier", since=101.0, site="train.py:9")]
    said: set = set()
    assert notice(skipped, 115.9, after, 300.0, said) is None  # nothing moved for 14.9 s only
    assert notice(skipped, 116.0, after, 300.0, said) == (
        "member 2 has not entered broadcast #4 of vLLM's weight-sync group at 127.0.0.1:51216: member 2 is in "
        "barrier #4 from train.py:9; members 0,1 waited 15 s with no progress in broadcast #4 [4] float32 src=2 "
        "from trl/extras/vllm_client.py:282; a verdict at --timeout (300 s) unless the group moves on")
    assert notice(skipped, 130.0, after, 300.0, said) is None  # said once
    assert judge(skipped, 130.0, 300.0) is None  # no verdict yet
    joining = [note(0, CallState.CREATING), note(2, CallState.IN_CALL, 1, "broadcast_obj")]
    assert notice(joining, 115.0, after, 300.0, set()) == (
        "2 of 3 members joined vLLM's weight-sync group at 127.0.0.1:51216; member 1 not connected after 15 s; "
        "created at trl/extras/vllm_client.py:259; a verdict at --timeout (300 s) unless it connects")
    trainer = [note(2, CallState.IN_CALL, 5, "barrier")]
    assert notice(trainer, 115.0, after, 300.0, set()) == (
        "member 2 waited 15 s with no progress in barrier #5 of vLLM's weight-sync group at 127.0.0.1:51216 from "
        "trl/extras/vllm_client.py:282; members 0,1 are not seen by this watch (a process of another command or "
        "node); a verdict at --timeout (300 s) unless the group moves on")
    slow = [note(0, CallState.IN_CALL, 4, "broadcast", world=2), note(1, CallState.IN_CALL, 5, "barrier", world=2)]
    assert notice(slow, 115.0, after, 300.0, set()).startswith(
        "no member has completed broadcast #4 of vLLM's weight-sync group at 127.0.0.1:51216: member 0 waited 15 s")
    # healthy (idle) and raised (the verdict's at once) groups: no notice
    assert notice([note(m, CallState.IDLE, 5, "barrier") for m in range(3)], 1e9, after, 300.0, set()) is None
    raised = [note(0, CallState.FAILED, 5, "barrier", world=1, error="RuntimeError: x")]
    assert notice(raised, 200.0, after, 300.0, set()) is None


def test_processes_that_reported_through_a_vllm_group_are_no_job_without_ranks():
    """A job whose only group is vLLM's (``trl vllm-serve``'s side) reported: nothing to say at its end."""
    assert no_rank_line(3, side_callers=3) is None and no_rank_line(3, members=1, side_callers=2) is None
    assert no_rank_line(3).startswith("no rank reported: 3 processes imported torch")


# -- real jobs ------------------------------------------------------------------------------------------

def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def vllm_paths() -> list[str] | None:
    """Where vLLM comes from for the jobs: ``PYTEST_NCCL_VLLM_PATH``, a directory made with ``pip install
    --no-deps --target DIR vllm==0.33.0 pyzmq msgspec cloudpickle psutil`` (vLLM installed without its
    dependencies into the test environment itself would make TRL's GRPO trainer, which imports vLLM
    whenever it finds it, fail to import); else the environment's own ([]); None: nowhere."""
    named = os.environ.get("PYTEST_NCCL_VLLM_PATH")
    if named:
        return [named] if Path(named, "vllm", "__init__.py").is_file() else None
    return [] if _has("vllm") else None


needs_vllm = pytest.mark.skipif(vllm_paths() is None, reason="vLLM is not installed: pip install --no-deps "
                                "--target DIR vllm==0.33.0 pyzmq msgspec cloudpickle psutil, and set "
                                "PYTEST_NCCL_VLLM_PATH=DIR")


def trl_path() -> str | None:
    """A directory whose TRL's client makes vLLM's group itself (``StatelessProcessGroup.create``)."""
    named = os.environ.get("PYTEST_NCCL_TRL_PATH")
    spec = importlib.util.find_spec("trl") if not named else None
    roots = [named] if named else [os.path.dirname(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        client = Path(root, "trl", "extras", "vllm_client.py")
        if client.is_file() and "StatelessProcessGroup.create" in client.read_text():
            return root
    return None


def watch_sync(tmp_path: Path, case: str, how: str, workers: int, timeout: float = TIMEOUT):
    if how == "trl" and trl_path() is None:
        pytest.skip("no TRL whose VLLMClient makes vLLM's group itself: set PYTEST_NCCL_TRL_PATH to a directory "
                    "made with `pip install --no-deps --target DIR trl==0.19.1`")
    extra = [str(free_port())] if how == "trl" else []
    paths = [*(vllm_paths() or []), *([trl_path()] if how == "trl" else [])]
    started = time.time()
    run = run_watch(tmp_path, ["python", str(JOB), case, how, str(workers), str(free_port()), *extra],
                    "--timeout", f"{timeout:g}", pythonpath=paths)
    return run, started + run.elapsed


SLACK_S = 12  # seconds past --timeout a loaded runner may take to decide


def assert_verdict(run, ended_at: float, pattern: str, timeout: float = TIMEOUT) -> None:
    assert run.code == 3, run.text
    assert "pytest-nccl watch: diagnosed (side group) =====" in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert re.match(r"pytest-nccl watch: verdict \(exit 3\): " + pattern, last), last
    s = run.summary
    assert s is not None and s["verdict"] and s["exit_code"] == 3 and s["ended_by_watch"], s
    assert re.match(pattern, s["headline"]) and s["headline"] == s["peers_missing"], s
    # decided within --timeout of the last step a member made, plus a loaded runner's slack (two
    # watches and three members on two cores took 14.6 s of a --timeout of 8 in a clean CI run here)
    events = [float(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("event ")]
    assert events and ended_at - max(events) < timeout + SLACK_S, (ended_at - max(events), run.stdout)


GROUP = r"vLLM's weight-sync group at 127\.0\.0\.1:\d+"
SITE = re.escape(str(JOB))


@needs_vllm
@pytest.mark.parametrize("how,workers", [("plain", 2), ("trl", 1)])
def test_a_worker_that_never_joins(tmp_path, how, workers):
    run, ended_at = watch_sync(tmp_path, "never-joins", how, workers)
    world, never = workers + 1, workers - 1
    site = f"{SITE}:{line_in(JOB, 'pg = StatelessProcessGroup.create(host=host')}"
    assert_verdict(run, ended_at, rf"{world - 1} of {world} members joined {GROUP}; member {never} never connected "
                   rf"\(the others waited {TIMEOUT} s, --timeout: .*\); created at ")
    if how == "plain":
        assert re.search(rf"created at {site}\b", run.stderr), run.stderr
    else:  # the group as TRL's client made it
        assert re.search(r"created at \S*trl/extras/vllm_client\.py:\d+ <- ", run.stderr), run.stderr


@needs_vllm
@pytest.mark.parametrize("how,workers", [("plain", 1), ("trl", 2)])
def test_a_broadcast_the_trainer_skipped(tmp_path, how, workers):
    run, ended_at = watch_sync(tmp_path, "skip-broadcast", how, workers)
    trainer = workers
    members = "member 0" if workers == 1 else "members 0,1"
    worker_site = f"{SITE}:{line_in(JOB, 'self.pynccl_comm.broadcast(weight, src=self.client_rank)')}"
    barrier = f"{SITE}:{line_in(JOB, 'comm.group.barrier()  # BARRIER')}" if how == "plain" else \
        f"{SITE}:{line_in(JOB, 'client.pynccl_comm.group.barrier()  # SKIPPED')}"
    assert_verdict(run, ended_at, rf"member {trainer} never entered broadcast #4 of {GROUP}: member {trainer} is in "
                   rf"barrier #4 from {barrier}; {members} waited {TIMEOUT} s \(--timeout\) with no progress in "
                   rf"broadcast #4 \[4\] float32 src={trainer} from {worker_site}")


@needs_vllm
@pytest.mark.parametrize("case", ["skip-broadcast", "never-joins"])
def test_a_wait_is_said_at_15_s_then_the_verdict_at_the_timeout(tmp_path, case):
    """With --timeout past the 15 s notice (as a c10d side group's creation is tested), the line comes
    first, once, naming the member, the call and the lines; the verdict at --timeout."""
    timeout = 22
    run, ended_at = watch_sync(tmp_path, case, "plain", 1, timeout=timeout)
    if case == "skip-broadcast":
        barrier, broadcast = line_in(JOB, "comm.group.barrier()  # BARRIER"), line_in(
            JOB, "self.pynccl_comm.broadcast(weight, src=self.client_rank)")
        said = (f"pytest-nccl watch: member 1 has not entered broadcast #4 of {GROUP}: member 1 is in barrier #4 "
                f"from {SITE}:{barrier}; member 0 waited 15 s with no progress in broadcast #4 \\[4\\] float32 "
                f"src=1 from {SITE}:{broadcast}; a verdict at --timeout \\(22 s\\) unless the group moves on$")
        verdict = rf"member 1 never entered broadcast #4 of {GROUP}: "
    else:
        said = (f"pytest-nccl watch: 1 of 2 members joined {GROUP}; member 0 not connected after 15 s; created at "
                f"{SITE}:{line_in(JOB, '# CREATE')}; a verdict at --timeout \\(22 s\\) unless it connects$")
        verdict = rf"1 of 2 members joined {GROUP}; member 0 never connected "
    assert_verdict(run, ended_at, verdict, timeout=timeout)
    lines = run.stderr.splitlines()
    at = [i for i, line in enumerate(lines) if re.match(said, line)]
    assert len(at) == 1 and run.stderr.count("after 15 s") + run.stderr.count("waited 15 s") == 1, run.stderr
    assert at[0] < next(i for i, line in enumerate(lines) if "diagnosed (side group)" in line), run.stderr


@needs_vllm
@pytest.mark.parametrize("how,workers", [("plain", 2), ("trl", 1)])
def test_a_store_barrier_that_timed_out(tmp_path, how, workers):
    """The store barrier's own bound (3 s here) ends before --timeout: the verdict at once."""
    run, ended_at = watch_sync(tmp_path, "barrier-timeout", how, workers, timeout=30)
    trainer = workers
    barrier = f"{SITE}:{line_in(JOB, 'self.pynccl_comm.group.barrier(')}"
    assert_verdict(run, ended_at, rf"barrier #5 of {GROUP} failed on member 0: RuntimeError: Barrier timed out "
                   rf"after 3\.00 seconds \(from {barrier}\); member {trainer} never entered it \({trainer}: outside "
                   rf"the group after broadcast #4 from ", timeout=3)


def watch_lines(run) -> list:
    """What the watch said of the job, besides its first line ('watching ...')."""
    return [line for line in run.stderr.splitlines()
            if line.startswith("pytest-nccl watch: ") and "watching" not in line]


@needs_vllm
@pytest.mark.parametrize("how,workers", [("plain", 2), ("trl", 1)])
def test_a_healthy_sync_is_untouched(tmp_path, how, workers):
    """No process makes a default group: the members reported through their vLLM group's notes, and
    the job ends as a healthy one does, with nothing said (before: 'no rank reported')."""
    run, _ = watch_sync(tmp_path, "good", how, workers)
    assert run.code == 0, run.text
    assert watch_lines(run) == [], run.stderr
    assert "=====" not in run.stderr and "never entered" not in run.stderr, run.stderr
    assert "never connected" not in run.stderr and "failed on member" not in run.stderr, run.stderr
    assert run.stdout.count(" got w1 [2.0, 2.0, 2.0, 2.0]") == workers and "synced" in run.stdout, run.text
    s = run.summary
    assert s is not None and not s["verdict"] and s["exit_code"] == 0 and not s["peers_missing"], s


def watch_two_commands(tmp_path: Path, case: str, workers: int = 1, **env):
    """``trl vllm-serve``'s stand-in under one watch, TRL's trainer under another, at once."""
    import threading

    if trl_path() is None:
        pytest.skip("no TRL whose VLLMClient makes vLLM's group itself: set PYTEST_NCCL_TRL_PATH to a directory "
                    "made with `pip install --no-deps --target DIR trl==0.19.1`")
    ports = [str(free_port()), str(free_port())]
    runs: dict = {}

    def one(how: str, paths) -> None:
        where = tmp_path / how
        where.mkdir()
        started = time.time()
        run = run_watch(where, ["python", str(JOB), case, how, str(workers), *ports], "--timeout", f"{TIMEOUT:g}",
                        pythonpath=paths, **env)
        runs[how] = (run, started + run.elapsed)

    threads = [threading.Thread(target=one, args=("trl-server", vllm_paths())),
               threading.Thread(target=one, args=("trl-trainer", [*(vllm_paths() or []), trl_path()]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs["trl-server"], runs["trl-trainer"]


# the two watches met in the group's store (``watch/engine/sidejoin.py``'s trace)
JOINED = re.compile(r"^\[watch [\d.]+\] side group \S+: 2 watches publish there$", re.M)


@needs_vllm
def test_two_commands_each_under_its_own_watch_healthy_are_untouched(tmp_path):
    """The server's command (``trl vllm-serve``) makes no c10d group at all: its watch ends as a healthy
    job's does, as the trainer's; the two watches met in the group's store and left it untouched."""
    for run, _ in watch_two_commands(tmp_path, "good", PYTEST_NCCL_WATCH_DEBUG="1"):
        assert run.code == 0 and "=====" not in run.stderr and "synced" in run.stdout, run.text
        assert watch_lines(run) == [], run.stderr
        assert JOINED.search(run.stderr), run.stderr
        s = run.summary
        assert s is not None and not s["verdict"] and s["exit_code"] == 0 and not s["peers_missing"], s


def assert_one_verdict(server, server_end, trainer, trainer_end, pattern: str) -> str:
    """Both watches give the group's one verdict, in the same words, each within --timeout (+ SLACK_S) of
    the last step a member made; the members of the other command are no longer 'not seen'."""
    assert_verdict(server, server_end, pattern)
    assert_verdict(trainer, trainer_end, pattern)
    heads = [run.stderr.strip().splitlines()[-1] for run in (server, trainer)]
    assert heads[0] == heads[1], heads
    for run in (server, trainer):
        assert "not seen by this watch" not in run.stderr, run.stderr
    # the store's host (the server's worker 0) ended last: the trainer's call never saw it go
    assert "Connection was likely closed" not in trainer.stderr, trainer.stderr
    return heads[0]


@needs_vllm
def test_two_commands_each_under_its_own_watch_give_one_verdict_on_a_skipped_broadcast(tmp_path):
    """The trainer (member 1, its own command) skips a broadcast: both watches name the server worker's
    wait in the broadcast, with its line, and the trainer's barrier, with its line."""
    (server, server_end), (trainer, trainer_end) = watch_two_commands(tmp_path, "skip-broadcast")
    worker_site = f"{SITE}:{line_in(JOB, 'self.pynccl_comm.broadcast(weight, src=self.client_rank)')}"
    barrier = f"{SITE}:{line_in(JOB, 'client.pynccl_comm.group.barrier()  # SKIPPED')}"
    assert_one_verdict(server, server_end, trainer, trainer_end,
                       rf"member 1 never entered broadcast #4 of {GROUP}: member 1 is in barrier #4 from {barrier}; "
                       rf"member 0 waited {TIMEOUT} s \(--timeout\) with no progress in broadcast #4 \[4\] float32 "
                       rf"src=1 from {worker_site}$")
    for run in (server, trainer):  # where each member is, of both commands
        assert re.search(rf"^  member 0 \(pid \d+\): in broadcast #4 \[4\] float32 src=1 from {worker_site}$",
                         run.stderr, re.M), run.stderr
        assert re.search(rf"^  member 1 \(pid \d+\): in barrier #4 from {barrier}$", run.stderr, re.M), run.stderr


@needs_vllm
def test_two_commands_each_under_its_own_watch_give_one_verdict_on_a_member_that_never_connects(tmp_path):
    """The server's second worker (member 1) never joins; member 0 (the server's first worker, the
    store's host) and the trainer (member 2) wait in the group's creation: both watches count the
    two that joined and name the one that never did (before: each counted its own only)."""
    (server, server_end), (trainer, trainer_end) = watch_two_commands(tmp_path, "never-joins", workers=2)
    assert_one_verdict(server, server_end, trainer, trainer_end,
                       rf"2 of 3 members joined {GROUP}; member 1 never connected \(the others waited {TIMEOUT} s, "
                       rf"--timeout: 0: pid \d+, 2: pid \d+\); created at {SITE}:\d+")


@needs_vllm
def test_vllms_own_classes_are_wrapped_once_their_modules_ran_and_untouched_unwatched():
    """vLLM's real ``PyNcclCommunicator`` (NCCL: not run here) and ``StatelessProcessGroup`` get the
    wrappers the hook puts in place; outside a watch the group's calls pass through."""
    import subprocess
    import sys

    code = """
import importlib, os, torch
from pytest_nccl.rank import trace_vllm
os.environ.pop("PYTEST_NCCL_WATCH_DIR", None)
for name in trace_vllm.MODULES:
    trace_vllm.install(importlib.import_module(name))
    trace_vllm.install(importlib.import_module(name))  # twice: wrapped once
from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator as C
from vllm.distributed.utils import StatelessProcessGroup as G
assert all(getattr(vars(C)[op], trace_vllm.WRAPPED, False) for op in trace_vllm.COMM_OPS)
assert all(getattr(vars(G)[op], trace_vllm.WRAPPED, False) for op in trace_vllm.GROUP_OPS)
assert not getattr(getattr(vars(C)["broadcast"], "__wrapped__"), trace_vllm.WRAPPED, False)
from pytest_nccl.testing.pynccl_standin import PyNcclCommunicator as S
pg = G.create("127.0.0.1", int(os.environ["PORT"]), 0, 1)
t = torch.ones(2); S(pg).broadcast(t, src=0); pg.barrier()
print("ok", pg.all_gather_obj(3))
"""
    env = {**os.environ, "PORT": str(free_port())}
    env.pop("PYTEST_NCCL_WATCH_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join([*(vllm_paths() or []), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok [3]", done.stdout + done.stderr
