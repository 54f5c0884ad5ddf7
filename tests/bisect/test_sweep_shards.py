"""``bisect --sweep`` over a CI job matrix (docs/ci.md): ``--shard K/N --results`` sweeps one job's
share of the releases; ``--merge`` prints the sweep of the shards, the same lines and exit status as
one machine's sweep, and refuses in one line shards made for other pytest arguments or another
torch. On the fake index, env builder and pytest runner of test_bisect_cli.py."""

from __future__ import annotations

import io
import json

import pytest
from test_bisect_cli import CPO_BAD, HEADLINE, FakeRunner, drive

from pytest_nccl.bisect import cli

SWEEP = ["trl", "--sweep", "--from", "0.13.0", "--to", "0.19.0"]


def sweep_lines(out: str) -> list[str]:
    """The sweep's table and final line, as a sweep prints them."""
    lines = out.splitlines()
    return lines[lines.index("sweep:"):]


def merge(tmp_path, *names):
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(cli.parse_args(["--merge", *(str(tmp_path / n) for n in names)]), out, err=err)
    return code, out.getvalue(), err.getvalue()


def shards(tmp_path, count=3, selection="suites/trl"):
    ran = []
    for k in range(1, count + 1):
        argv = [*SWEEP, "--shard", f"{k}/{count}", "--results", str(tmp_path / f"s{k}.json"), "--", selection]
        _, out, _, runner = drive(argv, tmp_path / f"cache{k}", CPO_BAD)
        assert f"shard {k}/{count}: " in out
        ran += [v for v, _ in runner.calls]
    return ran


def test_three_shards_merged_are_the_one_machine_sweep(tmp_path):
    whole_code, whole, _, runner = drive([*SWEEP, "--", "suites/trl"], tmp_path / "whole", CPO_BAD)
    assert whole_code == 1  # some release is bad
    ran = shards(tmp_path)
    assert sorted(ran) == sorted(v for v, _ in runner.calls) and len(ran) == len(set(ran))  # each release once
    code, out, err = merge(tmp_path, "s1.json", "s2.json", "s3.json")
    assert (code, err) == (whole_code, "") and out.startswith("merged 3 shards\n"), out + err
    assert sweep_lines(out) == sweep_lines(whole)
    assert sweep_lines(out)[-1].startswith("bad: trl 0.14.0 .. 0.16.1")


def test_a_shard_of_other_arguments_or_another_torch_is_refused_in_one_line(tmp_path):
    shards(tmp_path, 2)
    drive([*SWEEP, "--shard", "2/2", "--results", str(tmp_path / "other.json"), "--", "suites/other"],
          tmp_path / "c", CPO_BAD)
    code, out, err = merge(tmp_path, "s1.json", "other.json")
    assert code == 2 and "sweep:" not in out and err.count("\n") == 1, err
    assert "other.json was made for pytest arguments `pytest suites/other`" in err
    doc = json.loads((tmp_path / "s2.json").read_text())
    (tmp_path / "torch.json").write_text(json.dumps(dict(doc, torch="2.12.0+cpu")))
    code, _, err = merge(tmp_path, "s1.json", "torch.json")
    assert code == 2 and err.count("\n") == 1 and "was made for torch '2.12.0+cpu'" in err
    code, _, err = merge(tmp_path, "s1.json", "s1.json")
    assert code == 2 and err.count("\n") == 1 and "is in both" in err


def test_a_missing_shard_is_said(tmp_path):
    shards(tmp_path, 2)
    code, out, err = merge(tmp_path, "s1.json")
    assert err.startswith("pytest-nccl bisect: not swept (a shard missing, or interrupted): ") and err.count("\n") == 1
    assert code in (0, 1) and "sweep:" in out


class InterruptedRunner(FakeRunner):
    """The job's time limit (SIGTERM, which the command takes as Ctrl-C) during the ``at``-th release."""

    def __init__(self, bad, at: int, results):
        super().__init__(bad)
        self.at, self.results, self.saved = at, results, None

    def __call__(self, python, args, **kwargs):
        if len(self.calls) + 1 == self.at:
            self.saved = sorted(json.loads(self.results.read_text())["probes"])  # what a SIGKILL would leave
            raise KeyboardInterrupt
        return super().__call__(python, args, **kwargs)


