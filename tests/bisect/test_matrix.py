"""The release matrix's pure part: labels, cells, ranges, findings, Markdown, JSON, notes (the CLI end
to end on fakes: test_matrix_cli.py)."""

import json

import pytest
from matrix_data import DPO, GRPO, NOTES, PKGS, SFT, H, M

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
