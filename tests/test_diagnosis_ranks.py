"""The analysis on hand-written data: no torch, no processes."""

from collective_records import record, view

from pytest_nccl.core.diagnosis import Diagnosis, diagnose, first_divergence
from pytest_nccl.core.groups import rank_ranges
from pytest_nccl.core.journal import parse_journal
from pytest_nccl.core.records import RankView
from pytest_nccl.core.sites import short_site
from pytest_nccl.core.states import Kind
from pytest_nccl.views.report import format_divergence, format_table


def rec(rank, seq, op="all_reduce", shapes="[4]", state="completed", pg="default", t=None, **kw):
    return record(rank, seq, op, shapes, state, pg, t=seq if t is None else t, **kw)


def test_rank_left_names_the_first_to_leave_and_the_waiters():
    ranks = [view(r, "running", [rec(r, i) for i in range(1, 13)] + [rec(r, 13, "all_gather", "[2, 7]", "entered",
             site="/x/site-packages/trl/trainer/sft_trainer.py:512")]) for r in (0, 2, 3)]
    ranks.insert(1, view(1, "passed", [rec(1, i) for i in range(1, 13)], finished_at=0.5))
    d = diagnose(ranks, "decided", 60)
    assert d.kind == "rank-left" and d.exception_name == "CollectiveMismatch"
    assert d.headline == ("rank 1 left the test (passed) after 12 collectives in group default; ranks 0,2,3 "
                          "wait in all_gather #13 of group default from trl/trainer/sft_trainer.py:512")


def test_shape_mismatch_with_an_aborted_rank():
    ranks = [view(0, "dead", [rec(0, 1, "all_gather", "[2, 7, 32]", "entered")], signal_name="SIGABRT"),
             view(1, "failed", [rec(1, 1, "all_gather", "[2, 5, 32]", "entered")],
                  message="RuntimeError: [/src/gloo/pair.cc:537] Read error: Connection reset by peer")]
    d = diagnose(ranks, "decided", 60)
    assert d.kind == "shape-mismatch" and d.exception_name == "CollectiveMismatch"
    # rank 1's lost connection is the abort's consequence, and whether it raised before the verdict is
    # timing: the headline names the cause only, the same every run
    assert d.headline == ("shape mismatch in all_gather #1 of group default: rank 0 [2, 7, 32], "
                          "rank 1 [2, 5, 32] (from /w/test_x.py:5); rank 0 killed by SIGABRT inside it")


def test_majority_names_the_odd_rank():
    ranks = [view(r, "running", [rec(r, 1, shapes="[3]" if r == 2 else "[4]", state="entered")]) for r in range(4)]
    d = diagnose(ranks, "timeout", 10)
    assert d.ranks == [2] and "ranks 0,1,3 [4], rank 2 [3]" in d.headline


def test_dtype_and_op_mismatch():
    a = [view(0, "passed", [rec(0, 1)]), view(1, "passed", [rec(1, 1)])]
    a[1].records[0].dtype = "bfloat16"
    assert diagnose(a, "completed", 10).kind == "dtype-mismatch"
    b = [view(0, "running", [rec(0, 1, "all_reduce", state="entered")]),
         view(1, "running", [rec(1, 1, "broadcast", state="entered")])]
    d = diagnose(b, "decided", 10)
    assert d.kind == "op-mismatch" and "rank 0 all_reduce, rank 1 broadcast" in d.headline


def test_true_hang_slow_rank_and_timeout_outside_collectives():
    hang = [view(r, "running", [rec(r, 1, state="entered")]) for r in range(2)]
    assert diagnose(hang, "timeout", 5).kind == "hang"
    slow = [view(0, "running", [rec(0, 1, state="entered")]),
            view(1, "running", [],
                 stack='Thread MainThread:\n  File "/w/test_x.py", line 9, in test_y\n    time.sleep(9)\n')]
    d = diagnose(slow, "timeout", 5)
    assert d.kind == "slow-rank" and d.exception_name == "CollectiveTimeout"
    # where it is and what it does there (its source line); the function's name goes when too long
    assert "rank 1 is busy outside any collective at /w/test_x.py:9: time.sleep(9)" in d.headline
    idle = [view(r, "running", []) for r in range(2)]
    assert diagnose(idle, "timeout", 5).kind == "timeout"


