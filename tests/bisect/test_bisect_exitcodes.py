"""The exit-status mapping the plugin uses for ``git bisect run``."""

from types import SimpleNamespace

import pytest

from pytest_nccl.core.states import Phase
from pytest_nccl.exitcodes import (
    EXIT_GIT_BISECT_SKIP,
    Failure,
    crash_line,
    failure_from_report,
    git_bisect_meaning,
    is_infrastructure,
    map_exitstatus,
)

IMPORT = Failure("t.py::a", "call", "ModuleNotFoundError: No module named 'trl'")
SETUP = Failure("t.py::a", "call", "pytest_nccl.errors.RankSetupError: rank 1 could not start")
COLLECT = Failure("suites/trl/test_cpo.py", "collect", "SyntaxError")
HANG = Failure("t.py::b", "call", "pytest_nccl.errors.CollectiveTimeout: all ranks in all_reduce #4")
DESYNC = Failure("t.py::c", "call", "CollectiveMismatch: shape mismatch in all_gather #3")
ASSERT = Failure("t.py::d", "call", "AssertionError: loss differs")


def test_classification():
    assert all(is_infrastructure(f) for f in (IMPORT, SETUP, COLLECT))
    assert not any(is_infrastructure(f) for f in (HANG, DESYNC, ASSERT))
    assert is_infrastructure(Failure("x", "call", "AssertionError", infra=True))
    assert not is_infrastructure(Failure("x", "call", "ImportError: y", infra=False))
    assert is_infrastructure(Failure("x", "setup", "whatever", kind="infra"))
    # a hang whose text mentions an import error is still a hang
    assert not is_infrastructure(Failure("x", "call", "CollectiveTimeout: stuck (ImportError in a hook)"))


@pytest.mark.parametrize("status,failures,expected", [
    (0, [], 0),
    (1, [HANG], 1),
    (1, [DESYNC, IMPORT], 1),
    (1, [IMPORT], 125),
    (1, [IMPORT, SETUP], 125),
    (2, [COLLECT], 125),
    (2, [], 2),  # Ctrl-C stays an interruption
    (3, [], 125),
    (4, [], 125),  # a node id not found at this commit, a bad setting: skip it
    (5, [], 125),
])
def test_map_exitstatus(status, failures, expected):
    assert map_exitstatus(status, failures, EXIT_GIT_BISECT_SKIP) == expected


def test_option_off_changes_nothing():
    for status in range(6):
        assert map_exitstatus(status, [IMPORT], None) == status
    assert map_exitstatus(5, [], 77) == 77


def test_git_bisect_meaning():
    assert [git_bisect_meaning(c) for c in (0, 1, 2, 5, 125, 127, 128, 255)] == \
        ["good", "bad", "bad", "bad", "skip", "bad", "abort", "abort"]
    # what pytest exits with for a hang or desync is 'bad' to git bisect, with or without the option
    assert git_bisect_meaning(map_exitstatus(1, [HANG])) == "bad"
    assert git_bisect_meaning(map_exitstatus(1, [IMPORT])) == "skip"


def test_failure_from_report_duck_types_pytest_reports():
    rep = SimpleNamespace(nodeid="t.py::a", when="call", user_properties=[("nccl_infra", "1")],
                          longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message="RuntimeError: boom\nmore")))
    f = failure_from_report(rep)
    assert f == Failure("t.py::a", "call", "RuntimeError: boom", infra=True, kind=None) and f.when is Phase.CALL
    coll = SimpleNamespace(nodeid="t.py",
                           longrepr="ImportError while importing test module\nE   ModuleNotFoundError: x")
    f = failure_from_report(coll)
    assert f.when is Phase.COLLECT and f.crash == "ModuleNotFoundError: x" and is_infrastructure(f)
    kind = SimpleNamespace(nodeid="n", when="setup", longrepr=None,
                           user_properties=[("nccl_diagnosis_kind", "setup")])
    assert is_infrastructure(failure_from_report(kind))


def test_crash_line_shapes():
    assert crash_line(None) == ""
    assert crash_line(("f.py", 3, "Skipped: why")) == "Skipped: why"
    assert crash_line("plain text\nlast line") == "last line"


def test_with_real_pytest_reports(pytester):
    """The adapter on real reports: a collection ImportError maps to 125, a failure stays 1."""
    pytester.makeconftest("""
        from pytest_nccl import exitcodes
        FAILS = []
        def pytest_collectreport(report):
            if report.failed: FAILS.append(exitcodes.failure_from_report(report))
        def pytest_runtest_logreport(report):
            if report.failed: FAILS.append(exitcodes.failure_from_report(report))
        import pytest
        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(session, exitstatus):
            session.exitstatus = exitcodes.map_exitstatus(int(exitstatus), FAILS, 125)
    """)
    pytester.makepyfile(test_imp="import not_a_module_xyz\ndef test_a(): pass\n")
    assert pytester.runpytest_subprocess("test_imp.py", "-p", "no:nccl").ret == 125
    pytester.makepyfile(test_fail="def test_b(): assert 0, 'real failure'\n")
    assert pytester.runpytest_subprocess("test_fail.py", "-p", "no:nccl").ret == 1
