"""The release matrix's CLI end to end on a fake index, a fake env builder and a fake pytest runner (no
network, no real envs): runs, resumes, interruptions, timeouts, usage errors."""

import io
import json

import pytest
from fakes import FakeBuilder
from matrix_data import DPO, NOTES, PKGS, SFT, H

from pytest_nccl.__main__ import main as dunder_main
from pytest_nccl.bisect.envs import BaseInfo, EnvCache
from pytest_nccl.bisect.matrix import cli as matrix_cli
from pytest_nccl.bisect.runner import CaseResult, RunOutcome
from pytest_nccl.bisect.search import Verdict
from pytest_nccl.bisect.versions import StaticIndex

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


def test_the_notes_about_text_goes_under_the_title(tmp_path):
    from pytest_nccl.bisect.matrix.findings import parse_about

    text = 'about = """Rows are trainer \u00b7 stressor."""\n' + NOTES
    assert parse_about(text) == "Rows are trainer \u00b7 stressor." and parse_about(NOTES) == ""
    (tmp_path / "notes.toml").write_text(text)
    drive(argv_for(tmp_path), tmp_path)
    md = (tmp_path / "M.md").read_text().splitlines()
    assert md[4] == "Rows are trainer \u00b7 stressor." and md[6] == "## Stacks"
