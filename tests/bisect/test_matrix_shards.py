"""The release matrix over a CI job matrix (docs/ci.md): ``--shard K/N`` runs one job's share of the
releases, ``--merge`` makes one results file and page of the shards, equal cell by cell to the
matrix one machine runs, and refuses in one line shards made for other pytest arguments or another
torch. On the fake index, env builder and pytest runner of test_matrix_cli.py (no envs, no network)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from test_matrix_cli import FakeRunner, drive

from pytest_nccl.bisect.matrix import cli as matrix_cli
from pytest_nccl.bisect.matrix import shards
from pytest_nccl.bisect.matrix.results import Results

RANGE = ["trl", "--from", "0.13.0", "--to", "0.16.0", "--world", "2", "--world", "4"]


def matrix(tmp_path: Path, name: str, *extra: str, selection: str = "suites/trl/matrix"):
    """One run of the matrix into tmp_path/name.json; (exit status, output, what it ran)."""
    argv = [*RANGE, "--results", str(tmp_path / f"{name}.json"), *extra, "--", selection]
    code, out, _, runner = drive(argv, tmp_path, runner=FakeRunner())
    return code, out, [(v, w) for v, w, _ in runner.calls]


def merge(tmp_path: Path, *names: str):
    out, err = io.StringIO(), io.StringIO()
    ns = matrix_cli.parse_args(["--merge", *(str(tmp_path / f"{n}.json") for n in names),
                                "--out", str(tmp_path / "MERGED.md")])
    code = matrix_cli.run(ns, out, err=err)
    return code, out.getvalue(), err.getvalue()


def cells(results: Results) -> dict:
    """Every cell as the page reads it: the env, the exit status, the problem, each test's outcome
    and headline, the versions resolved (not the seconds an env took to build, which differ)."""
    return {cell: (run.env_ok, run.exit_code, run.problem, run.packages,
                   {n: (t.written, t.headline) for n, t in run.tests.items()})
            for cell, run in results.runs.items()}


def matrix_part(path: Path) -> str:
    """The page from its Matrix table on (the table, the findings, the legend)."""
    text = path.read_text()
    return text[text.index("## Matrix"):]


@pytest.mark.parametrize("balance", [False, True])
def test_three_shards_merged_are_the_one_machine_matrix(tmp_path, balance):
    code, _, ran = matrix(tmp_path, "whole")
    assert code == 0 and len(ran) == 10  # 5 releases x 2 worlds
    shares = []
    for k in (1, 2, 3):
        extra = ["--shard", f"{k}/3"] + (["--balance", str(tmp_path / "whole.json")] if balance else [])
        code, out, ran = matrix(tmp_path / f"s{k}", "shard", *extra)
        assert code == 0 and f"shard {k}/3: " in out
        assert {w for _, w in ran} == {2, 4} and len(ran) == 2 * len({v for v, _ in ran})  # whole releases
        shares.append(ran)
    every = [cell for ran in shares for cell in ran]
    assert sorted(every) == sorted(set(every)) and len(every) == 10  # each cell once, by one shard
    for k in (1, 2, 3):
        (tmp_path / f"shard{k}.json").write_bytes((tmp_path / f"s{k}" / "shard.json").read_bytes())
    code, out, err = merge(tmp_path, "shard1", "shard2", "shard3")
    assert code == 0 and err == "" and out.startswith("merged 3 shards: wrote "), out + err
    whole, merged = Results.load(tmp_path / "whole.json"), Results.load(tmp_path / "MERGED.json")
    assert cells(merged) == cells(whole) and merged.versions == whole.versions and merged.worlds == whole.worlds
    assert merged.shard == "" and "--shard" not in merged.command
    assert matrix_part(tmp_path / "MERGED.md") == matrix_part(tmp_path / "whole.md")


def test_a_shard_reads_the_others_releases_as_not_run(tmp_path):
    matrix(tmp_path, "shard", "--shard", "2/3")
    doc = json.loads((tmp_path / "shard.json").read_text())
    assert doc["shard"] == "2/3" and doc["versions"] == ["0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.16.0"]
    assert sorted(doc["runs"]) == ["0.14.0", "0.16.0"]  # in turn: the 2nd and the 5th
    matrix(tmp_path, "whole")
    assert "shard" not in json.loads((tmp_path / "whole.json").read_text())  # a whole matrix's file as before


def test_a_shard_of_other_arguments_is_refused_in_one_line(tmp_path):
    matrix(tmp_path, "a", "--shard", "1/2")
    matrix(tmp_path, "b", "--shard", "2/2", selection="suites/trl/other")
    code, out, err = merge(tmp_path, "a", "b")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("pytest-nccl matrix: ") and "b.json was made for pytest arguments " \
        "`pytest suites/trl/other`, " in err and "for `pytest suites/trl/matrix`" in err
    assert not (tmp_path / "MERGED.json").exists() and not (tmp_path / "MERGED.md").exists()


def test_a_shard_of_another_torch_or_a_cell_twice_is_refused(tmp_path):
    matrix(tmp_path, "a", "--shard", "1/2")
    matrix(tmp_path, "b", "--shard", "2/2")
    doc = json.loads((tmp_path / "b.json").read_text())
    (tmp_path / "c.json").write_text(json.dumps(dict(doc, torch="2.12.0+cpu")))
    code, _, err = merge(tmp_path, "a", "c")
    assert code == 2 and err.count("\n") == 1 and "was made for torch '2.12.0+cpu'" in err
    code, _, err = merge(tmp_path, "a", "b", "a")
    assert code == 2 and err.count("\n") == 1 and "0.13.0 at world 2 is in both" in err


def test_a_missing_shard_is_said_and_its_releases_read_not_run(tmp_path):
    matrix(tmp_path, "a", "--shard", "1/3")
    matrix(tmp_path, "c", "--shard", "3/3")
    code, _, err = merge(tmp_path, "a", "c")
    assert code == 0 and err == "pytest-nccl matrix: shard 2/3 missing: its releases read as not run\n"
    merged = Results.load(tmp_path / "MERGED.json")
    assert len(merged.versions) == 5 and sorted({v for v, _ in merged.runs}) == ["0.13.0", "0.15.0", "0.15.1"]


def test_shares_in_turn_and_by_seconds():
    versions = ["1", "2", "3", "4", "5"]
    assert shards.assign(versions, 2) == {"1": 1, "2": 2, "3": 1, "4": 2, "5": 1}
    # longest first to the least loaded: 9 -> 1; 5 -> 2; 4 -> 2; 3 (unknown: the mean, 4.75) -> 1 ...
    got = shards.assign(versions, 2, {"1": 9.0, "2": 5.0, "4": 4.0, "5": 1.0})
    assert got == {"1": 1, "2": 2, "3": 2, "4": 1, "5": 2}
    assert shards.share(versions, shards.Shard(3, 3)) == ["3"]
    assert shards.unsharded("pytest-nccl matrix trl --shard 2/3 --balance m.json --world 2") == \
        "pytest-nccl matrix trl --world 2"


@pytest.mark.parametrize("argv, message", [
    ([*RANGE, "--results", "m.json", "--shard", "0/3", "--", "x"], "--shard must be K/N with 1 <= K <= N"),
    ([*RANGE, "--results", "m.json", "--shard", "4/3", "--", "x"], "not '4/3'"),
    ([*RANGE, "--results", "m.json", "--shard", "two", "--", "x"], "not 'two'"),
    ([*RANGE, "--results", "m.json", "--balance", "m.json", "--", "x"], "give --shard K/N too"),
    ([*RANGE, "--results", "m.json", "--shard", "1/2", "--balance", "none.json", "--", "x"], "--balance none.json"),
    (["trl", "--merge", "a.json", "--out", "M.md"], "--merge takes the shards' results files only"),
    (["--merge", "a.json"], "--merge needs --out"),
    (["--merge", "a.json", "--out", "M.md", "--", "x"], "--merge takes the shards' results files only"),
])
def test_usage_errors_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert matrix_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_the_release_matrix_workflow_runs_shards_caches_envs_and_merges():
    text = (Path(__file__).resolve().parents[2] / ".github" / "workflows" / "matrix.yml").read_text()
    assert "workflow_dispatch:" in text and "actions/cache@" in text and "~/.cache/pytest-nccl/envs" in text
    count = int(next(line for line in text.splitlines() if line.strip().startswith("SHARDS:")).split('"')[1])
    assert f"shard: [{', '.join(str(k) for k in range(1, count + 1))}]" in text
    assert '--shard "${{ matrix.shard }}/$SHARDS"' in text and f"of{count}-" in text
    assert "needs: shard" in text and "matrix --merge shards/shard-*.json" in text
    try:
        import yaml
    except ImportError:  # not a dependency: the text's checks above hold without it
        yaml = None
    if yaml is not None:
        assert set(yaml.safe_load(text)["jobs"]) == {"shard", "merge"}
    for line in text.splitlines():  # a bare torch on a hosted runner would be the CUDA build
        if "pip install" in line:
            assert "TORCH_INDEX_URL" in line, line
