"""JUnit parsing, verdicts from pytest runs, and one real (tiny, torch-free) pytest subprocess."""

import sys
import textwrap
from pathlib import Path

import pytest

from pytest_nccl.bisect.runner import (
    CaseResult,
    build_command,
    first_line,
    make_shim,
    parse_junit,
    plugin_entry_points,
    run_pytest,
    verdict_from_run,
)
from pytest_nccl.bisect.search import Verdict
from pytest_nccl.core.states import CaseOutcome, Phase

JUNIT_FAIL = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0"
failures="2" tests="3"><testcase classname="suites.trl.test_cpo" name="test_ok" time="1.0" />
<testcase classname="suites.trl.test_cpo" name="test_cpo_world2" time="3.2"><properties>
<property name="nccl_diagnosis" value="shape mismatch in all_gather #3 of group default: rank 0 [2, 7, 32], rank 1 [2, 5, 32] (call site trl/trainer/cpo_trainer.py:512)" />
</properties><failure message="pytest_nccl.errors.CollectiveMismatch: shape mismatch in all_gather #3&#10;trace...">long</failure></testcase>
<testcase classname="suites.trl.test_cpo" name="test_second" time="1.0"><failure message="AssertionError: x">t</failure></testcase>
</testsuite></testsuites>"""  # noqa: E501  (pytest's JUnit XML, verbatim)

JUNIT_COLLECT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1">
<testcase classname="" name="suites.trl.test_cpo" time="0.000"><error message="collection failure">ImportError while importing test module '/x/test_cpo.py'.
Traceback:
E   ModuleNotFoundError: No module named 'trl.trainer.cpo_config'</error></testcase></testsuite></testsuites>"""  # noqa: E501  (pytest's JUnit XML, verbatim)

JUNIT_INFRA = """<testsuites><testsuite><testcase classname="t" name="a"><properties><property name="nccl_infra" value="true"/></properties>
<failure message="pytest_nccl.errors.RankSetupError: rank 1 could not start">x</failure></testcase></testsuite></testsuites>"""  # noqa: E501  (pytest's JUnit XML, verbatim)


def test_parse_junit_headline_from_property_then_message():
    cases = parse_junit(JUNIT_FAIL)
    assert [c.outcome for c in cases] == [CaseOutcome.PASSED, CaseOutcome.FAILED, CaseOutcome.FAILED]
    assert all(type(c.outcome) is CaseOutcome for c in cases) and all(c.when is Phase.CALL for c in cases)
    assert cases[1].nodeid == "suites.trl.test_cpo::test_cpo_world2"
    assert cases[1].headline.startswith("shape mismatch in all_gather #3 of group default: rank 0 [2, 7, 32]")
    assert cases[2].headline == "AssertionError: x"


def test_parse_junit_tells_a_collection_error_by_its_phase():
    (case,) = parse_junit(JUNIT_COLLECT)
    assert case.outcome is CaseOutcome.ERROR and case.when is Phase.COLLECT
    assert case.as_failure().when is Phase.COLLECT


def test_first_line_strips_the_module_path_of_the_exception():
    assert first_line("pytest_nccl.errors.CollectiveTimeout: all ranks in all_reduce #7\nmore") == \
        "CollectiveTimeout: all ranks in all_reduce #7"
    assert first_line("\n  AssertionError: x") == "AssertionError: x"
    assert first_line("") == ""


def test_verdicts():
    fail = parse_junit(JUNIT_FAIL)
    assert verdict_from_run(0, []) == (Verdict.GOOD, None)
    v, h = verdict_from_run(1, fail)
    assert v is Verdict.BAD and h.startswith("shape mismatch in all_gather #3")
    v, h = verdict_from_run(2, parse_junit(JUNIT_COLLECT))
    assert v is Verdict.SKIP and "No module named 'trl.trainer.cpo_config'" in h
    v, h = verdict_from_run(1, parse_junit(JUNIT_INFRA))
    assert v is Verdict.SKIP and "RankSetupError" in h
    assert verdict_from_run(125, [])[0] is Verdict.SKIP
    assert verdict_from_run(5, []) == (Verdict.SKIP, "no tests collected")
    v, h = verdict_from_run(4, [], output_tail="ERROR: usage: pytest ...\nerror: unrecognized arguments: --bogus\n")
    assert v is Verdict.SKIP and "unrecognized arguments" in h
    assert verdict_from_run(3, [])[0] is Verdict.SKIP
    assert verdict_from_run(None, [], timed_out=True, timeout=60) == (Verdict.SKIP, "pytest did not finish within 60s")
    # a rank that failed to import trl is not a verdict on trl's behaviour...
    imp = [CaseResult("t::a", "failed",
                      "pytest_nccl.errors.RankRaised: rank 0: ModuleNotFoundError: No module named 'trl'")]
    assert verdict_from_run(1, imp)[0] is Verdict.SKIP
    # ...but a hang is, whatever its text mentions
    hang = [CaseResult("t::a", "failed", "CollectiveTimeout: ranks stuck after ImportError fallback")]
    assert verdict_from_run(1, hang)[0] is Verdict.BAD
    # mixed infra + real failure: the real one decides
    assert verdict_from_run(1, parse_junit(JUNIT_INFRA) + fail)[0] is Verdict.BAD


