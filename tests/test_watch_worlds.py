"""Several default worlds in one watched job (OpenRLHF's trainer beside its vLLM engines' own worlds,
verl's worker groups on separate resource pools): each world's ranks write to a directory of their
own (``jobdir.world_dir``) and are judged apart. Before, the ranks 0 of two worlds wrote the same
``rank-0.json`` and journal: a healthy job read as a shape mismatch between the worlds."""

from __future__ import annotations

import re
import sys

from watch_support import JOBS, line_in, run_watch, untouched

from pytest_nccl.core import jobdir

JOB = JOBS / "two_worlds_job.py"


def test_each_world_has_a_directory_of_its_own(tmp_path):
    first = jobdir.world_dir(str(tmp_path), "store port 1, 2 ranks")
    second = jobdir.world_dir(str(tmp_path), "store port 2, 2 ranks")
    assert first == str(tmp_path) and second != first
    assert jobdir.world_dir(str(tmp_path), "store port 2, 2 ranks") == second  # its other ranks
    assert jobdir.world_dir(str(tmp_path), "store port 1, 2 ranks") == first
    assert jobdir.other_worlds(str(tmp_path)) == [second]
    assert jobdir.world_key(second) == "store port 2, 2 ranks"
    assert jobdir.rank_of("world") is None and jobdir.attempts(str(tmp_path)) == [0]
    assert not [n for n in jobdir.listdir(str(tmp_path)) if n.endswith(".tmp")]


def test_two_healthy_worlds_pass_untouched(tmp_path):
    run = run_watch(tmp_path, [sys.executable, str(JOB), "good"], "--timeout", "20")
    untouched(run)


def test_a_rank_that_leaves_early_in_one_world_is_named_in_that_world(tmp_path):
    run = run_watch(tmp_path, [sys.executable, str(JOB), "bad"], "--timeout", "8")
    assert run.code == 3, run.text
    assert (f"rank 1 exited normally after 9 collectives in group default; rank 0 waits in all_reduce #10 "
            f"of group default from {JOB}:{line_in(JOB, '# the step')}") in run.stderr, run.text
    assert "shape mismatch" not in run.stderr, run.text  # the engine's world is not mixed in


def test_another_world_is_judged_after_the_first_ended_clean(tmp_path):
    """The trainer's world is the attempt's first and ends clean; the engine's world goes on, and a
    rank of it leaves early: the verdict names that world."""
    run = run_watch(tmp_path, [sys.executable, str(JOB), "engine-bad"], "--timeout", "8")
    assert run.code == 3, run.text
    # the watch ends the job, or gloo's closed connection ends it first and the journals show it
    assert re.search(r"(diagnosed \(rank-left\) in|the journals of) another default world of this job \(store port ",
                     run.stderr), run.text
    assert (f"rank 1 exited normally after 11 collectives in group default; rank 0 waits in all_reduce #12 "
            f"of group default from {JOB}:{line_in(JOB, '# the step')}") in run.stderr, run.text


def test_ranks_outside_the_watch_are_unseen_never_not_started(tmp_path):
    """The engine's world has four ranks and two of them run outside this watch (another node; a
    process not started under it): their peers complete collectives with them, so they exist. The
    watch failed this healthy job with 'ranks 2,3 never created the default process group'."""
    run = run_watch(tmp_path, [sys.executable, str(JOB), "elsewhere"], "--timeout", "20")
    untouched(run)


def test_a_fault_among_ranks_outside_the_watch_names_them_unseen(tmp_path):
    """Rank 3, outside the watch, leaves one collective early: the verdict stands, and the ranks it
    cannot see are unseen in it, not 'never created the default process group'."""
    run = run_watch(tmp_path, [sys.executable, str(JOB), "elsewhere-bad"], "--timeout", "8")
    assert run.code == 3, run.text
    assert "ranks 2,3: unseen: runs outside this watch" in run.stderr, run.text
    assert "never created the default process group" not in run.stderr, run.text


def test_ranks_never_seen_are_outside_only_once_a_collective_completed(tmp_path):
    """The evidence, alone: ranks 0,1 of a world of 4 that only entered collective #1 say nothing of
    ranks 2,3 (they may never have started: named so); once #1 completed on one of them, ranks 2,3
    took part in it and run outside this watch (unseen)."""
    from collective_records import record

    from pytest_nccl.core.jobdir import RankInfo
    from pytest_nccl.core.referee import Referee
    from pytest_nccl.core.states import RankState, RecordState
    from pytest_nccl.watch.engine.follow import Followed, RemoteRank
    from pytest_nccl.watch.engine.monitor import Monitor

    monitor = Monitor(str(tmp_path), 8.0, connect=lambda info, decides: None)
    try:
        ranks = {r: Followed(r, RemoteRank(r, RankInfo(rank=r), None)) for r in (0, 1)}  # type: ignore[arg-type]
        for r, f in ranks.items():
            f.records = [record(r, 1, state=RecordState.ENTERED)]
        monitor.ranks, monitor.world, monitor.referee = ranks, 4, Referee(4, 8.0, 0.0)
        monitor._ranks_elsewhere()
        assert not monitor.other_nodes and monitor.report(2, None).state == RankState.NOT_STARTED
        ranks[1].records = [record(1, 1), record(1, 2, state=RecordState.ENTERED)]
        monitor._ranks_elsewhere()
        assert monitor.other_nodes and monitor.report(2, None).state == RankState.UNSEEN
    finally:
        monitor.close()
