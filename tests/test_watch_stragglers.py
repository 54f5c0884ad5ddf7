"""``pytest-nccl watch`` on a healthy job: at its end the rank that arrived last at the collectives
is named, with how long the others waited (``core.stragglers``, from the journals); nothing is said
when the ranks are even."""

from __future__ import annotations

import textwrap

import pytest
from watch_support import run_watch, torchrun

JOB = """
    import sys, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    rank, slow = dist.get_rank(), float(sys.argv[1])
    for _ in range(20):
        if rank == dist.get_world_size() - 1:
            time.sleep(slow)  # the last rank computes longer before every collective
        t = torch.ones(4)
        dist.all_reduce(t)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("slow", [0.15, 0.0])
def test_straggler_named_at_the_end_of_a_healthy_job(tmp_path, slow):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    run = run_watch(tmp_path, torchrun("job.py", str(slow)), "--timeout", "60")
    assert run.code == 0 and run.summary is not None and not run.summary["verdict"], run.text
    found = run.summary["stragglers"]
    if slow:
        (item,) = found
        assert (item["group"], item["rank"], item["compared"]) == ("default", 1, 20), found
        assert item["last"] >= 18 and 20 * slow * 0.5 <= item["waited_s"] <= 20 * slow * 3, found
        assert "straggler: group default: rank 1 arrived last at" in run.stderr, run.stderr
        assert "the others waited" in run.stderr
    else:
        assert found == [] and "straggler" not in run.stderr, run.text