def test_build_command():
    cmd = build_command(Path("/e/bin/python"), ["suites/trl", "-k", "cpo"], Path("/t/j.xml"), "pytest_nccl.plugin")
    assert cmd == ["/e/bin/python", "-m", "pytest", "suites/trl", "-k", "cpo", "-p", "no:cacheprovider",
                   "--junitxml=/t/j.xml", "-p", "pytest_nccl.plugin"]
    assert build_command(Path("p"), [], Path("j"), None)[-1] == "--junitxml=j"


@pytest.fixture
def tiny_suite(tmp_path):
    d = tmp_path / "suite"
    d.mkdir()
    (d / "test_tiny.py").write_text(textwrap.dedent("""
        import os, time
        def test_ok():
            import pytest_nccl.bisect  # the checkout is importable through the shim
        def test_maybe_fail():
            assert os.environ.get("TINY_FAIL") != "1", "tiny failure headline"
        def test_maybe_hang():
            if os.environ.get("TINY_HANG") == "1":
                time.sleep(60)
    """))
    return d


def test_run_pytest_real_subprocess(tmp_path, tiny_suite, monkeypatch):
    monkeypatch.delenv("TINY_FAIL", raising=False)
    out = run_pytest(Path(sys.executable), [str(tiny_suite), "-q", "-p", "no:nccl"], log=tmp_path / "p.log",
                     timeout=120, cwd=tiny_suite)
    assert out.exit_code == 0 and out.verdict is Verdict.GOOD, (tmp_path / "p.log").read_text()
    assert len(out.cases) == 3 and out.seconds > 0
    monkeypatch.setenv("TINY_FAIL", "1")
    out = run_pytest(Path(sys.executable), [str(tiny_suite), "-q", "-p", "no:nccl"], log=tmp_path / "p.log",
                     timeout=120, cwd=tiny_suite)
    assert out.verdict is Verdict.BAD and out.headline.startswith("AssertionError: tiny failure headline")
    assert "[exit 1]" in (tmp_path / "p.log").read_text()


def test_run_pytest_timeout_kills_and_skips(tmp_path, tiny_suite, monkeypatch):
    monkeypatch.setenv("TINY_HANG", "1")
    out = run_pytest(Path(sys.executable), [str(tiny_suite), "-q", "-k", "hang", "-p", "no:nccl"],
                     log=tmp_path / "p.log", timeout=3, cwd=tiny_suite)
    assert out.timed_out and out.verdict is Verdict.SKIP and out.seconds < 30


def test_shim_exposes_the_checkout_and_its_entry_point(tmp_path):
    import importlib.metadata as md

    shim = make_shim(tmp_path / "shim")
    assert (shim / "pytest_nccl" / "bisect" / "runner.py").exists()
    dists = [d for d in md.distributions(path=[str(shim)])]
    assert [d.metadata["Name"] for d in dists] == ["pytest-nccl"]
    eps = [(ep.group, ep.name, ep.value) for ep in dists[0].entry_points]
    assert ("pytest11", "nccl", "pytest_nccl.plugin") in eps
    assert len(list(shim.iterdir())) == 2  # nothing else of the developer venv leaks in


def test_plugin_entry_points_from_pyproject(tmp_path):
    pp = tmp_path / "pyproject.toml"
    pp.write_text('[project]\nname = "pytest-nccl"\nversion = "9.1"\n'
                  '[project.entry-points.pytest11]\nnccl = "pytest_nccl.plugin"\n')
    assert plugin_entry_points(pp) == ("9.1", {"nccl": "pytest_nccl.plugin"})


def test_parse_junit_tells_xfail_from_skip():
    cases = parse_junit('<testsuites><testsuite><testcase classname="t" name="a"><skipped type="pytest.xfail" '
                        'message="known bug" /></testcase><testcase classname="t" name="b"><skipped '
                        'type="pytest.skip" message="needs 4 GPUs">t.py:3: needs 4 GPUs</skipped></testcase>'
                        '</testsuite></testsuites>')
    assert [(c.outcome, c.headline) for c in cases] == [(CaseOutcome.XFAILED, "known bug"),
                                                            (CaseOutcome.SKIPPED, "needs 4 GPUs")]
    assert verdict_from_run(0, cases)[0] is Verdict.GOOD


def test_a_run_where_every_test_skipped_is_no_verdict():
    """exit 0 with nothing run (the release lacks what the tests drive) is a skip, not a good release."""
    cases = parse_junit('<testsuites><testsuite><testcase classname="t" name="a"><skipped type="pytest.skip" '
                        'message="verl 0.8.0 has no legacy FSDP actor">t.py:3</skipped></testcase><testcase '
                        'classname="t" name="b"><skipped type="pytest.skip" message="no GPU" /></testcase>'
                        '</testsuite></testsuites>')
    assert verdict_from_run(0, cases) == (Verdict.SKIP, "every test skipped: verl 0.8.0 has no legacy FSDP actor")
    passed = parse_junit('<testsuites><testsuite><testcase classname="t" name="c" /></testsuite></testsuites>')
    assert verdict_from_run(0, cases + passed) == (Verdict.GOOD, None)
