"""The validation gate's pure functions: environment, suites, markdown, step summary, JUnit props."""

from types import SimpleNamespace

from pytest_nccl.core.states import CaseOutcome
from pytest_nccl.views import gate
from pytest_nccl.views.gate import SuiteVerdict, TestResult

HEADLINE = "shape mismatch in all_gather #3 of group default: rank 0 [2, 7, 32], rank 1 [2, 5, 32]"
ENV = {"python": "3.11.7", "platform": "linux x86_64", "torch": "2.13.0+cpu", "cuda": "not available",
       "nccl": "gloo (no CUDA)", "trl": "0.14.0", "transformers": "4.48.1", "accelerate": "1.3.0",
       "datasets": "3.2.0", "deepspeed": "not installed", "pytest-nccl": "0.1.0"}
RESULTS = [
    TestResult("suites/trl/test_cpo.py::test_cpo_train[2]", "failed", 12.5, HEADLINE),
    TestResult("suites/trl/test_sft.py::test_sft_train", "passed", 20.0),
    TestResult("suites/trl/test_sft.py::test_gpu_only", "skipped", 0.0),
    TestResult("suites/zero/test_zero3.py::test_gather", "passed", 5.0),
    TestResult("suites/zero/test_zero3.py::test_known_bug", "xfailed", 1.0),
    TestResult("suites/gpu/test_nccl.py::test_x", "skipped", 0.0),
    TestResult("tests/test_top.py::test_y", "error", 0.1, None),
]


def test_suite_of():
    assert gate.suite_of("suites/trl/test_cpo.py::test_x[a/b]") == "suites/trl"
    assert gate.suite_of("suites/trl/sub/test_cpo.py::T::test_x") == "suites/trl"
    assert gate.suite_of("suites/trl/sub/test_cpo.py::t", depth=3) == "suites/trl/sub"
    assert gate.suite_of("tests/test_top.py::t") == "tests"
    assert gate.suite_of("test_top.py::t") == "test_top.py"
    assert gate.suite_of("suites/trl") == "suites/trl"  # a collection error on a directory


def test_suite_verdicts():
    suites = {s.name: s for s in gate.group_suites(RESULTS)}
    assert list(suites) == ["suites/gpu", "suites/trl", "suites/zero", "tests"]
    assert suites["suites/trl"].verdict is SuiteVerdict.FAIL
    assert suites["suites/zero"].verdict is SuiteVerdict.PASS  # xfail is expected
    assert suites["suites/gpu"].verdict is SuiteVerdict.SKIPPED
    assert suites["tests"].verdict is SuiteVerdict.FAIL  # an error fails the suite
    assert suites["suites/trl"].duration == 32.5


def test_render_report():
    md = gate.render_report(ENV, RESULTS, "gloo", 4, command="pytest --nccl-world=4 suites/")
    assert md.startswith("# pytest-nccl validation report\n")
    assert "**\u274c FAIL**: 4 suites, 7 tests, 2 failed \u2014 backend **gloo**, world size **4**" in md
    for row in ("| torch | 2.13.0+cpu |", "| nccl | gloo (no CUDA) |", "| trl | 0.14.0 |",
                "| deepspeed | not installed |", "| backend | gloo |", "| world size | 4 |"):
        assert row in md
    assert "| suites/trl | \u274c FAIL | 1 | 1 | 1 | 32.5s |" in md
    assert "| suites/zero | \u2705 PASS | 2 | 0 | 0 | 6.0s |" in md
    assert "| suites/gpu | \u26aa SKIPPED | 0 | 0 | 1 | 0.0s |" in md
    assert "### suites/trl" in md
    assert f"- `suites/trl/test_cpo.py::test_cpo_train[2]` (failed, 12.5s)  \n  `{HEADLINE}`" in md
    assert "(error, 0.1s)  \n  _no diagnosis headline_" in md
    assert "`pytest --nccl-world=4 suites/`" in md


def test_render_all_pass_and_empty():
    md = gate.render_report(ENV, [TestResult("suites/trl/test_a.py::t", "passed", 1.0)], "nccl", 8)
    assert "**\u2705 PASS**: 1 suite, 1 test, 0 failed" in md and "## Failures" not in md
    md = gate.render_report(ENV, [], "gloo", 2)
    assert "SKIPPED" in md and "(no tests)" in md


def test_markdown_escaping():
    r = [TestResult("suites/x/test_a.py::t[a|b]", "failed", 1.0, "rank 0 `x` | rank 1")]
    md = gate.render_report({"torch": "2|3"}, r, "gloo", 2)
    assert "| torch | 2\\|3 |" in md
    assert "``rank 0 `x` | rank 1``" in md


