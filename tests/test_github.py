"""GitHub Actions (docs/ci.md): a failed distributed test, and a watch verdict, is one workflow-command
annotation at its call site in the checkout (the test's own line when that site is outside it),
escaped as GitHub's toolkit escapes it, at most 10 a session with a line for the rest; the job
summary gets a table. Unset (or ``--nccl-github=off``): no annotation, no summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import assert_no_leftovers, line_of
from watch_support import job_env, run_watch, torchrun

from pytest_nccl.views import github

# -- GitHub's rules, written out independently of the code under test --------------------------------
# @actions/core's command.ts: escapeData replaces % (first), \r, \n; escapeProperty also : and ,.
# The runner's ActionCommand reads a line "::name k=v,k=v::message" and unescapes in reverse.
COMMAND = re.compile(r"^::error (?P<props>[^:]*)::(?P<message>.*)$")


def unescape(text: str, prop: bool) -> str:
    pairs = [("%0D", "\r"), ("%0A", "\n")] + ([("%3A", ":"), ("%2C", ",")] if prop else []) + [("%25", "%")]
    for code, char in pairs:
        text = text.replace(code, char)
    return text


def parse(line: str) -> dict:
    """A workflow command as GitHub's runner reads it; fails on a line it would misread."""
    m = COMMAND.match(line)
    assert m, f"not an error command: {line!r}"
    props = {}
    for part in m.group("props").split(","):
        key, eq, value = part.partition("=")
        assert eq, f"property without a value in {line!r}"
        assert not re.search(r"%(?!25|0D|0A|3A|2C)", value), value
        props[key] = unescape(value, prop=True)
    message = m.group("message")
    assert "\n" not in message and "\r" not in message and not re.search(r"%(?!25|0D|0A)", message), message
    return dict(props, message=unescape(message, prop=False))


@pytest.mark.parametrize("text", ["plain", "50% done", "a:b,c", "two\nlines\r\n", "%0A literal", "%25 %3A"])
def test_escaping_follows_githubs_rules(text):
    assert github.escape_data(text) == text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    assert github.escape_property(text) == github.escape_data(text).replace(":", "%3A").replace(",", "%2C")
    note = github.Annotation(title=f"T:{text}", message=text, file=f"dir,x/{text}.py", line=7)
    read = parse(note.command())
    assert read == {"file": f"dir,x/{text}.py", "line": "7", "title": f"T:{text}", "message": text}


def test_a_session_annotates_ten_and_counts_the_rest():
    notes = [github.Annotation("RankRaised", f"rank 1 raised {i}", "t.py", i) for i in range(13)]
    lines = github.capped(notes)
    assert [parse(line)["line"] for line in lines[:10]] == [str(i) for i in range(10)]
    assert len(lines) == 11 and lines[10].startswith("pytest-nccl: 3 more failures not annotated")
    assert github.capped(notes[:10]) == lines[:10]


def test_a_site_outside_the_checkout_or_installed_in_it_is_not_the_users(tmp_path):
    root = str(tmp_path / "repo")
    venv_lib = f"{root}/.venv/lib/python3.11/site-packages/trl/trainer.py"
    chain = [(venv_lib, 448), ("/elsewhere/lib.py", 3), (f"{root}/tests/test_sft.py", 30)]
    assert github.locate([chain], root) == ("tests/test_sft.py", 30)
    assert github.locate([chain[:2]], root, (f"{root}/tests/test_sft.py", 12)) == ("tests/test_sft.py", 12)
    assert github.locate([chain[:2]], root) is None
    assert github.chain_frames(f"{root}/a.py:12 <- {root}/b.py:3") == [(f"{root}/a.py", 12), (f"{root}/b.py", 3)]