def test_a_rank_inside_a_torch_call_is_placed_at_the_user_line_that_called_it():
    """torch.cuda.synchronize() (or a Future's wait) holds the rank: the place is the test's line,
    not torch's own line inside the call (seen on an H200 with a kernel that never ends)."""
    stack = ('Thread MainThread:\n  File "/w/test_x.py", line 29, in test_y\n    torch.cuda.synchronize()  # STUCK\n'
             '  File "/site-packages/torch/cuda/__init__.py", line 1162, in synchronize\n'
             '    return torch._C._cuda_synchronize()\n')
    d = diagnose([view(0, "running", [rec(0, 1, state="completed")]), view(1, "running", [], stack=stack)],
                 "timeout", 8)
    assert "rank 1 is busy outside any collective at /w/test_x.py:29: torch.cuda.synchronize()" in d.headline, \
        d.headline
    only_torch = 'Thread MainThread:\n  File "/site-packages/torch/futures/__init__.py", line 9, in wait\n    x\n'
    d = diagnose([view(0, "running", []), view(1, "running", [], stack=only_torch)], "timeout", 8)
    assert "at torch/futures/__init__.py:9" in d.headline, d.headline


def test_subgroups_are_matched_among_their_members():
    ranks = [view(0, "running", [rec(0, 1, pg="pg1[0,1]", state="entered")]),
             view(1, "running", [rec(1, 1, pg="pg1[0,1]", state="entered")]),
             view(2, "passed", [rec(2, 1, pg="pg2[2,3]")]),
             view(3, "passed", [rec(3, 1, pg="pg2[2,3]")])]
    assert first_divergence(ranks) is None
    assert diagnose(ranks, "timeout", 5).kind == "hang"


def test_raised_died_and_skip_mismatch():
    raised = [view(0, "failed", [], message="ValueError: x"), view(1, "failed", [], message="ValueError: x")]
    assert diagnose(raised, "decided", 5).headline == "ranks 0,1 raised ValueError: x"
    died = [view(0, "dead", [], exit_code=3), view(1, "passed", [])]
    assert diagnose(died, "decided", 5).headline == "rank 0 exited with code 3"
    skip = [view(0, "skipped", [], message="why"), view(1, "passed", [])]
    assert diagnose(skip, "completed", 5).kind == "skip-mismatch"
    assert diagnose([view(0, "passed", [rec(0, 1)]), view(1, "passed", [rec(1, 1)])], "completed", 5) is None


def test_journal_survives_a_torn_last_line():
    text = ("E\tdefault\t1\tall_reduce\t0\t0.001\t[4]\tfloat32\t1\t/w/t.py:3\n"
            "C\tdefault\t1\t0.002\n"
            "E\tdefault\t2\tall_gather\t1\t0.003\t[4]\tfloat32\t2\t/w/t.py:4\n"
            "W\tdefault\t2\t0.004\n"
            "E\tdefault\t3\tbroad")
    records = parse_journal(text, rank=0)
    assert [(r.seq, r.op, r.state) for r in records] == [(1, "all_reduce", "completed"), (2, "all_gather", "waiting")]
    assert records[0].duration == 0.001
    assert RankView(0, records=records).current.seq == 2


