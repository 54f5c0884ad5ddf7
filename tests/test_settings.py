"""Settings: options, ini keys and marker arguments come from one table and one parsing path; TOML
values are taken as pytest 9 types them; a bad value names its source and stops only a session
that runs tests (never --help, --version, --markers or --collect-only)."""

import pytest

from pytest_nccl.errors import NcclUsageError
from pytest_nccl.settings import (
    BY_NAME,
    MARKER,
    MARKER_ARGS,
    SETTINGS,
    Settings,
    ini_type,
    parse_switch,
    rank_fixture_conflict,
    unsupported_platform,
)

PYTEST_9 = int(pytest.__version__.split(".")[0]) >= 9

MARKED = """
import pytest

@pytest.mark.nccl
def test_marked(rank):
    pass

def test_plain():
    pass
"""


# -- the table --------------------------------------------------------------------------------------

def test_every_setting_is_one_row_and_one_field():
    assert [s.name for s in SETTINGS] == [f for f in Settings.__dataclass_fields__]
    assert {s.key for s in SETTINGS} == {"nccl_" + s.name for s in SETTINGS}
    assert BY_NAME["exitcode_infra"].option == "--nccl-exitcode-infra"
    assert BY_NAME["preload"].option is None and BY_NAME["preload"].ini == "linelist"
    assert BY_NAME["trace_dir"].ini is None


def test_the_marker_takes_what_the_table_says():
    assert MARKER_ARGS == ("world", "backend", "timeout")
    assert MARKER.startswith("nccl(world=None, backend=None, timeout=None):")


@pytest.mark.parametrize("declared, version, expected", [
    ("int", (8, 3), "string"), ("float", (8, 0), "string"), ("int", (8, 4), "int"), ("float", (9, 2), "float"),
    ("bool", (8, 0), "bool"), ("linelist", (8, 0), "linelist"), ("string", (9, 0), "string"),
])
def test_ini_types_fall_back_before_pytest_8_4(declared, version, expected):
    assert ini_type(declared, version) == expected


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), ("on", True), ("off", False),
                                             ("yes", True), ("0", False)])
def test_switch_takes_toml_booleans_and_words(value, expected):
    assert parse_switch(value, "x") is expected


def test_a_bad_switch_names_its_source():
    with pytest.raises(NcclUsageError, match=r"^ini key nccl_trace \(tox.ini\) must be on or off, got 'maybe'$"):
        parse_switch("maybe", "ini key nccl_trace (tox.ini)")


@pytest.mark.parametrize("argnames, from_plugin, parametrized, expected", [
    (("rank", "tmp_path"), {"rank"}, {}, None),
    (("backend",), set(), {"backend": "nccl"}, "'backend' is a parametrize argument"),
    (("rank", "device"), {"rank"}, {}, "'device' is a fixture of your own"),
    (("n",), set(), {"n": 1}, None),
])
def test_rank_fixture_conflicts(argnames, from_plugin, parametrized, expected):
    message = rank_fixture_conflict(argnames, from_plugin, parametrized)
    assert message == expected if expected is None else message.startswith(expected)


@pytest.mark.parametrize("platform, runs", [("linux", True), ("win32", False), ("darwin", False)])
def test_only_linux_runs_ranks(platform, runs):
    reason = unsupported_platform(platform)
    assert (reason is None) == runs
    if not runs:
        assert reason == f"pytest-nccl runs distributed tests on Linux only (this is {platform})"


# -- through pytest -----------------------------------------------------------------------------------

@pytest.mark.skipif(not PYTEST_9, reason="native [tool.pytest] TOML tables are pytest 9's")
def test_typed_toml_values_are_accepted(pytester):
    pytester.makefile(".toml", pyproject="[tool.pytest]\nnccl_world = 3\nnccl_timeout = 30\n"
                                         "nccl_trace = false\nnccl_preload = ['json']\n")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("--collect-only", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["nccl: world 3, backend *, timeout 30 s, trace off"])


def test_ini_strings_are_parsed(pytester):
    pytester.makeini("[pytest]\nnccl_world = 3\nnccl_timeout = 7.5\nnccl_trace = off\n")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("--collect-only", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["nccl: world 3, backend *, timeout 7.5 s, trace off"])


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("--markers",), ("--collect-only", "-q")])
def test_a_bad_ini_value_does_not_stop_help_version_markers_or_collect_only(pytester, args):
    pytester.makeini("[pytest]\nnccl_timeout = 0\n")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()


def test_a_bad_ini_value_names_the_ini_key_and_stops_a_run(pytester):
    pytester.makeini("[pytest]\nnccl_timeout = 0\n")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-nccl: ini key nccl_timeout (tox.ini) must be a number of "
                                 "seconds > 0, got *0*"])


def test_a_bad_option_names_the_option_and_an_override_names_o(pytester):
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--nccl-world=zero")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-nccl: --nccl-world must be a whole number of ranks >= 1, got 'zero'"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "nccl_spmd=sometimes")
    result.stderr.fnmatch_lines(["ERROR: pytest-nccl: -o nccl_spmd must be one of auto, on, off, got 'sometimes'"])


def test_the_nccl_backend_is_checked_when_a_group_starts_not_at_configure(pytester):
    """An IDE collects on a laptop without GPUs: asking for NCCL must not stop collection."""
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", "--nccl-backend=nccl")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*test_marked*", "*test_plain*"])


def test_pytest_timeouts_marker_is_declared_where_pytest_timeout_is_absent(pytester):
    """The plugin reads ``@pytest.mark.timeout`` without pytest-timeout too, so it declares it there."""
    pytester.makepyfile("import pytest\n\n\n@pytest.mark.timeout(5)\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--collect-only", "-q", "--strict-markers", "-p", "no:timeout",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
