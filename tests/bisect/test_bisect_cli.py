"""The CLI end to end on a fake index, a fake env builder and a fake pytest runner (no network)."""

import io
from pathlib import Path

import pytest
from fakes import FakeBuilder

from pytest_nccl.__main__ import main as dunder_main
from pytest_nccl.bisect import cli
from pytest_nccl.bisect.envs import BaseInfo, EnvCache
from pytest_nccl.bisect.runner import RunOutcome
from pytest_nccl.bisect.search import Verdict
from pytest_nccl.bisect.versions import Release, StaticIndex

RELEASES = ["0.12.2", "0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.16.1", "0.17.0",
            "0.18.0", "0.18.1", "0.18.2", "0.19.0", "0.20.0rc1"]
CPO_BAD = {"0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.16.1"}
SFT_BAD = {"0.15.0"}
HEADLINE = "shape mismatch in all_gather #3 of group default: rank 0 [2, 7, 32], rank 1 [2, 5, 32]"
BASE = BaseInfo("python", "3.11.7", "2.13.0+cpu", "/base")


class FakeRunner:
    def __init__(self, bad):
        self.bad = set(bad)
        self.calls = []

    def __call__(self, python, args, *, log, timeout, cwd, stream):
        version = (Path(python).parent.parent / "version").read_text()
        self.calls.append((version, list(args)))
        if version in self.bad:
            return RunOutcome(1, 2.5, Verdict.BAD, HEADLINE, [], log)
        return RunOutcome(0, 2.0, Verdict.GOOD, None, [], log)


def drive(argv, tmp_path, bad, builder=None, index=None, runner=None):
    builder = builder or FakeBuilder()
    runner = runner or FakeRunner(bad)
    out, err = io.StringIO(), io.StringIO()
    ns = cli.parse_args(argv)
    cache = EnvCache(tmp_path / "cache", builder, BASE)
    code = cli.run(ns, out, err=err, index=index or StaticIndex({"trl": RELEASES}),
                   make_cache=lambda ns, out: (cache, "fake", ["pytest>=8"], [], ["torch==2.13.0+cpu"]),
                   run_tests=runner)
    return code, out.getvalue() + err.getvalue(), builder, runner  # errors last: they are on stderr


def test_first_bad(tmp_path):
    code, out, builder, runner = drive(["trl", "--good", "0.13.0", "--bad", "0.16.1", "--",
                                        "suites/trl", "-k", "cpo"], tmp_path, CPO_BAD)
    assert code == cli.EXIT_FOUND
    last = out.strip().splitlines()[-1]
    assert last == f"first bad: trl 0.14.0 \u2014 {HEADLINE}"
    assert "0.13.0, 0.14.0, 0.15.0, 0.15.1, 0.15.2, 0.16.0, 0.16.1 (7 releases)" in out
    assert "[1] trl 0.13.0 (good bound): env built in" in out
    assert "[2] trl 0.16.1 (bad bound): env built in" in out and "-> BAD: shape mismatch" in out
    assert "bisecting: 5 untested releases left, about 3 more probes" in out
    assert runner.calls[0][1] == ["suites/trl", "-k", "cpo"]
    assert len(builder.calls) <= 5


def test_first_fixed_with_bounds_reversed(tmp_path):
    code, out, _, _ = drive(["trl", "--bad", "0.14.0", "--good", "0.19.0", "--", "suites/trl"], tmp_path, CPO_BAD)
    assert code == 0
    assert "fix: good 0.19.0, bad 0.14.0 -> looking for the first fixed release" in out
    assert out.strip().splitlines()[-1] == f"first fixed: trl 0.17.0 \u2014 last bad 0.16.1: {HEADLINE}"


def test_second_run_reuses_cached_envs(tmp_path):
    argv = ["trl", "--good", "0.13.0", "--bad", "0.16.1", "--", "suites/trl"]
    _, out1, b1, _ = drive(argv, tmp_path, CPO_BAD)
    code, out2, b2, _ = drive(argv, tmp_path, CPO_BAD)
    assert code == 0 and b1.calls and b2.calls == []
    assert "env built in" in out1 and "env built in" not in out2
    assert out2.count("env cached (") == len(b1.calls)
    assert out1.strip().splitlines()[-1] == out2.strip().splitlines()[-1]


def test_sweep_shows_the_one_bad_release(tmp_path):
    code, out, _, _ = drive(["trl", "--sweep", "--from", "0.14.0", "--to", "0.16.0", "--", "suites/trl", "-k", "sft"],
                            tmp_path, SFT_BAD)
    assert code == 1
    assert "[1/5] trl 0.14.0: env built in" in out and "[5/5] trl 0.16.0" in out
    lines = out.strip().splitlines()
    assert lines[-1] == f"bad: trl 0.15.0 alone \u2014 {HEADLINE}"
    table = lines[lines.index("sweep:") + 1:-1]
    assert [ln.split()[:2] for ln in table] == [["0.14.0", "good"], ["0.15.0", "bad"], ["0.15.1", "good"],
                                                 ["0.15.2", "good"], ["0.16.0", "good"]]


def test_sweep_all_good_and_good_bad_spelling(tmp_path):
    code, out, _, _ = drive(["trl", "--sweep", "--good", "0.17.0", "--bad", "0.19.0", "--", "x"], tmp_path, CPO_BAD)
    assert code == 0 and out.strip().endswith("no bad release: trl 0.17.0 .. 0.19.0 (5 good, 0 skipped)")