def test_an_interrupted_shard_keeps_what_it_swept_and_the_merge_names_the_rest(tmp_path):
    """A CI job killed at its time limit: the releases it swept are in its results file (saved after
    each), its lines say so, and the merge runs on them, naming the releases no shard swept."""
    argv = [*SWEEP, "--shard", "1/1", "--results", str(tmp_path / "s1.json"), "--", "suites/trl"]
    runner = InterruptedRunner(CPO_BAD, at=3, results=tmp_path / "s1.json")
    code, out, _, _ = drive(argv, tmp_path / "c", CPO_BAD, runner=runner)
    assert code == cli.EXIT_INTERRUPTED and out.rstrip().endswith(f"interrupted: {tmp_path / 's1.json'} holds the "
                                                                   "2 releases swept"), out
    swept = [v for v, _ in runner.calls]
    assert runner.saved == swept  # saved after each release, before any interrupt
    assert sweep_lines(out)[1:3] == [f"  {swept[0]:<12} good", f"  {swept[1]:<12} bad    {HEADLINE}"], out
    code, out, err = merge(tmp_path, "s1.json")
    assert code == 1 and sweep_lines(out)[-1].startswith(f"bad: trl {swept[1]}"), out
    assert err.startswith("pytest-nccl bisect: not swept (a shard missing, or interrupted): 0.15.0, ") \
        and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, message", [
    ([*SWEEP, "--shard", "3/2", "--", "x"], "--shard must be K/N"),
    (["trl", "--good", "0.13.0", "--bad", "0.16.1", "--shard", "1/2", "--", "x"], "are for --sweep"),
    (["trl", "--merge", "a.json"], "--merge takes the sweep shards' results files only"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_file_that_is_not_a_sweep_is_one_line(tmp_path):
    (tmp_path / "m.json").write_text('{"schema": 1, "package": "trl"}')
    code, _, err = merge(tmp_path, "m.json")
    assert code == 2 and err.count("\n") == 1 and "is not a sweep's results file" in err


def test_balanced_shards_share_the_releases_by_their_earlier_seconds(tmp_path):
    """``--balance`` with the earlier shards' files: each release once, the slowest first to the least
    loaded shard, as the matrix shares them; the merge is the one-machine sweep all the same."""
    _, whole, _, _ = drive([*SWEEP, "--", "suites/trl"], tmp_path / "whole", CPO_BAD)
    shards(tmp_path, 2)
    for k in (1, 2):  # earlier runs: 0.16.1 took far longest
        doc = json.loads((tmp_path / f"s{k}.json").read_text())
        for v, probe in doc["probes"].items():
            probe["install_seconds"], probe["test_seconds"] = (100.0, 50.0) if v == "0.16.1" else (10.0, 5.0)
        (tmp_path / f"s{k}.json").write_text(json.dumps(doc))
    ran = {}
    for k in (1, 2):
        argv = [*SWEEP, "--shard", f"{k}/2", "--balance", str(tmp_path / "s1.json"), str(tmp_path / "s2.json"),
                "--results", str(tmp_path / f"b{k}.json"), "--", "suites/trl"]
        _, out, _, runner = drive(argv, tmp_path / f"bc{k}", CPO_BAD)
        assert f"(by the seconds of {tmp_path / 's1.json'}, {tmp_path / 's2.json'})" in out, out
        ran[k] = [v for v, _ in runner.calls]
    # 0.16.1 (150 s) alone on shard 1 until shard 2 holds as much (ten releases of 15 s), then the tie to 1
    assert ran[1] == ["0.16.1", "0.19.0"] and len(ran[2]) == 10 and not set(ran[1]) & set(ran[2]), ran
    code, out, err = merge(tmp_path, "b1.json", "b2.json")
    assert err == "" and sweep_lines(out) == sweep_lines(whole)


def test_balance_without_a_shard_or_with_a_file_not_a_sweep_is_one_line(tmp_path, capsys):
    (tmp_path / "m.json").write_text('{"schema": 1, "package": "trl"}')
    for argv, message in (([*SWEEP, "--balance", str(tmp_path / "m.json"), "--", "x"], "give --shard K/N too"),
                          ([*SWEEP, "--shard", "1/2", "--balance", str(tmp_path / "m.json"), "--", "x"],
                           "is not a sweep's results file")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
