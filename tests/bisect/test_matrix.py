"""The release matrix: pure part (labels, cells, ranges, findings, Markdown, JSON) and the CLI end to
end on a fake index, a fake env builder and a fake pytest runner (no network, no real envs)."""

import io
import json

import pytest
from fakes import FakeBuilder

from pytest_nccl.__main__ import main as dunder_main
from pytest_nccl.bisect.envs import BaseInfo, EnvCache
from pytest_nccl.bisect.matrix import cli as matrix_cli
from pytest_nccl.bisect.matrix.cells import CellStatus, cell, short_headline, skip_reason
from pytest_nccl.bisect.matrix.findings import findings, red_ranges
from pytest_nccl.bisect.matrix.render import render
from pytest_nccl.bisect.matrix.results import (
    Results,
    ResultsError,
    Run,
    TestRecord,
    latest_patches,
    row_labels,
)
from pytest_nccl.bisect.runner import CaseResult, RunOutcome
from pytest_nccl.bisect.search import Verdict
from pytest_nccl.bisect.versions import StaticIndex

H = "shape mismatch in all_gather #3 of group default: rank 0 [2, 7, 32], rank 1 [2, 5, 32] (call site trl/x.py:12)"
M = "suites.trl.matrix.test_matrix::"
SFT, DPO, GRPO = M + "test_cell[sft-ragged]", M + "test_cell[dpo-even]", M + "test_cell[grpo-big]"
PKGS = {"transformers": "4.49.0", "accelerate": "1.4.0", "datasets": "3.3.2", "torch": "2.13.0+cpu"}


def run_of(version, world, **tests):
    """Run(version, world) with tests given as name=("failed", headline) or name="passed"."""
    recs = {}
    for name, val in tests.items():
        outcome, head = (val, "") if isinstance(val, str) else val
        nodeid = {"sft": SFT, "dpo": DPO, "grpo": GRPO}.get(name)
        if nodeid is None:  # trainer_stressor -> a cell of the generated matrix
            nodeid = "suites.trl.matrix.test_matrix::test_cell[{}]".format(name.replace("_", "-"))
        recs[nodeid] = TestRecord(outcome, head)
    return Run(version, world, packages=dict(PKGS, trl=version), seconds=35.2, env_seconds=41.0, tests=recs)


def results_of(*runs, worlds=(2, 4)):
    r = Results("trl", ["suites/trl/matrix", "-p", "no:randomly"], python="3.11.7", torch="2.13.0+cpu",
                command="python -m pytest_nccl matrix trl --versions 0.14.0,0.15.0,0.16.0 --world 2 --world 4 "
                        "--results m.json -- suites/trl/matrix -p no:randomly", updated="2026-05-10T12:00:00+00:00")
    r.plan([], worlds)
    for run in runs:
        r.put(run)
    return r


# --------------------------------------------------------------------------- labels


def test_labels_one_file_one_function_read_as_the_ids():
    assert row_labels([SFT, DPO]) == {SFT: "sft \u00b7 ragged", DPO: "dpo \u00b7 even"}


def test_labels_keep_the_function_when_the_file_has_several():
    a, b = M + "test_cell[a-b]", M + "test_other"
    assert row_labels([a, b]) == {a: "cell[a \u00b7 b]", b: "other"}


def test_labels_drop_the_common_directory_not_the_files():
    a, b = "suites/trl/test_sft.py::test_x", "suites/trl/test_dpo.py::test_cell[a]"
    c, d = "suites.trl.test_a.TestK::test_y", "suites.trl.test_b::test_z"
    assert row_labels([a, b]) == {a: "test_sft::x", b: "test_dpo::a"}
    assert row_labels([c, d]) == {c: "test_a/TestK::y", d: "test_b::z"}


def test_labels_that_would_read_the_same_fall_back():
    a, b = "t.test_m::test_x", "t.test_m::x"
    assert row_labels([a, b]) == {a: "test_x", b: "x"}
    coll = "suites.trl.test_cpo"
    assert row_labels([coll, "suites.trl.test_sft::test_a"])[coll] == "test_cpo (collection)"


# --------------------------------------------------------------------------- cells


