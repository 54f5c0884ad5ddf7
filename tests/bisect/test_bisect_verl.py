"""The bisect over verl's releases (the registry's list of 0.5.0 to 0.9.1), with a fake env builder
and a fake pytest run whose JUnit cases are what `pytest --nccl-world=2 suites/verl -k ragged` gave
on the real releases (.ci/verl_stacks.sh; a real bisect of 0.7.0/0.7.1 in the CHANGELOG): 0.7.0 and
earlier pass, 0.7.1 fails with CollectiveMismatch in verl's dp_actor.py, 0.8.0 and later skip (no
legacy actor). First bad: 0.7.1; no release is a proven fix: the skipping ones are no verdict."""

import io
from pathlib import Path

from fakes import FakeBuilder

from pytest_nccl.bisect import cli
from pytest_nccl.bisect.envs import BaseInfo, EnvCache
from pytest_nccl.bisect.runner import CaseResult, RunOutcome, verdict_from_run
from pytest_nccl.bisect.versions import StaticIndex

RELEASES = ["0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1"]
HEADLINE = ("op mismatch at collective #3 of group default: rank 0 all_reduce, rank 1 all_gather_single "
            "(from suites/verl/dynamic_batching.py:85; rank 1 from verl/workers/actor/dp_actor.py:352)")
NODE = "suites/verl/test_dynamic_batching.py::test_actor_log_prob_ragged_micro_batch_counts"
BASE = BaseInfo("python", "3.11.7", "2.13.0+cpu", "/base")


def verl_run(python, args, *, log, timeout, cwd, stream):
    """What the suite's ragged test gave on each real release, through the real verdict rule."""
    version = (Path(python).parent.parent / "version").read_text()
    if version == "0.7.1":
        rc, case = 1, CaseResult(NODE, "failed", HEADLINE, "", {"nccl_diagnosis": HEADLINE})
    elif version in ("0.8.0", "0.9.0", "0.9.1"):
        rc, case = 0, CaseResult(NODE, "skipped", f"verl {version} has no legacy FSDP actor", "", {})
    else:
        rc, case = 0, CaseResult(NODE, "passed", "", "", {})
    verdict, headline = verdict_from_run(rc, [case])
    return RunOutcome(rc, 1.0, verdict, headline, [case], log)


def drive(argv, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    cache = EnvCache(tmp_path / "cache", FakeBuilder(), BASE)
    code = cli.run(cli.parse_args(argv), out, err=err, index=StaticIndex({"verl": RELEASES}),
                   make_cache=lambda ns, out: (cache, "fake", ["pytest>=8"], [], ["torch==2.13.0+cpu"]),
                   run_tests=verl_run)
    return code, out.getvalue() + err.getvalue()


def test_first_bad_release_is_0_7_1(tmp_path):
    code, out = drive(["verl", "--good", "0.5.0", "--bad", "0.7.1", "--", "suites/verl", "-k", "ragged"], tmp_path)
    assert code == cli.EXIT_FOUND, out
    assert out.strip().splitlines()[-1] == f"first bad: verl 0.7.1 \u2014 {HEADLINE}"


def test_no_release_is_named_fixed_where_the_tests_skip(tmp_path):
    """0.8.0 removed the legacy actor: its run passes with every test skipped, which is no fix."""
    code, out = drive(["verl", "--bad", "0.7.1", "--good", "0.9.1", "--", "suites/verl", "-k", "ragged"], tmp_path)
    assert code == cli.EXIT_BOUNDS, out
    assert "first fixed:" not in out
    assert "bound 0.9.1 could not be tested: every test skipped: verl 0.9.1 has no legacy FSDP actor" in out


def test_sweep_gives_each_release_its_own_verdict(tmp_path):
    code, out = drive(["verl", "--sweep", "--from", "0.7.0", "--to", "0.9.1", "--", "suites/verl"], tmp_path)
    assert code == 1, out
    lines = out.strip().splitlines()
    table = lines[lines.index("sweep:") + 1:-1]
    assert [ln.split()[:2] for ln in table] == [["0.7.0", "good"], ["0.7.1", "bad"], ["0.8.0", "skip"],
                                                 ["0.9.0", "skip"], ["0.9.1", "skip"]], out
    assert lines[-1].startswith("bad: verl 0.7.1"), lines[-1]