def test_append_step_summary(tmp_path):
    assert gate.append_step_summary("# r\n", environ={}) is None
    path = tmp_path / "summary.md"
    path.write_text("earlier step\n")
    assert gate.append_step_summary("# report", environ={"GITHUB_STEP_SUMMARY": str(path)}) == str(path)
    assert path.read_text() == "earlier step\n# report\n"


def test_junit_properties():
    props = gate.junit_properties(ENV, "gloo", 4)
    assert ("torch", "2.13.0+cpu") in props and ("trl", "0.14.0") in props
    assert props[-2:] == [("nccl_backend", "gloo"), ("nccl_world", "4")]
    assert all(isinstance(v, str) for _, v in props)


class FakeCuda:
    def __init__(self, available, nccl=(2, 21, 5)):
        self.available = available
        self.nccl = SimpleNamespace(version=lambda: nccl)

    def is_available(self):
        return self.available

    def device_count(self):
        return 8

    def get_device_name(self, i):
        return "NVIDIA H100 80GB HBM3"


def test_collect_environment_cpu_and_cuda():
    cpu = SimpleNamespace(__version__="2.13.0+cpu", version=SimpleNamespace(cuda=None), cuda=FakeCuda(False))
    env = gate.collect_environment(cpu, packages=("trl", "surely-not-installed-pkg"))
    assert env["torch"] == "2.13.0+cpu" and env["nccl"] == "gloo (no CUDA)" and env["cuda"] == "not available"
    assert env["surely-not-installed-pkg"] == "not installed"
    assert list(env)[:5] == ["python", "platform", "torch", "cuda", "nccl"]
    gpu = SimpleNamespace(__version__="2.13.0+cu128", version=SimpleNamespace(cuda="12.8"), cuda=FakeCuda(True))
    env = gate.collect_environment(gpu, packages=())
    assert env["cuda"] == "12.8 (8 x NVIDIA H100 80GB HBM3)" and env["nccl"] == "2.21.5"
    old = SimpleNamespace(cuda=SimpleNamespace(nccl=SimpleNamespace(version=lambda: 21803)))
    assert gate.nccl_version(old) == "2.18.3"


def test_collect_environment_default_has_every_package():
    env = gate.collect_environment(SimpleNamespace(__version__="x", version=SimpleNamespace(cuda=None),
                                                   cuda=FakeCuda(False)))
    for k in ("trl", "transformers", "accelerate", "datasets", "deepspeed", "pytest-nccl"):
        assert k in env


def _rep(when, outcome, **kw):
    return SimpleNamespace(nodeid="suites/trl/test_a.py::t", when=when, failed=outcome == "failed",
                           skipped=outcome == "skipped", passed=outcome == "passed", duration=1.5,
                           user_properties=kw.pop("props", []), longrepr=kw.pop("longrepr", None), **kw)


def test_result_from_report():
    crash = SimpleNamespace(reprcrash=SimpleNamespace(message="pytest_nccl.errors.CollectiveTimeout: stuck"))
    assert gate.result_from_report(_rep("setup", "passed")) is None
    assert gate.result_from_report(_rep("call", "passed")) == TestResult("suites/trl/test_a.py::t", "passed", 1.5)
    r = gate.result_from_report(_rep("call", "failed", props=[("nccl_diagnosis", HEADLINE)], longrepr=crash))
    assert r.outcome is CaseOutcome.FAILED and r.headline == HEADLINE
    r = gate.result_from_report(_rep("call", "failed", longrepr=crash))
    assert r.headline == "pytest_nccl.errors.CollectiveTimeout: stuck"
    assert gate.result_from_report(_rep("setup", "failed", longrepr=crash)).outcome is CaseOutcome.ERROR
    assert gate.result_from_report(_rep("setup", "skipped")).outcome is CaseOutcome.SKIPPED
    assert gate.result_from_report(_rep("call", "skipped", wasxfail="")).outcome is CaseOutcome.XFAILED
    assert gate.result_from_report(_rep("call", "passed", wasxfail="")).outcome is CaseOutcome.XPASSED
    coll = SimpleNamespace(nodeid="suites/trl/test_b.py", failed=True, longrepr="E   ImportError: x")
    assert gate.result_from_report(coll) == TestResult("suites/trl/test_b.py", "error", 0.0, "ImportError: x")
    assert gate.result_from_report(SimpleNamespace(nodeid="d", failed=False)) is None