def test_uninstallable_release_is_a_skip_not_a_verdict(tmp_path):
    builder = FakeBuilder(uninstallable={"0.15.1"})
    code, out, _, runner = drive(["trl", "--good", "0.13.0", "--bad", "0.16.1", "--", "x"], tmp_path,
                                 {"0.15.2", "0.16.0", "0.16.1"}, builder=builder)
    assert "trl 0.15.1: env failed in" in out and "-> skip: cannot install: No solution found" in out
    assert "0.15.1" not in [v for v, _ in runner.calls]
    # 0.15.1 sits between the last good (0.15.0) and the first bad (0.15.2): named as possible culprit
    assert code == cli.EXIT_AMBIGUOUS
    assert out.strip().splitlines()[-1].startswith("first bad: trl 0.15.2 (or one of the untested 0.15.1)")
    # the failed install is cached: the second run does not retry it
    code2, out2, builder2, _ = drive(["trl", "--good", "0.13.0", "--bad", "0.16.1", "--", "x"], tmp_path,
                                     {"0.15.2", "0.16.0", "0.16.1"}, builder=FakeBuilder(uninstallable={"0.15.1"}))
    assert builder2.calls == [] and "env cached failure" in out2


def test_wrong_bounds(tmp_path):
    code, out, _, _ = drive(["trl", "--good", "0.14.0", "--bad", "0.16.1", "--", "x"], tmp_path, CPO_BAD)
    assert code == cli.EXIT_BOUNDS and "bound 0.14.0 was given as good but tested bad" in out


def test_trusted_bounds_still_show_the_headline(tmp_path):
    code, out, builder, _ = drive(["trl", "--good", "0.13.0", "--bad", "0.14.0", "--no-check-bounds", "--", "x"],
                                  tmp_path, CPO_BAD)
    assert code == 0 and builder.calls == ["0.14.0"]
    assert out.strip().splitlines()[-1] == f"first bad: trl 0.14.0 \u2014 {HEADLINE}"


def test_unknown_bound_and_prerelease(tmp_path):
    code, out, _, _ = drive(["trl", "--good", "0.13.0", "--bad", "9.9.9", "--", "x"], tmp_path, CPO_BAD)
    assert code == cli.EXIT_INDEX and "9.9.9 is not a release" in out
    _, out, _, _ = drive(["trl", "--sweep", "--from", "0.19.0", "--to", "0.20.0rc1", "--", "x"], tmp_path, set())
    assert "0.19.0, 0.20.0rc1 (2 releases)" in out  # a bound is kept even when it is a pre-release


def test_versions_list_by_hand(tmp_path):
    code, out, _, _ = drive(["trl", "--good", "0.13.0", "--bad", "0.16.1", "--versions", "0.13.0,0.15.0 0.16.1",
                             "--as-of", "now", "--", "x"], tmp_path, CPO_BAD)
    assert "0.13.0, 0.15.0, 0.16.1 (3 releases)" in out
    assert out.strip().splitlines()[-1].startswith("first bad: trl 0.15.0")


@pytest.mark.parametrize("argv,message", [
    (["trl", "--good", "1.0", "--", "x"], "needs --good V and --bad V"),
    (["trl", "--good", "1.0", "--bad", "1.0", "--", "x"], "same version"),
    (["trl", "--good", "1.0", "--bad", "2.0"], "after '--'"),
    (["trl", "--sweep", "--from", "1.0", "--", "x"], "--sweep needs the range"),
    (["trl", "--good", "1.0", "--bad", "2.0", "--from", "1.0", "--", "x"], "--from/--to are for --sweep"),
    (["trl", "--good", "banana", "--bad", "2.0", "--", "x"], "not a version"),
    (["trl", "--good", "1.0", "--bad", "2.0", "--as-of", "yesterday", "--", "x"], "--as-of"),
])
def test_usage_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_parse_args_details():
    ns = cli.parse_args(["trl", "--good", "0.13.0", "--bad", "0.16.1", "--with", "peft", "--with", "x<2",
                         "--as-of", "2025-02-01", "--", "suites/trl", "--nccl-world=2", "--", "after"])
    assert ns.extra == ["peft", "x<2"]
    assert ns.pytest_args == ["suites/trl", "--nccl-world=2", "--", "after"]
    assert ns.as_of.isoformat() == "2025-02-01T00:00:00+00:00"
    assert ns.range == ("0.13.0", "0.16.1") and ns.installer == "auto" and ns.run_timeout == 1800


def test_dunder_main_dispatch(capsys):
    assert dunder_main([]) == 2
    assert dunder_main(["--help"]) == 0
    assert "bisect" in capsys.readouterr().out
    assert dunder_main(["frobnicate"]) == 2
    assert dunder_main(["bisect", "trl"]) == 2  # usage error from the bisect parser


def test_cutoff_for_release():
    import datetime as dt

    from pytest_nccl.bisect.prober import cutoff_for

    t = dt.datetime(2025, 1, 29, 16, 44, tzinfo=dt.timezone.utc)
    rel = Release("0.14.0", uploaded=t, uploaded_last=t + dt.timedelta(seconds=3))
    assert cutoff_for(rel, "release") == t + dt.timedelta(seconds=3, hours=1)
    assert cutoff_for(rel, "now") is None
    assert cutoff_for(Release("0.14.0"), "release") is None
    assert cutoff_for(rel, t) == t


def test_tooling_requirements_from_pyproject(tmp_path, monkeypatch):
    import importlib.metadata as md

    from pytest_nccl.bisect import prober

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "requires", missing)
    pp = tmp_path / "pyproject.toml"
    pp.write_text('[project]\nname = "pytest-nccl"\ndependencies = ["pytest>=8.0", "psutil"]\n')
    assert prober.tooling_requirements(pp) == ["pytest>=8.0", "psutil"]
    assert prober.tooling_requirements(None) == ["pytest>=8"]
