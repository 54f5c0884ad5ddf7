"""``pytest-nccl explain`` on real dumps: gloo jobs under torchrun that stall and write their Flight
Recorder dumps as NCCL's dump-on-timeout does (``tests/fr_job.py``), one job per scenario, all
started at once. Each headline names the right rank, op, sequence number and line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):
    pytest.skip(f"torch {torch.__version__} does not record gloo in its Flight Recorder", allow_module_level=True)

from pytest_nccl.explain.cli import main  # noqa: E402

JOB = Path(__file__).with_name("fr_job.py")
WORLDS = {"skip": 2, "gone": 2, "op": 2, "subgroup": 4, "behind": 2, "missing": 2, "healthy": 4}


def line(name: str) -> int:
    """The line of ``fr_job.py`` marked ``# line: NAME``."""
    for i, text in enumerate(JOB.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# line: {name}"):
            return i
    raise LookupError(name)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, str]:
    """scenario -> the prefix its job's dumps were written under."""
    root = tmp_path_factory.mktemp("fr")
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1", FR_JOB_STALL_S="4")
    procs = {}
    for scenario, world in WORLDS.items():
        prefix = str(root / scenario / "nccl_trace_rank_")
        os.makedirs(os.path.dirname(prefix))
        procs[scenario] = (prefix, subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
             str(JOB), scenario, prefix], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True))
    deadline = time.monotonic() + 180
    out = {}
    for scenario, (prefix, proc) in procs.items():
        try:
            output, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            output, _ = proc.communicate()
            pytest.fail(f"the {scenario} job did not end:\n{output[-3000:]}")
        written = sorted(os.listdir(os.path.dirname(prefix)))
        assert len(written) == WORLDS[scenario], f"{scenario}: {written}\n{output[-3000:]}"
        out[scenario] = prefix
    os.remove(out["missing"] + "1")  # rank 1's dump is lost (a node that died with its disk)
    return out


def explain(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def headline(text: str) -> str:
    return text.splitlines()[1]


def test_a_rank_that_skips_a_collective_is_named_with_the_line_the_others_wait_at(dumps):
    code, out, _ = explain(dumps["skip"])
    assert code == 3, out
    head = headline(out)
    assert head.startswith("CollectiveTimeout: rank 1 is in no collective since all_reduce #2 of group default"), head
    assert f"fr_job.py:{line('step')}" in head
    assert "rank 0 waits in all_reduce #3 of group default from " in head and f"fr_job.py:{line('waits')}" in head


def test_a_collective_that_failed_once_a_rank_was_gone_is_where_the_survivor_waits(dumps):
    """rank 1 dumps and ends before rank 0 dumps: rank 0's all_reduce #3 then fails, and its dump
    marks it completed though rank 1 never entered it. Not two dumps of different times: the
    verdict reads #3 as where rank 0 waits, and says why."""
    code, out, _ = explain(dumps["gone"])
    assert code == 3, out
    head = headline(out)
    assert head.startswith("CollectiveTimeout: rank 1 is in no collective since all_reduce #2 of group default"), head
    assert "rank 0 waits in all_reduce #3 of group default from " in head and f"fr_job.py:{line('gonewaits')}" in head
    assert ("rank 0's all_reduce #3 of group default is marked completed, but rank 1 never entered it: it ended "
            "with an error once rank 1 was gone") in out


def test_an_op_mismatch_names_both_ops_and_the_position(dumps):
    code, out, _ = explain(dumps["op"])
    assert code == 3, out
    head = headline(out)
    assert head.startswith("CollectiveMismatch: op mismatch at collective #3 of group default: "
                           "rank 0 all_reduce, rank 1 broadcast"), head
    assert f"fr_job.py:{line('opwaits')}" in head and f"fr_job.py:{line('odd')}" in head


def test_a_hang_in_one_of_two_subgroups_blames_only_that_group(dumps):
    code, out, _ = explain(dumps["subgroup"])
    assert code == 3, out
    head = headline(out)
    assert "rank 3 is in no collective" in head and "rank 2 waits in all_reduce #2 of group tp_1[2,3]" in head, head
    assert f"fr_job.py:{line('subwait')}" in head
    assert "rank 0" not in head and "rank 1 " not in head and "tp_0" not in head


def test_a_rank_several_collectives_behind_is_named_with_how_far_it_got(dumps):
    code, out, _ = explain(dumps["behind"])
    assert code == 3, out
    head = headline(out)
    assert "rank 1 is in no collective since all_reduce #2 of group default" in head, head
    assert "after 2 collectives in group default" in head
    assert "rank 0 waits in all_reduce #3 of group default" in head and f"fr_job.py:{line('ahead')}" in head


def test_a_missing_dump_is_named_and_the_others_verdict_says_what_it_leaves_open(dumps):
    code, out, _ = explain("--world", "2", dumps["missing"])
    assert code == 3, out
    head = headline(out)
    assert ": rank 1 left no dump; rank 0 waits in all_reduce #3 of group default from " in head, head
    assert "note: no dump from rank 1: where it was is not known" in out


def test_healthy_dumps_say_no_rank_diverges_and_each_groups_progress(dumps):
    code, out, _ = explain(dumps["healthy"])
    assert code == 0, out
    assert "no rank diverges" in out.splitlines()[1]
    assert "group default: last completed" in out
    for group in ("tp_0[0,1]", "tp_1[2,3]"):
        assert f"group {group}: last completed all_reduce #3" in out


def test_the_command_reads_a_folder_and_prints_json(dumps):
    folder = os.path.dirname(dumps["skip"])
    proc = subprocess.run([sys.executable, "-m", "pytest_nccl", "explain", "--json", folder],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    data = json.loads(proc.stdout)
    assert data["diagnosis"]["ranks"] == [1] and data["diagnosis"]["group"] == "default"
    assert data["ranks"][0]["current"]["op"] == "all_reduce" and data["ranks"][0]["current"]["seq"] == 3


def test_the_trace_dir_holds_the_swimlane_page_and_the_timeline(dumps, tmp_path):
    code, _, err = explain("--trace-dir", str(tmp_path), dumps["skip"])
    assert code == 3
    written = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith(".html") for n in written) and any(n.endswith(".trace.json") for n in written), written
    assert "wrote" in err