def test_cells_combine_the_worlds():
    r = results_of(run_of("1", 2, sft="passed", dpo="skipped", grpo=("failed", H)),
                   run_of("1", 4, sft="passed", dpo="skipped", grpo=("failed", "AssertionError: a | b")),
                   run_of("2", 2, sft="passed", dpo="passed", grpo="xfailed"),
                   run_of("2", 4, sft=("error", H), dpo="skipped", grpo="xfailed"))
    assert cell(r, SFT, "1").text == "pass" and cell(r, SFT, "1").status is CellStatus.GREEN
    assert cell(r, DPO, "1").text == "skip" and cell(r, DPO, "1").status is CellStatus.SKIP
    both = cell(r, GRPO, "1")  # every world failed: the first one's headline, no prefix
    assert both.status is CellStatus.RED and both.full == H
    assert both.text == "\u274c shape mismatch: all_gather"  # the kind; the whole headline is under Findings
    assert cell(r, GRPO, "2").text == "xfail" and cell(r, GRPO, "2").status is CellStatus.GREEN
    mixed = cell(r, SFT, "2")
    assert mixed.text == "w2 pass; w4: \u274c shape mismatch: all_gather" and mixed.full == f"w2 pass; w4: {H}"
    assert cell(r, DPO, "2").text == "w2 pass; w4 skip" and cell(r, DPO, "2").status is CellStatus.GREEN
    assert cell(r, SFT, "9").text == "\u00b7" and cell(r, SFT, "9").status is CellStatus.NONE


def test_cells_escape_pipes_and_name_several_red_worlds():
    r = results_of(run_of("1", 2, sft="passed"), run_of("1", 4, sft=("failed", "AssertionError: a | b")),
                   run_of("1", 8, sft=("failed", "other")), worlds=(2, 4, 8))
    assert cell(r, SFT, "1").text == "w2 pass; w4/w8: \u274c AssertionError: a \\| b"


def test_cells_without_env_without_run_or_after_a_timeout():
    r = results_of(Run("1", 2, env_ok=False, env_reason="No solution found"),
                   Run("1", 4, env_ok=False, env_reason="No solution found"),
                   run_of("2", 2, sft="passed"),
                   Run("2", 4, problem="pytest did not finish within 1800s", exit_code=None))
    assert cell(r, SFT, "1").text == "\u2014" and cell(r, SFT, "1").status is CellStatus.NO_ENV
    timed = cell(r, SFT, "2")
    assert timed.status is CellStatus.RED and timed.text == "w2 pass; w4: \u274c pytest did not finish within 1800s"
    assert cell(r, DPO, "2").text == "w2 \u00b7; w4: \u274c pytest did not finish within 1800s"


def test_skip_reason_only_when_always_the_same():
    r = results_of(run_of("1", 2, sft=("skipped", "needs 4 GPUs"), dpo=("skipped", "a")),
                   run_of("2", 2, sft=("skipped", "needs 4 GPUs"), dpo=("skipped", "b")), worlds=(2,))
    assert skip_reason(r, SFT) == "needs 4 GPUs" and skip_reason(r, DPO) is None


# --------------------------------------------------------------------------- ranges, findings


@pytest.mark.parametrize("statuses,ranges", [
    (["red", "skip", "red"], [(0, 2)]),
    (["red", "skip", "green", "red"], [(0, 0), (3, 3)]),
    (["green", "skip", "red", "none", "noenv", "red", "green", "red"], [(2, 5), (7, 7)]),
    (["skip", "red", "skip"], [(1, 1)]),
    (["green", "green"], []),
])
def test_red_ranges_bridge_releases_without_verdict_only_between_reds(statuses, ranges):
    assert red_ranges([CellStatus(s) for s in statuses]) == ranges


