"""The watch turns NCCL's dump-on-timeout on, into its job's directory, and reads those files for its
verdict: a rank the watchdog ended answers nothing, its dump is what is left of it. The job here
ends its ranks as the watchdog does (each writes its dump where the watch asked, then SIGABRT), on
gloo; ``pytest-nccl explain`` on the trace folder's dumps names the rank that skipped."""

from __future__ import annotations

import io
import os

import pytest
from watch_support import REPO, run_watch, torchrun

from pytest_nccl.explain.cli import main as explain

JOB = REPO / "tests" / "watch" / "watchdog_dump_job.py"


@pytest.mark.parametrize("linger", ["0", "3"])  # rank 0 gone with rank 1; alive when the watch asks
def test_the_watch_reads_the_dumps_nccls_watchdog_wrote_for_its_verdict(tmp_path, linger):
    """Where rank 0 outlives rank 1 the watch takes its dump live, rank 1's from its file: two
    times, and rank 0's all_reduce may by then have failed (marked completed); explain gives the
    watch's verdict either way."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):
        pytest.skip(f"torch {torch.__version__} does not record gloo in its Flight Recorder")
    trace = tmp_path / "trace"
    run = run_watch(tmp_path, torchrun(str(JOB)), "--timeout", "60", "--trace-dir", str(trace), JOB_STALL_S="3",
                    JOB_LINGER_RANK="0", JOB_LINGER_S=linger)
    assert run.code == 3, run.text
    assert "rank 0: dump on timeout=1 into /" in run.stdout and "fr_dump_rank_" in run.stdout, run.stdout
    assert "killed by SIG" in run.stderr, run.stderr
    folders = list(trace.glob("*.fr"))
    assert len(folders) == 1, list(trace.iterdir())
    assert sorted(p.name for p in folders[0].iterdir()) == ["rank_0", "rank_1"]
    out, err = io.StringIO(), io.StringIO()
    code = explain([str(folders[0])], out=out, err=err)
    assert code == 3, out.getvalue() + err.getvalue()
    head = out.getvalue().splitlines()[2]
    # which rank the abort reaches first is the job's race: rank 1 is named either way
    assert head.split(": ", 1)[1].startswith("rank 1 killed by ") and "all_reduce #3 of group default" in head, head
    # the same verdict as the watch's (paths are said relative to where each ran)
    assert head.split(": ", 1)[1] == run.summary["headline"].replace(f"{REPO}{os.sep}", ""), (head, run.summary)