def test_table_fits_120_columns_for_world_8_and_folds_the_prefix():
    ranks = [view(r, "running", [rec(r, i, "all_gather_into_tensor", "[1024, 4096]") for i in range(1, 40)]
                  + ([rec(r, 40, "all_gather_into_tensor", "[1024, 4096]", "entered")] if r != 5 else []))
             for r in range(8)]
    d = diagnose(ranks, "timeout", 5)
    table = format_table(ranks, d)
    assert max(len(line) for line in table.splitlines()) <= 120
    assert "37 matching collectives folded" in table
    marked = [line for line in table.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and marked[0].startswith(">>  #40 ag_tensor")
    cells = marked[0][8:].split()
    assert cells.count("-") == 1 and marked[0].index(" - ") > marked[0].index("ag_tensor") + 5 * 14 - 14


def test_short_site_strips_site_packages():
    assert short_site("/v/lib/python3.11/site-packages/accelerate/utils/operations.py:10 <- "
                      "/v/lib/python3.11/site-packages/trl/trainer/sft_trainer.py:512") == \
        "accelerate/utils/operations.py:10 <- trl/trainer/sft_trainer.py:512"


def test_headline_names_the_caller_behind_accelerate():
    site = ("/v/site-packages/accelerate/utils/operations.py:349 <- /v/site-packages/accelerate/accelerator.py:2539"
            " <- /v/site-packages/trl/trainer/sft_trainer.py:448 <- /w/test_sft.py:30")
    ranks = [view(0, "dead", [rec(0, 1, "all_gather", "[2, 7]", "entered", site=site)], signal_name="SIGABRT"),
             view(1, "running", [rec(1, 1, "all_gather", "[2, 5]", "entered", site=site)])]
    d = diagnose(ranks, "decided", 60)
    assert "(from trl/trainer/sft_trainer.py:448 <- /w/test_sft.py:30, via accelerate)" in d.headline


def test_gloo_size_mismatch_without_records_is_still_a_mismatch():
    """--nccl-trace=off: no journal, but gloo's own message in the dead rank's output."""
    out = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at " \
          "gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. Received data size doesn't match " \
          "expected size. 544 vs 132\n"
    ranks = [view(0, "dead", [], signal_name="SIGABRT", output=out), view(1, "running", [])]
    d = diagnose(ranks, "decided", 60)
    assert d.kind == "shape-mismatch" and d.exception_name == "CollectiveMismatch"
    assert d.headline.startswith("shape mismatch in a collective (gloo on rank 0: ")
    assert "rank 0 killed by SIGABRT" in d.headline


def test_a_wide_world_shows_one_column_per_distinct_history():
    ranks = [view(r, "running", [rec(r, i) for i in range(1, 30)] + ([rec(r, 30, state="entered")] if r != 77 else []))
             for r in range(128)]
    d = diagnose(ranks, "timeout", 15)
    table = format_table(ranks, d)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 120, table
    assert lines[1].split() == ["ranks", "0-76,78-127", "rank", "77"], table
    marked = [line for line in lines if line.startswith(">>")]
    assert marked == [">>  #30 all_reduce [4] ..                  -"], table
    text = format_divergence(d)
    assert "  ranks 0-76,78-127: all_reduce shapes=[4] dtype=float32 entered\n" in text, text
    assert text.endswith("  rank 77: never entered it") and text.count("\n") == 3, text


def test_a_wide_world_of_many_histories_keeps_the_diagnosed_ranks_and_names_the_rest():
    ranks = [view(r, "running", [rec(r, i) for i in range(1, 6)]
                  + [rec(r, 6, "all_gather", f"[{r % 12 + 1}]", "entered")]) for r in range(64)]
    d = Diagnosis(Kind.HANG, "rank 59 ...", [59], "default", 6)  # the last column by rank
    table = format_table(ranks, d)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 120, table
    assert [label.split(",")[0] for label in lines[1].split("ranks ")[1:]] == ["0", "1", "2", "3", "11"], table
    left = rank_ranges(r for r in range(64) if 4 <= r % 12 <= 10)
    assert lines[-1] == f"  ... 7 more distinct columns (ranks {left})"