def test_findings_ranges_first_bad_fixed_and_newest():
    vs = ["0.14.0", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.18.0"]
    sft = ["passed", ("failed", "old bug"), "passed", ("failed", "x"), "skipped", ("failed", H)]
    dpo = [("failed", "since ever"), ("failed", "since ever"), "passed", "passed", "passed", "passed"]
    r = results_of(*[run_of(v, 2, sft=s, dpo=d) for v, s, d in zip(vs, sft, dpo, strict=True)], worlds=(2,))
    f_sft, f_dpo = findings(r)  # red on the newest comes first
    assert f_sft.label == "sft \u00b7 ragged" and f_sft.range_text() == "0.15.0, 0.16.0\u20130.18.0"
    assert f_sft.first_bad == ["0.15.0", "0.16.0"] and f_sft.fixed == ["0.15.1"]
    assert f_sft.red_on_newest and f_sft.newest_red == "0.18.0" and f_sft.headline == H
    assert f_sft.first_bad_headlines == [("0.15.0", "old bug"), ("0.16.0", "x")]
    assert f_dpo.range_text() == "0.14.0\u20130.15.0" and f_dpo.first_bad == [] and f_dpo.fixed == ["0.15.1"]
    assert not f_dpo.red_on_newest and f_dpo.newest_status is CellStatus.GREEN and f_dpo.headline == "since ever"


def test_first_bad_names_untested_releases_before_it():
    vs = ["1", "2", "3"]
    outcomes = ["passed", "skipped", ("failed", "x")]
    r = results_of(*[run_of(v, 2, sft=s) for v, s in zip(vs, outcomes, strict=True)], worlds=(2,))
    assert findings(r)[0].first_bad == ["3 (2 untested)"]


# --------------------------------------------------------------------------- Markdown


def three_releases():
    return results_of(run_of("0.14.0", 2, sft="passed", dpo="passed", grpo=("skipped", "needs 4 GPUs")),
                      run_of("0.14.0", 4, sft="passed", dpo="passed", grpo="passed"),
                      run_of("0.15.0", 2, sft="passed", dpo=("failed", H), grpo=("skipped", "needs 4 GPUs")),
                      run_of("0.15.0", 4, sft=("failed", H), dpo=("failed", "AssertionError: x"), grpo="passed"),
                      Run("0.16.0", 2, env_ok=False, env_reason="No solution found when resolving dependencies"),
                      Run("0.16.0", 4, env_ok=False, env_reason="No solution found when resolving dependencies"))


def test_render_three_releases():
    md = render(three_releases())
    lines = md.splitlines()
    assert lines[0] == "# trl: release matrix"
    assert lines[2].startswith("Generated by `python -m pytest_nccl matrix trl --versions 0.14.0,0.15.0,0.16.0 "
                               "--world 2 --world 4 --results m.json -- suites/trl/matrix -p no:randomly` on "
                               "2026-05-10 (Python 3.11.7, torch 2.13.0+cpu): 3 releases of trl at world sizes 2, 4")
    i = lines.index("## Stacks")
    assert lines[i + 2:i + 7] == [
        "| trl | transformers | accelerate | datasets | env | tests w2 | tests w4 |",
        "|---|---|---|---|---|---|---|",
        "| 0.14.0 | 4.49.0 | 1.4.0 | 3.3.2 | ok (built 41s) | 35s | 35s |",
        "| 0.15.0 | 4.49.0 | 1.4.0 | 3.3.2 | ok (built 41s) | 35s | 35s |",
        "| 0.16.0 |  |  |  | cannot install |  |  |"]
    i = lines.index("## Matrix")
    assert lines[i + 2:i + 11] == [
        "| test | 0.14.0 | 0.15.0 | 0.16.0 \u2717 |",
        "|---|---|---|---|",
        "| dpo \u00b7 even | pass | \u274c shape mismatch: all_gather | \u2014 |",
        "| grpo \u00b7 big\u00b9 | w2 skip; w4 pass | w2 skip; w4 pass | \u2014 |",
        "| sft \u00b7 ragged | pass | w2 pass; w4: \u274c shape mismatch: all_gather | \u2014 |",
        "",
        "\u2717 0.16.0: cannot install: No solution found when resolving dependencies  ",
        "\u00b9 skipped: needs 4 GPUs",
        ""]
    i = lines.index("## Findings")
    assert lines[i + 2:i + 6] == [
        "- **dpo \u00b7 even**: red on 0.15.0; first bad 0.15.0; newest 0.16.0: cannot install",
        f"  - 0.15.0: {H}",
        "- **sft \u00b7 ragged**: red on 0.15.0; first bad 0.15.0; newest 0.16.0: cannot install",
        f"  - 0.15.0: w2 pass; w4: {H}"]
    assert "## Legend" in lines
    assert render(Results.loads(three_releases().dumps())) == md  # the JSON is enough to re-render


def test_render_without_failures_or_results():
    md = render(results_of(run_of("1", 2, sft="passed"), worlds=(2,)))
    assert "No test failed on any release." in md
    empty = Results("trl", ["x"])
    empty.plan(["1.0"], [2])
    assert "| (no test results yet) | \u00b7 |" in render(empty)


# --------------------------------------------------------------------------- JSON


def test_json_round_trip_is_stable_and_one_line_per_test(tmp_path):
    r = three_releases()
    text = r.dumps()
    assert Results.loads(text).dumps() == text
    doc = json.loads(text)
    assert doc["schema"] == 1 and doc["versions"] == ["0.14.0", "0.15.0", "0.16.0"] and doc["worlds"] == [2, 4]
    assert doc["runs"]["0.15.0"]["4"]["tests"][SFT] == {"outcome": "failed", "headline": H}
    assert doc["runs"]["0.16.0"]["2"]["env"] == {"ok": False, "reason": "No solution found when resolving "
                                                 "dependencies", "seconds": None}
    assert f'     "{SFT}": {{"headline": "{H}", "outcome": "failed"}}' in text.splitlines()  # one line a test
    r.save(tmp_path / "m.json")
    assert (tmp_path / "m.json").read_text() == text and not (tmp_path / "m.json.tmp").exists()
    back = Results.load(tmp_path / "m.json")
    assert back.get("0.15.0", 4).tests[DPO].headline == "AssertionError: x" and back.get("0.17.0", 2) is None


def test_json_schema_and_garbage_are_refused():
    with pytest.raises(ResultsError, match="schema 99"):
        Results.loads('{"schema": 99}')
    with pytest.raises(ResultsError, match="not JSON"):
        Results.loads("{")
    with pytest.raises(ResultsError, match="malformed"):
        Results.loads('{"schema": 1, "runs": {"1.0": {"2": {"tests": ["a"]}}}}')


def test_resume_merges_columns_in_release_order():
    r = results_of(run_of("0.9.0", 2, sft="passed"), worlds=(2,))
    r.plan(["0.10.0", "0.9.0"], [4])
    r.put(run_of("0.10.0", 4, sft="passed"))
    assert r.versions == ["0.9.0", "0.10.0"] and r.worlds == [2, 4]
    assert r.get("0.9.0", 2) is not None and r.get("0.9.0", 4) is None


def test_latest_patches_keeps_named_versions():
    vs = ["0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "1.0.0", "1.0.1"]
    assert latest_patches(vs) == ["0.14.0", "0.15.2", "0.16.0", "1.0.1"]
    assert latest_patches(vs, keep=["0.15.0"]) == ["0.14.0", "0.15.0", "0.15.2", "0.16.0", "1.0.1"]


# --------------------------------------------------------------------------- CLI with fakes

RELEASES = ["0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.16.0", "0.17.0rc1"]
BASE = BaseInfo("python", "3.11.7", "2.13.0+cpu", "/base")
NOW = __import__("datetime").datetime(2026, 5, 10, 12, 0, tzinfo=__import__("datetime").timezone.utc)


def version_of(python):
    return (python.parent.parent / "version").read_text()


class FakeRunner:
    """sft fails at world 4 on 0.15.x; dpo is skipped at world 4; ``interrupt_at`` raises Ctrl-C."""

    def __init__(self, interrupt_at=None, timeout_at=None, peek=None, terminated_at=None):
        self.calls, self.interrupt_at, self.timeout_at, self.peek, self.seen = [], interrupt_at, timeout_at, peek, []
        self.terminated_at = terminated_at

    def __call__(self, python, args, *, log, timeout, cwd, stream):
        version, world = version_of(python), int(args[-1].split("=")[1])
        self.calls.append((version, world, list(args)))
        if self.peek:  # what is on disk when a run starts: (runs in the JSON, Markdown columns with results)
            doc = json.loads((self.peek / "m.json").read_text()) if (self.peek / "m.json").exists() else {"runs": {}}
            md = (self.peek / "M.md").read_text() if (self.peek / "M.md").exists() else ""
            self.seen.append((sum(len(x) for x in doc["runs"].values()), md.count("| ok (built")))
        if (version, world) == self.interrupt_at:
            raise KeyboardInterrupt
        if (version, world) == self.terminated_at:  # somebody killed the pytest: no result
            return RunOutcome(-15, 1.0, Verdict.SKIP, "pytest exited -15", [], log, False)
        if (version, world) == self.timeout_at:
            return RunOutcome(None, 60.0, Verdict.SKIP, "pytest did not finish within 60s", [], log, True)
        sft_bad = version.startswith("0.15") and world == 4
        cases = [CaseResult(SFT, "failed", message="AssertionError: boom",
                            properties={"nccl_diagnosis": H}) if sft_bad else CaseResult(SFT, "passed"),
                 CaseResult(DPO, "skipped", message="needs 4 GPUs") if world == 4 else CaseResult(DPO, "passed")]
        return RunOutcome(1 if sft_bad else 0, 2.0, Verdict.BAD if sft_bad else Verdict.GOOD, None, cases, log)


def drive(argv, tmp_path, builder=None, runner=None, index=None):
    builder, runner, out, err = builder or FakeBuilder(), runner or FakeRunner(), io.StringIO(), io.StringIO()
    ns = matrix_cli.parse_args(argv)
    cache = EnvCache(tmp_path / "cache", builder, BASE)
    code = matrix_cli.run(ns, out, err=err, index=index or StaticIndex({"trl": RELEASES}),
                          make_cache=lambda ns, out, prog: (cache, "fake", ["pytest>=8"], [], ["torch==2.13.0+cpu"]),
                          run_tests=runner, packages_of=lambda python, names: dict(PKGS, trl=version_of(python)),
                          now=lambda: NOW)
    return code, out.getvalue() + err.getvalue(), builder, runner  # errors last: they are on stderr


def argv_for(tmp_path, *extra):
    return ["trl", "--from", "0.14.0", "--to", "0.16.0", "--world", "4", "--world", "2",
            "--results", str(tmp_path / "m.json"), "--out", str(tmp_path / "M.md"), *extra, "--", "suites/trl/matrix"]


def test_cli_one_run_writes_json_and_markdown(tmp_path):
    code, out, builder, runner = drive(argv_for(tmp_path), tmp_path, runner=FakeRunner(peek=tmp_path))
    # the JSON is saved after every run, the Markdown after every release
    assert runner.seen == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (6, 3), (7, 3)]
    assert code == 0 and builder.calls == ["0.14.0", "0.15.0", "0.15.1", "0.16.0"]
    assert [(v, w) for v, w, _ in runner.calls][:3] == [("0.14.0", 2), ("0.14.0", 4), ("0.15.0", 2)]
    assert runner.calls[0][2] == ["suites/trl/matrix", "--nccl-world=2"]
    assert "[1/8] trl 0.14.0 w2: env built in" in out and "tests 2.0s: 2 passed" in out
    assert "[2/8] trl 0.14.0 w4: env ready, tests 2.0s: 1 passed, 1 skipped" in out
    assert "[4/8] trl 0.15.0 w4: env ready, tests 2.0s: 1 failed, 1 skipped" in out
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["worlds"] == [2, 4] and doc["versions"] == ["0.14.0", "0.15.0", "0.15.1", "0.16.0"]
    assert doc["runs"]["0.15.0"]["4"]["tests"][SFT] == {"outcome": "failed", "headline": H}
    assert doc["runs"]["0.15.0"]["4"]["packages"]["trl"] == "0.15.0" and doc["torch"] == "2.13.0+cpu"
    assert doc["command"].startswith("pytest-nccl matrix trl --from 0.14.0 --to 0.16.0")
    md = (tmp_path / "M.md").read_text()
    assert ("| sft \u00b7 ragged | pass | w2 pass; w4: \u274c shape mismatch: all_gather "
            "| w2 pass; w4: \u274c shape") in md
    assert "| dpo \u00b7 even\u00b9 | w2 pass; w4 skip |" in md
    assert ("- **sft \u00b7 ragged**: red on 0.15.0\u20130.15.1; first bad 0.15.0; fixed in 0.16.0; "
            "newest 0.16.0: pass") in md


def test_cli_second_run_runs_nothing_and_rerun_runs_again(tmp_path):
    drive(argv_for(tmp_path), tmp_path)
    before = (tmp_path / "m.json").read_text(), (tmp_path / "M.md").read_text()
    code, out, builder, runner = drive(argv_for(tmp_path), tmp_path)
    assert code == 0 and runner.calls == [] and builder.calls == []
    assert "8 of 8 runs there already, 0 to run (--rerun to run them again)" in out
    assert ((tmp_path / "m.json").read_text(), (tmp_path / "M.md").read_text()) == before
    code, out, builder, runner = drive(argv_for(tmp_path, "--rerun"), tmp_path)
    assert code == 0 and len(runner.calls) == 8 and builder.calls == []  # envs come from the cache
    assert "[1/8] trl 0.14.0 w2: env cached (" in out


def test_cli_resumes_a_partial_results_file(tmp_path):
    argv = argv_for(tmp_path)
    drive(argv[:2] + ["0.14.0", "--to", "0.15.0"] + argv[5:], tmp_path)
    code, out, _, runner = drive(argv, tmp_path)
    assert code == 0 and {v for v, _, _ in runner.calls} == {"0.15.1", "0.16.0"}
    assert "4 of 8 runs there already, 4 to run" in out


def test_cli_interrupted_keeps_what_ran(tmp_path):
    code, out, _, runner = drive(argv_for(tmp_path), tmp_path, runner=FakeRunner(interrupt_at=("0.15.0", 4)))
    assert code == 130 and "interrupted" in out
    doc = json.loads((tmp_path / "m.json").read_text())
    assert sorted((v, w) for v in doc["runs"] for w in doc["runs"][v]) == [("0.14.0", "2"), ("0.14.0", "4"),
                                                                           ("0.15.0", "2")]
    assert "| sft \u00b7 ragged | pass | w2 pass; w4 \u00b7 | \u00b7 | \u00b7 |" in (tmp_path / "M.md").read_text()
    _, _, _, runner = drive(argv_for(tmp_path), tmp_path)
    assert [(v, w) for v, w, _ in runner.calls][0] == ("0.15.0", 4)


def test_cli_a_pytest_killed_from_outside_is_an_interruption_not_a_result(tmp_path):
    code, out, _, _ = drive(argv_for(tmp_path), tmp_path, runner=FakeRunner(terminated_at=("0.15.0", 2)))
    assert code == 130 and "interrupted" in out
    doc = json.loads((tmp_path / "m.json").read_text())
    assert sorted((v, w) for v in doc["runs"] for w in doc["runs"][v]) == [("0.14.0", "2"), ("0.14.0", "4")]
    _, _, _, runner = drive(argv_for(tmp_path), tmp_path)
    assert [(v, w) for v, w, _ in runner.calls][0] == ("0.15.0", 2)


def test_cli_release_that_cannot_install(tmp_path):
    code, out, _, runner = drive(argv_for(tmp_path), tmp_path, builder=FakeBuilder(uninstallable={"0.15.1"}))
    assert code == 0 and "0.15.1" not in {v for v, _, _ in runner.calls}
    assert "trl 0.15.1 w2: env failed in" in out and ": cannot install: No solution found" in out
    assert "trl 0.15.1 w4: env failed: cannot install" in out
    md = (tmp_path / "M.md").read_text()
    assert "| test | 0.14.0 | 0.15.0 | 0.15.1 \u2717 | 0.16.0 |" in md
    assert "\u2717 0.15.1: cannot install: No solution found when resolving dependencies" in md
    assert md.count("| \u2014 |") == 2 and "cannot install: No" not in md.split("## Matrix")[1].split("\n\n")[1]
    assert "red on 0.15.0; first bad 0.15.0; fixed in 0.16.0" in md  # 0.15.1 untested: not a verdict
    assert json.loads((tmp_path / "m.json").read_text())["runs"]["0.15.1"]["2"]["env"]["ok"] is False


def test_cli_timeout_is_a_red_cell_with_its_reason(tmp_path):
    _, out, _, _ = drive(argv_for(tmp_path), tmp_path, runner=FakeRunner(timeout_at=("0.16.0", 2)))
    assert "s, tests 60.0s: no tests (pytest did not finish within 60s)\n[8/8] trl 0.16.0 w4: env ready" in out
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["runs"]["0.16.0"]["2"]["problem"] == "pytest did not finish within 60s"
    assert "newest 0.16.0: red" not in (md := (tmp_path / "M.md").read_text())
    i = md.index("- **sft \u00b7 ragged**: red on 0.15.0\u20130.16.0; first bad 0.15.0; red on the newest (0.16.0)")
    assert md[i:].splitlines()[1:3] == ["  - 0.16.0: w4 pass; w2: pytest did not finish within 60s",
                                        f"  - 0.15.0 (first bad): w2 pass; w4: {H}"]


def test_cli_render_only(tmp_path, capsys):
    drive(argv_for(tmp_path), tmp_path)
    md = (tmp_path / "M.md").read_text()
    (tmp_path / "M.md").unlink()
    out = io.StringIO()
    code = matrix_cli.main(["--render-only", "--results", str(tmp_path / "m.json"), "--out", str(tmp_path / "M.md")],
                           out=out)
    assert code == 0 and (tmp_path / "M.md").read_text() == md
    code = matrix_cli.main(["--render-only", "--results", str(tmp_path / "none.json")], out=(out := io.StringIO()))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pytest-nccl matrix: cannot read") and err.count("\n") == 1
    assert out.getvalue() == ""


def test_cli_latest_patch_versions_and_index_errors(tmp_path):
    _, out, _, _ = drive(argv_for(tmp_path, "--latest-patch", "--keep", "0.15.0"), tmp_path)
    assert "trl 0.14.0, 0.15.0, 0.15.1, 0.16.0 (4 releases)" in out
    _, out, _, _ = drive(argv_for(tmp_path / "b", "--latest-patch"), tmp_path)
    assert "trl 0.14.0, 0.15.1, 0.16.0 (3 releases)" in out
    argv = ["trl", "--versions", "0.16.0 0.13.0", "--as-of", "now", "--results", str(tmp_path / "c.json"), "--", "x"]
    code, out, _, runner = drive(argv, tmp_path)
    assert code == 0 and "trl 0.13.0, 0.16.0 (2 releases) x world 2" in out and len(runner.calls) == 2
    code, out, _, _ = drive(["trl", "--from", "0.14.0", "--to", "9.9", "--results", str(tmp_path / "d.json"),
                             "--", "x"], tmp_path)
    assert code == 4 and "9.9 is not a release" in out


def test_cli_refuses_a_results_file_of_another_selection(tmp_path):
    drive(argv_for(tmp_path), tmp_path)
    code, out, _, runner = drive(argv_for(tmp_path)[:-1] + ["suites/trl/other"], tmp_path)
    assert code == 2 and runner.calls == [] and "was made with `pytest suites/trl/matrix`" in out
    code, _, _, runner = drive(argv_for(tmp_path, "--rerun")[:-1] + ["suites/trl/other"], tmp_path)
    assert code == 0 and len(runner.calls) == 8


@pytest.mark.parametrize("argv,message", [
    (["trl", "--from", "1.0", "--results", "m.json", "--", "x"], "give the releases"),
    (["trl", "--versions", "1.0", "--from", "1.0", "--to", "2.0", "--results", "m.json", "--", "x"], "not both"),
    (["trl", "--versions", "1.0", "--results", "m.json"], "after '--'"),
    (["trl", "--versions", "1.0,banana", "--results", "m.json", "--", "x"], "'banana' is not a version"),
    (["trl", "--versions", "1.0", "--results", "m.json", "--", "x", "--nccl-world=4"], "leave --nccl-world out"),
    (["trl", "--versions", "1.0", "--world", "0", "--results", "m.json", "--", "x"], "--world must be at least 1"),
    (["trl", "--versions", "1.0", "--world", "two", "--results", "m.json", "--", "x"], "invalid int value"),
    (["trl", "--versions", "1.0", "--results", "m.json", "--as-of", "soon", "--", "x"], "--as-of"),
    (["trl", "--versions", "1.0", "--", "x"], "--results"),
    (["--versions", "1.0", "--results", "m.json", "--", "x"], "give the PACKAGE"),
    (["trl", "--versions", "1.0", "--results", "m.md", "--", "x"], "same file"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    assert matrix_cli.main(argv) == 2
    err = capsys.readouterr().err
    error_lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(error_lines) == 1 and message in error_lines[0] and "Traceback" not in err


def test_dunder_main_dispatches_matrix(capsys):
    assert dunder_main(["--help"]) == 0 and "matrix" in capsys.readouterr().out
    assert dunder_main(["matrix", "trl"]) == 2
    assert "--results" in capsys.readouterr().err


def test_short_headlines_name_the_kind_of_failure():
    assert short_headline(H) == "shape mismatch: all_gather"
    assert short_headline("op mismatch at collective #15 of group default: ranks 0-2 all_gather, rank 3 "
                          "all_reduce (from x.py:1)") == "op mismatch"
    assert short_headline("rank 2 skipped all_reduce #1 of group tp[2,3] from a.py:50 and waits in barrier "
                          "#1 of group default") == "rank skipped all_reduce"
    assert short_headline("rank 1 left the test (passed) after 12 collectives in group default; ranks 0,2 "
                          "wait in all_gather #13") == "hang: a rank left early"
    assert short_headline("ranks 0,1 raised AttributeError: 'DistributedDataParallel' object has no "
                          "attribute 'config'") == "AttributeError"
    assert short_headline("rank 0 killed by SIGABRT [1 collective]") == "killed by SIGABRT"
    assert short_headline("x" * 100) == "x" * 39 + "\u2026"


NOTES = '''
[[note]]
rows = ["cpo \u00b7 *", "orpo \u00b7 ragged"]
text = "trl#3068: logits gathered with a per-rank length"

[[note]]
rows = ["grpo \u00b7 *"]
text = "trained 0 steps"
new = true
'''


def test_notes_parse_match_and_refuse_bad_input():
    from pytest_nccl.bisect.matrix.findings import note_for, parse_notes
    from pytest_nccl.bisect.matrix.results import ResultsError

    notes = parse_notes(NOTES)
    assert note_for("cpo \u00b7 eval_uneven", notes).text.startswith("trl#3068")
    assert note_for("orpo \u00b7 ragged", notes) is notes[0] and note_for("orpo \u00b7 baseline", notes) is None
    assert note_for("grpo \u00b7 uneven_rows", notes).new
    for bad in ("[[note]]\ntext = 'x'\n", "[[note]]\nrows = ['a']\n", "[[note\n"):
        with pytest.raises(ResultsError, match="notes"):
            parse_notes(bad)


def test_findings_of_one_trainer_that_read_the_same_are_one_group_with_its_note():
    from pytest_nccl.bisect.matrix.findings import group_findings, parse_notes

    bad = ("failed", H)
    other = ("failed", "ranks 0,1 raised AttributeError: x")
    r = results_of(run_of("1", 2, cpo_a="passed", cpo_b="passed", cpo_c="passed", sft_a="passed"),
                   run_of("2", 2, cpo_a=bad, cpo_b=bad, cpo_c=other, sft_a=bad),
                   run_of("3", 2, cpo_a="passed", cpo_b="passed", cpo_c="passed", sft_a="passed"), worlds=(2,))
    groups = group_findings(findings(r), parse_notes(NOTES))
    titles = [g.title() for g in groups]
    assert titles == ["cpo \u00b7 a, b", "cpo \u00b7 c", "sft \u00b7 a"], titles
    assert groups[0].notes[0][1].text.startswith("trl#3068") and groups[2].notes == []
    md = render(r, notes=parse_notes(NOTES))
    assert "- **cpo \u00b7 a, b**: red on 2; first bad 2; fixed in 3; newest 3: pass" in md
    assert "  - known: trl#3068: logits gathered with a per-rank length" in md


def test_the_notes_about_text_goes_under_the_title(tmp_path):
    from pytest_nccl.bisect.matrix.findings import parse_about

    text = 'about = """Rows are trainer \u00b7 stressor."""\n' + NOTES
    assert parse_about(text) == "Rows are trainer \u00b7 stressor." and parse_about(NOTES) == ""
    (tmp_path / "notes.toml").write_text(text)
    drive(argv_for(tmp_path), tmp_path)
    md = (tmp_path / "M.md").read_text().splitlines()
    assert md[4] == "Rows are trainer \u00b7 stressor." and md[6] == "## Stacks"


def test_a_row_red_for_two_reasons_gets_the_note_of_each_range():
    from pytest_nccl.bisect.matrix.findings import parse_notes

    notes = parse_notes('''
[[note]]
rows = ["sft \u00b7 *"]
releases = ">=2,<3"
text = "the gather bug"

[[note]]
rows = ["sft \u00b7 *"]
releases = "==4"
new = true
text = "the triton bug"
''')
    bad = ("failed", H)
    crash = ("failed", "ranks 0,1 raised AttributeError: x")
    r = results_of(run_of("1", 2, sft_a="passed"), run_of("2", 2, sft_a=bad), run_of("3", 2, sft_a="passed"),
                   run_of("4", 2, sft_a=crash), run_of("5", 2, sft_a="passed"), worlds=(2,))
    md = render(r, notes=notes)
    assert "- **sft \u00b7 a**: red on 2, 4; first bad 2, 4; fixed in 3, 5; newest 5: pass" in md
    assert "  - known (2): the gather bug" in md and "  - new finding (4): the triton bug" in md
    with pytest.raises(ResultsError, match="specifier"):
        parse_notes('[[note]]\nrows = ["a"]\ntext = "x"\nreleases = "~~1"\n')
