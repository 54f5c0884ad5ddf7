"""``pytest-nccl explain`` on dumps in NCCL's schema made by ``benchmarks/fr_synth.py`` (a simulated
job: states follow from who reached what), for what gloo cannot write: every schema version and both
forms, point-to-point chains, coalesced blocks, states with durations, a rank behind, a missing
file, and the TP x DP cascade at 1,024 ranks. Each headline names the generator's culprit."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import fr_synth  # noqa: E402

from pytest_nccl.explain.cli import main  # noqa: E402


def explain(folder, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*args, str(folder)], out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def dumps(tmp_path, **kw) -> tuple[str, dict]:
    kw.setdefault("ranks", 32)
    kw.setdefault("tp", 4)
    kw.setdefault("entries", 120)
    folder = tmp_path / f"{kw['scenario']}-{kw.get('version', 'x')}-{kw.get('fmt', 'pickle')}"
    return str(folder), fr_synth.generate(str(folder), jobs=1, **kw)


@pytest.mark.parametrize("version", ["2.4", "2.7", "2.10"])
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_every_schema_version_and_form_names_the_culprit(tmp_path, version, fmt):
    folder, truth = dumps(tmp_path, scenario="tp_skip", version=version, fmt=fmt)
    code, out = explain(folder)
    assert code == 3, out
    head = out.splitlines()[1]
    culprit = truth["culprit"]
    assert head.startswith(f"CollectiveTimeout: rank {culprit} is in no collective since "), head
    tp = f"tp_{culprit // 4}[{culprit - culprit % 4}-{culprit - culprit % 4 + 3}]"
    assert "wait for all_reduce #" in head and f"of group {tp}" in head and "behind it, " in head, head
    if fmt == "pickle":
        assert "from /workspace/train.py:" in head  # the user's frame, under torch's own


def test_a_pipeline_stall_leads_through_the_transfers_to_the_rank_that_never_received(tmp_path):
    folder, truth = dumps(tmp_path, scenario="p2p", pp=4)
    code, out = explain(folder)
    assert code == 3, out
    head = out.splitlines()[1]
    culprit = truth["culprit"]
    assert f"the transfers it waits on lead to rank {culprit} (" in head, head
    assert f"on send(dst={culprit}, tag=0)): rank {culprit} is in no collective since" in head, head


def test_a_coalesced_block_is_one_collective_named_by_its_ops(tmp_path):
    folder, truth = dumps(tmp_path, scenario="coalesced")
    code, out = explain(folder)
    assert code == 3, out
    head = out.splitlines()[1]
    assert head.startswith(f"CollectiveTimeout: rank {truth['culprit']} is in no collective"), head
    assert "wait for _reduce_scatter_base #" in head and "REDUCE_SCATTER_coalesced" not in head, head


def test_states_with_durations_read_as_healthy_with_what_is_in_flight(tmp_path):
    folder, _ = dumps(tmp_path, scenario="states")
    code, out = explain(folder)
    assert code == 0, out
    assert "no rank diverges" in out and " in flight on ranks " in out


def test_a_rank_behind_is_named_with_how_far_it_got(tmp_path):
    folder, truth = dumps(tmp_path, scenario="behind")
    code, out = explain(folder)
    assert code == 3, out
    head = out.splitlines()[1]
    assert f"rank {truth['culprit']} is in no collective since all_reduce #" in head, head


def test_a_missing_file_is_named(tmp_path):
    folder, truth = dumps(tmp_path, scenario="missing")
    code, out = explain(folder, "--world", "32")
    assert code == 3, out
    assert f"rank {truth['missing']} left no dump" in out.splitlines()[1]
    assert f"note: no dump from rank {truth['missing']}" in out


def test_the_cascade_at_1024_ranks_is_one_finding(tmp_path):
    folder, truth = dumps(tmp_path, scenario="tp_skip", ranks=1024, tp=8, entries=40)
    code, out = explain(folder, "--json")
    assert code == 3, out
    diag = json.loads(out)["diagnosis"]
    culprit = truth["culprit"]
    first = culprit - culprit % 8
    stuck = f"tp_{first // 8}[{first}-{first + 7}]"
    assert diag["ranks"] == [culprit] and diag["group"] == stuck, diag
    behind = truth["waits"]["0"]  # rank 0 is in another TP group: it waits in its DP group
    assert diag["headline"].endswith(f"behind it, ranks 0-{first - 1},{first + 8}-1023 wait in _reduce_scatter_base "
                                     f"#{behind['seq']} of dp_* for members of {stuck}"), diag["headline"]
