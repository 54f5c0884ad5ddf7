"""--nccl-exitcode-infra: what cannot be tested at this commit exits 125 (git bisect's skip), usage
errors raised once the session runs included: a node id or file that does not exist at this commit,
a bad -k, a bad pytest-nccl setting. Without the flag pytest's usage error (4) stays."""

import pytest

TESTS = """
def test_here():
    pass
"""


@pytest.mark.parametrize("args", [
    ("test_bisected.py::test_added_later",),     # the test does not exist at this commit
    ("test_added_later.py",),                    # nor does its file
    ("-k", "here and",),                         # a -k this pytest does not parse
    ("test_bisected.py", "--nccl-timeout=0"),    # a setting this plugin does not take
])
def test_usage_errors_are_skips(pytester, args):
    pytester.makepyfile(test_bisected=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--nccl-exitcode-infra", *args)
    assert result.ret == 125, result.stdout.str() + result.stderr.str()
    assert "(exit 125: --nccl-exitcode-infra)" in result.stdout.str() + result.stderr.str()


def test_a_run_that_passes_stays_0(pytester):
    pytester.makepyfile(test_bisected=TESTS)
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider", "--nccl-exitcode-infra").ret == 0
