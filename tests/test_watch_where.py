"""Where each rank of a running job is, unjudged (watch/engine/where.py): the lines SIGUSR1 and
``pytest-nccl where`` print, and ``--progress``'s line, on hand-built ranks."""

from collective_records import record

from pytest_nccl.core.records import RankView
from pytest_nccl.core.states import RankState
from pytest_nccl.watch.engine.where import RankPlace, lines, longest_wait, progress_line, slowest

STACK = 'Thread MainThread:\n  File "/w/train.py", line 8, in <module>\n    time.sleep(600)\n'


def place(rank, count, *, pending=False, waited=None, status=RankState.RUNNING, stack=""):
    records = [record(rank, s, site="train.py:6") for s in range(1, count + 1)]
    if pending:
        records.append(record(rank, count + 1, state="entered", site="train.py:9"))
    view = RankView(rank, status=status, records=records, stack=stack)
    last = next((r for r in reversed(records) if r.state == "completed"), None)
    return RankPlace(view, len(records), last, view.current if status == RankState.RUNNING else None, waited)


def test_each_rank_its_wait_or_its_line_then_the_slowest_and_the_longest_wait():
    places = [place(0, 3, pending=True, waited=5.14), place(1, 3, stack=STACK)]
    assert lines(places, 5.1) == [
        "where each rank is, 5.1 s after init_process_group (the job goes on):",
        "  rank 0: waits in all_reduce #4 of group default from train.py:9 for 5.1 s; 4 collectives, the last "
        "completed all_reduce #3 of group default from train.py:6",
        "  rank 1: is busy outside any collective at /w/train.py:8 (in <module>): time.sleep(600); 3 collectives, "
        "the last completed all_reduce #3 of group default from train.py:6",
        "  slowest: rank 1, 3 collectives (the most: 4)",
        "  longest wait: rank 0, 5.1 s in all_reduce #4 of group default from train.py:9",
    ]


def test_ranks_in_step_have_no_slowest_and_ended_ranks_are_said_as_they_ended():
    places = [place(0, 12, status=RankState.PASSED), place(1, 12), place(2, 12)]
    assert slowest(places) is None and longest_wait(places) is None
    text = lines(places, 3.0)
    assert text[1] == "  rank 0: passed; 12 collectives, the last completed all_reduce #12 of group default " \
                      "from train.py:6"
    assert not any("slowest" in line or "longest" in line for line in text)
    assert progress_line(places, 61.0) == "progress at 61 s: ranks 1,2 running, 12 collectives, 1 ended"


def test_the_progress_line_names_the_slowest_rank_and_the_longest_wait():
    places = [place(0, 1203, pending=True, waited=3.21), place(1, 1204, pending=True, waited=0.5),
              place(2, 1203, stack=STACK)]
    assert progress_line(places, 120.2) == (
        "progress at 120 s: ranks 0-2 running, 1203-1205 collectives; slowest rank 2 (1203); longest wait "
        "rank 0, 3.2 s in all_reduce #1204 of group default from train.py:9")


def test_before_any_rank_has_a_group_it_says_so():
    assert lines([], 0.4) == ["no rank has created its default process group yet (0.4 s)"]
    assert progress_line([], 2.0) == "progress at 2 s: no rank has created its default process group yet"