def test_the_mode_and_the_environment():
    assert github.wanted("auto", {}) == (False, None)
    assert github.wanted("auto", {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": "s.md"}) == (True, "s.md")
    assert github.wanted("on", {}) == (True, None)
    assert github.wanted("off", {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": "s.md"}) == (False, None)


# -- a real session ---------------------------------------------------------------------------------

HELPER = """
import torch
import torch.distributed as dist


def gather_ragged(rank):
    t = torch.ones(3 + 2 * rank)
    dist.all_gather([torch.empty(3 + 2 * rank) for _ in range(2)], t)
"""
OUTSIDE = """
import torch
import torch.distributed as dist


def reduce_on_rank_0(rank):
    if rank == 0:
        dist.all_reduce(torch.ones(1))
"""
INNER = """
import os, sys, time
import pytest, torch
import torch.distributed as dist

sys.path.insert(0, os.environ["OUTSIDE_LIB"])
import gh_helpers
import far_lib


@pytest.mark.nccl(world=2, timeout=30)
def test_shape(rank):
    gh_helpers.gather_ragged(rank)


@pytest.mark.nccl(world=2, timeout=30)
def test_raises(rank):
    assert rank == 0, "rank 1: 50%, a:b"


@pytest.mark.nccl(world=2, timeout=3)
def test_hang(rank):
    if rank == 1:
        time.sleep(60)
    dist.all_reduce(torch.ones(1))


@pytest.mark.nccl(world=2, timeout=30)
def test_outside(rank):
    far_lib.reduce_on_rank_0(rank)


@pytest.mark.nccl(world=2, timeout=30)
def test_passes(rank):
    dist.all_reduce(torch.ones(1))
"""
MORE = """
import socket
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.testing._internal.common_distributed import MultiProcessTestCase

import gh_helpers


def _spawned(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    gh_helpers.gather_ragged(rank)


def test_launched():  # ranks the test starts itself (docs/launched.md)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(port,), nprocs=2)


class TestAdopted(MultiProcessTestCase):  # torch's harness, adopted (docs/adopt.md)
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_adopted(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}", rank=self.rank, world_size=2)
        assert self.rank == 0, "an adopted rank disagrees"
"""


def inner_session(tmp_path: Path, *args: str, more: bool = False, **env: str) -> SimpleNamespace:
    """The module above in ``tmp_path/repo`` (its rootdir), its helper beside it and a library outside
    it (``more``: and a launched and an adopted test, in a module of their own: torch's harness is
    slow to import), run as a real pytest with ``env`` added to a GitHub-free environment."""
    repo, lib = tmp_path / "repo", tmp_path / "lib"
    repo.mkdir()
    lib.mkdir()
    (repo / "gh_helpers.py").write_text(textwrap.dedent(HELPER).lstrip("\n"))
    (lib / "far_lib.py").write_text(textwrap.dedent(OUTSIDE).lstrip("\n"))
    (repo / "test_gh.py").write_text(textwrap.dedent(INNER).lstrip("\n"))
    if more:
        (repo / "test_gh_more.py").write_text(textwrap.dedent(MORE).lstrip("\n"))
    (repo / "pytest.ini").write_text("[pytest]\n")
    tag = uuid.uuid4().hex
    base = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_") and k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=repo, env=dict(base, PYTEST_NCCL_TEST_TAG=tag, OUTSIDE_LIB=str(lib), **env),
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert_no_leftovers(tag)
    return SimpleNamespace(out=proc.stdout + proc.stderr, code=proc.returncode, repo=repo)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("annotated")
    summary = tmp / "summary.md"
    summary.write_text("earlier step\n")
    run = inner_session(tmp, more=True, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    run.summary = summary.read_text()
    run.notes = {parse(line)["message"].split("\n")[1]: parse(line) for line in run.out.splitlines()
                 if line.startswith("::")}
    return run


@pytest.mark.parametrize("test, title, file, snippet", [
    ("test_shape", "CollectiveMismatch", "gh_helpers.py", "dist.all_gather("),    # a helper module's line
    ("test_raises", "RankRaised", "test_gh.py", "assert rank == 0"),              # the line that raised
    ("test_hang", "CollectiveTimeout", "test_gh.py", "time.sleep(60)"),          # where the slow rank is
    ("test_outside", "CollectiveMismatch", "test_gh.py", "far_lib.reduce_on_rank_0"),  # outside: the test's line
    ("test_launched", "CollectiveMismatch", "gh_helpers.py", "dist.all_gather("),
    ("TestAdopted::test_adopted", "RankRaised", "test_gh_more.py", "assert self.rank == 0"),
])
def test_one_annotation_at_the_call_site(annotated, test, title, file, snippet):
    module = "test_gh_more.py" if test in ("test_launched", "TestAdopted::test_adopted") else "test_gh.py"
    note = annotated.notes[f"{module}::{test}"]
    source = {"gh_helpers.py": HELPER, "test_gh.py": INNER, "test_gh_more.py": MORE}[file]
    assert (note["file"], note["line"], note["title"]) == (file, str(line_of(source, snippet)), title), annotated.out
    headline = note["message"].split("\n")[0]
    assert f"FAILED {module}::{test} - {title}: {headline[:10]}" in annotated.out


def test_one_annotation_per_failed_test_and_none_for_a_pass(annotated):
    assert annotated.code == 1
    assert sorted(annotated.notes) == [f"test_gh.py::test_{n}" for n in ("hang", "outside", "raises", "shape")] + \
        ["test_gh_more.py::TestAdopted::test_adopted", "test_gh_more.py::test_launched"]
    assert "rank 1: 50%, a:b" in annotated.notes["test_gh.py::test_raises"]["message"]


def test_the_job_summary_gets_the_table(annotated):
    text = annotated.summary
    assert text.startswith("earlier step\n### pytest-nccl: 6 distributed tests failed\n"), text
    assert "| test | exception | headline | trace files |" in text
    row = next(line for line in text.splitlines() if "test_raises" in line)
    assert row.startswith("| `test_gh.py::test_raises` | RankRaised | rank 1 raised AssertionError: rank 1: 50%")


def test_every_test_passed_is_one_line(tmp_path):
    summary = tmp_path / "summary.md"
    run = inner_session(tmp_path, "-k", "passes", GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    assert run.code == 0 and "::error" not in run.out
    assert summary.read_text() == "pytest-nccl: no distributed test failed (1 ran)\n"


@pytest.mark.parametrize("args, github", [((), False), (("--nccl-github=off",), True),
                                          (("-o", "nccl_github=off"), True)])
def test_unset_or_off_nothing_changes(tmp_path, args, github):
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)} if github else {}
    run = inner_session(tmp_path, "-k", "raises", *args, **env)
    assert run.code == 1 and "FAILED test_gh.py::test_raises - RankRaised" in run.out
    assert "::" not in run.out.replace("test_gh.py::", "") and not summary.exists()


def test_a_bad_value_is_one_line(tmp_path):
    run = inner_session(tmp_path, "--nccl-github=maybe")
    assert run.code == 4 and "Traceback" not in run.out, run.out
    (line,) = [line for line in run.out.splitlines() if "nccl-github" in line]
    assert line == "ERROR: pytest-nccl: --nccl-github must be one of auto, on, off, got 'maybe'", run.out


def test_under_xdist_the_controller_annotates_each_failure_once(tmp_path):
    """A worker's finding travels on its report; a failed test's report is one pytest-xdist can send."""
    summary = tmp_path / "summary.md"
    run = inner_session(tmp_path, "-n", "2", "-k", "raises or shape or passes", GITHUB_ACTIONS="true",
                        GITHUB_STEP_SUMMARY=str(summary))
    assert run.code == 1 and "INTERNALERROR" not in run.out, run.out
    notes = [parse(line) for line in run.out.splitlines() if line.startswith("::")]
    assert sorted(n["message"].split("\n")[1] for n in notes) == ["test_gh.py::test_raises", "test_gh.py::test_shape"]
    assert summary.read_text().startswith("### pytest-nccl: 2 distributed tests failed\n")


SPMD = """
import pytest, torch
import torch.distributed as dist


@pytest.mark.nccl
def test_raises(rank):
    dist.all_reduce(torch.ones(1))
    assert rank == 0, "rank 1 disagrees"


@pytest.mark.nccl
def test_passes(rank):
    dist.all_reduce(torch.ones(1))
"""


def test_under_a_launcher_rank_0_annotates_and_summarizes_once(tmp_path):
    """SPMD mode: every rank is a pytest session; rank 0 reports for all (the others show nothing)."""
    (tmp_path / "test_spmd_gh.py").write_text(textwrap.dedent(SPMD).lstrip("\n"))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    summary, tag = tmp_path / "summary.md", uuid.uuid4().hex
    env = job_env(tag, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary), GITHUB_WORKSPACE=str(tmp_path))
    proc = subprocess.run(torchrun("-m", "pytest", "-p", "no:cacheprovider", "-q", "test_spmd_gh.py"), cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert_no_leftovers(tag)
    out = proc.stdout + proc.stderr
    (line,) = [line for line in out.splitlines() if line.startswith("::")]
    assert parse(line)["file"] == "test_spmd_gh.py" and parse(line)["line"] == str(line_of(SPMD, "assert rank == 0"))
    assert summary.read_text().count("### pytest-nccl: 1 distributed test failed") == 1, summary.read_text()


# -- the watch --------------------------------------------------------------------------------------

JOB = """
import os
import torch
import torch.distributed as dist
import job_helpers

dist.init_process_group("gloo")
job_helpers.gather_ragged(dist.get_rank())
dist.destroy_process_group()
"""


def test_a_watch_verdict_is_one_annotation_and_a_summary(tmp_path):
    (tmp_path / "job_helpers.py").write_text(textwrap.dedent(HELPER).lstrip("\n"))
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB).lstrip("\n"))
    summary = tmp_path / "summary.md"
    run = run_watch(tmp_path, torchrun(str(tmp_path / "job.py")), "--timeout", "60", pythonpath=[tmp_path],
                    GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary), GITHUB_WORKSPACE=str(tmp_path))
    assert run.code == 3, run.text
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("::")]
    note = parse(line)
    assert (note["file"], note["line"], note["title"]) == \
        ("job_helpers.py", str(line_of(HELPER, "dist.all_gather(")), "CollectiveMismatch"), run.text
    assert note["message"] == run.summary["headline"], run.summary
    text = summary.read_text()
    assert text.startswith("### pytest-nccl watch: CollectiveMismatch\n\n") and "exit status 3" in text
