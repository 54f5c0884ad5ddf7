"""Validation gate: the report a person reads before upgrading (``--nccl-report=report.md``).

Pure functions over plain data; the plugin calls them from its hooks:

- at ``pytest_configure`` / ``pytest_sessionstart``: ``env = collect_environment()`` once
  (torch is imported by then anyway), and the JUnit properties::

      from _pytest.junitxml import xml_key
      xml = config.stash.get(xml_key, None)          # set when --junitxml is given
      if xml is not None:
          for name, value in junit_properties(env, backend, world_size):
              xml.add_global_property(name, value)   # <testsuite><properties> of the XML

- in ``pytest_runtest_logreport(report)`` (and ``pytest_collectreport`` for collection errors),
  one :class:`TestResult` per test: the call report, or the setup/teardown report when that one
  failed or skipped (``result_from_report(report)`` does the mapping; it returns None for reports
  that do not decide the test's outcome). The headline is the failure's ``.diagnosis.headline``
  (the plugin has it when it raised the exception; it also puts it in the user property
  ``nccl_diagnosis``, which ``result_from_report`` reads).
- in ``pytest_sessionfinish``: ``md = render_report(env, results, backend, world_size)``; write it to
  the ``--nccl-report`` file and call ``append_step_summary(md)`` (no-op unless
  ``$GITHUB_STEP_SUMMARY`` is set).

Suites are the first ``depth`` directories of the nodeid (``suites/trl/test_cpo.py::t`` ->
``suites/trl``). A suite FAILs when any test failed or errored, PASSes when at least one test passed
(xfail counts as pass: expected), is SKIPPED when nothing ran.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote

from ..core.states import CaseOutcome, Phase, Word

#: distributions the report names, in this order
PACKAGES = ("trl", "transformers", "accelerate", "datasets", "deepspeed", "megatron-core")
NOT_INSTALLED = "not installed"


class SuiteVerdict(Word):
    """A suite's verdict, and the report's overall one."""
    PASS = "PASS"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"  # nothing ran


ICON = {SuiteVerdict.PASS: "\u2705", SuiteVerdict.FAIL: "\u274c", SuiteVerdict.SKIPPED: "\u26aa"}


@dataclass(frozen=True)
class TestResult:
    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: CaseOutcome
    duration: float = 0.0
    headline: str | None = None
    page: str | None = None  # the failure's swimlane page in --nccl-trace-dir (user property nccl_trace_page)

    def __post_init__(self):
        # an outcome given by its word ("passed") is the member
        object.__setattr__(self, "outcome", CaseOutcome(self.outcome))


@dataclass
class SuiteSummary:
    name: str
    results: list[TestResult]

    def count(self, *outcomes: CaseOutcome) -> int:
        return sum(1 for r in self.results if r.outcome in outcomes)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.outcome.failed)

    @property
    def ran_clean(self) -> int:
        """Tests that passed, an expected failure included."""
        return sum(1 for r in self.results if r.outcome.ran_clean)

    @property
    def verdict(self) -> SuiteVerdict:
        if self.failed:
            return SuiteVerdict.FAIL
        if self.ran_clean:
            return SuiteVerdict.PASS
        return SuiteVerdict.SKIPPED

    @property
    def duration(self) -> float:
        return sum(r.duration for r in self.results)


# --------------------------------------------------------------------------- environment


def dist_version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return NOT_INSTALLED


def collect_environment(torch_module: Any = None, packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Versions a person checks before upgrading, as ``{name: text}`` (ordered).

    ``torch_module``: the imported torch (default: import it if installed). Keys: python, platform,
    torch, cuda, nccl, then ``packages``, then pytest-nccl."""
    env: dict[str, str] = {"python": platform.python_version(), "platform": f"{sys.platform} {platform.machine()}"}
    torch = torch_module
    if torch is None:
        try:
            import torch  # noqa: F811
        except Exception:  # a broken torch install raises anything at import: not shown
            torch = None
    if torch is None:
        env.update(torch=NOT_INSTALLED, cuda="n/a", nccl="n/a")
    else:
        env["torch"] = str(getattr(torch, "__version__", "?"))
        cuda_built = getattr(getattr(torch, "version", None), "cuda", None)
        available = False
        try:
            available = bool(torch.cuda.is_available())
        except Exception:  # CUDA's driver errors differ by torch version: not available
            pass
        if available:
            try:
                n = torch.cuda.device_count()
                name = torch.cuda.get_device_name(0)
                env["cuda"] = f"{cuda_built} ({n} x {name})"
            except Exception:  # CUDA's driver errors differ by torch version: the build only
                env["cuda"] = str(cuda_built)
            env["nccl"] = nccl_version(torch)
        else:
            env["cuda"] = f"not available (torch built with CUDA {cuda_built})" if cuda_built else "not available"
            env["nccl"] = "gloo (no CUDA)"
    for name in packages:
        env[name] = dist_version(name)
    env["pytest-nccl"] = dist_version("pytest-nccl")
    return env


def nccl_version(torch: Any) -> str:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # no NCCL in this build, whatever it raises
        return "unknown"
    if isinstance(v, tuple):
        return ".".join(map(str, v))
    if isinstance(v, int):  # old torch: 21803 -> 2.18.3
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return str(v)


# --------------------------------------------------------------------------- results


def suite_of(nodeid: str, depth: int = 2) -> str:
    """``suites/trl/test_cpo.py::test_x[a]`` -> ``suites/trl`` (the first ``depth`` directories)."""
    path = nodeid.split("::", 1)[0].replace("\\", "/")
    parts = [p for p in path.split("/") if p]
    dirs = parts[:-1] if parts and (parts[-1].endswith(".py") or "::" in nodeid) else parts
    if not dirs:
        return path or nodeid
    return "/".join(dirs[:depth])


def group_suites(results: Iterable[TestResult], depth: int = 2) -> list[SuiteSummary]:
    suites: dict[str, SuiteSummary] = {}
    for r in results:
        name = suite_of(r.nodeid, depth)
        suites.setdefault(name, SuiteSummary(name, [])).results.append(r)
    return [suites[k] for k in sorted(suites)]


def result_from_report(report: Any) -> TestResult | None:
    """Map a pytest TestReport/CollectReport to a :class:`TestResult`, or None when this report
    does not decide the outcome (a passing setup or teardown)."""
    when = getattr(report, "when", None)
    nodeid = getattr(report, "nodeid", "")
    props = dict(getattr(report, "user_properties", None) or [])
    headline = props.get("nccl_diagnosis")
    page = props.get("nccl_trace_page")
    wasxfail = hasattr(report, "wasxfail")
    if when is None:  # CollectReport
        if not getattr(report, "failed", False):
            return None
        return TestResult(nodeid, CaseOutcome.ERROR, 0.0, headline or _crash(report))
    phase = Phase(when)
    duration = float(getattr(report, "duration", 0.0) or 0.0)
    if report.failed:
        outcome = CaseOutcome.FAILED if phase is Phase.CALL else CaseOutcome.ERROR
        return TestResult(nodeid, outcome, duration, headline or _crash(report), page)
    if report.skipped:
        return TestResult(nodeid, CaseOutcome.XFAILED if wasxfail else CaseOutcome.SKIPPED, duration, None)
    if phase is Phase.CALL:
        return TestResult(nodeid, CaseOutcome.XPASSED if wasxfail else CaseOutcome.PASSED, duration, None)
    return None


def _crash(report: Any) -> str | None:
    from ..exitcodes import crash_line

    line = crash_line(getattr(report, "longrepr", None))
    return line or None


# --------------------------------------------------------------------------- rendering


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    text = " ".join(str(text).split())
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fmt_duration(s: float) -> str:
    return f"{s:.1f}s" if s < 90 else f"{int(s // 60)}m{int(s % 60):02d}s"


def page_link(page: str, report_path: str | None = None) -> str:
    """Where a failure's page is, seen from the report: relative to the report's folder (to the
    current directory without one), as a markdown link target."""
    base = os.path.dirname(os.path.abspath(report_path)) if report_path else os.getcwd()
    try:
        target = os.path.relpath(page, base)
    except ValueError:  # another drive
        target = page
    return quote(target.replace(os.sep, "/"))


def _links(page: str, report_path: str | None) -> str:
    html = page_link(page, report_path)
    trace = html[: -len(".html")] + ".trace.json" if html.endswith(".html") else None
    text = f"[swimlane]({html})"
    return text + (f" \u00b7 [Perfetto trace]({trace})" if trace else "")


def render_report(env: Mapping[str, str], results: Sequence[TestResult], backend: str, world_size: int, *,
                  title: str = "pytest-nccl validation report", depth: int = 2,
                  generated: _dt.datetime | None = None, command: str | None = None,
                  report_path: str | None = None) -> str:
    """The markdown report: overall verdict, environment, backend/world, a verdict per suite, and
    each failure with its diagnosis headline, linked to its swimlane page and Perfetto trace when
    --nccl-trace-dir wrote them (``report_path``: where the report goes, for relative links)."""
    suites = group_suites(results, depth)
    n_fail = sum(s.failed for s in suites)
    verdicts = {s.verdict for s in suites}
    overall = next((v for v in (SuiteVerdict.FAIL, SuiteVerdict.PASS) if v in verdicts), SuiteVerdict.SKIPPED)
    out: list[str] = [f"# {title}", ""]
    summary = (f"**{ICON[overall]} {overall}**: {len(suites)} suite{'s' if len(suites) != 1 else ''}, "
               f"{len(results)} test{'s' if len(results) != 1 else ''}, {n_fail} failed "
               f"\u2014 backend **{backend}**, world size **{world_size}**")
    out += [summary, ""]
    if generated or command:
        meta = []
        if generated:
            meta.append(f"generated {generated.astimezone(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
        if command:
            meta.append(f"command {_code(command)}")
        out += ["_" + ", ".join(meta) + "_", ""]

    out += ["## Environment", "", "| component | version |", "| --- | --- |"]
    for k, v in env.items():
        out.append(f"| {_md_cell(k)} | {_md_cell(v)} |")
    out.append(f"| backend | {_md_cell(backend)} |")
    out.append(f"| world size | {world_size} |")
    out.append("")

    out += ["## Suites", "", "| suite | verdict | passed | failed | skipped | time |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    if not suites:
        out.append("| (no tests) | SKIPPED | 0 | 0 | 0 | 0.0s |")
    for s in suites:
        out.append(f"| {_md_cell(s.name)} | {ICON[s.verdict]} {s.verdict} | {s.ran_clean} "
                   f"| {s.failed} | {s.count(CaseOutcome.SKIPPED)} | {_fmt_duration(s.duration)} |")
    out.append("")

    failures = [r for r in results if r.outcome.failed]
    if failures:
        out += ["## Failures", ""]
        for s in suites:
            fs = [r for r in s.results if r.outcome.failed]
            if not fs:
                continue
            out.append(f"### {s.name}")
            out.append("")
            for r in fs:
                out.append(f"- {_code(r.nodeid)} ({r.outcome}, {_fmt_duration(r.duration)})  ")
                headline = _code(r.headline) if r.headline else "_no diagnosis headline_"
                if r.page:
                    out.append(f"  {headline}  ")
                    out.append(f"  {_links(r.page, report_path)}")
                else:
                    out.append(f"  {headline}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def append_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Append the report to ``$GITHUB_STEP_SUMMARY`` when set; returns the path written or None."""
    environ = os.environ if environ is None else environ
    path = environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return path


def junit_properties(env: Mapping[str, str], backend: str, world_size: int) -> list[tuple[str, str]]:
    """``(name, value)`` pairs for the JUnit XML's ``<properties>``: every environment entry
    (``python``, ``torch``, ``cuda``, ``nccl``, ``trl``, ...) plus ``nccl_backend`` and ``nccl_world``."""
    props = [(str(k), str(v)) for k, v in env.items()]
    props += [("nccl_backend", str(backend)), ("nccl_world", str(world_size))]
    return props


class ReportRecorder:
    """Keeps the reports that decide outcomes, for the gate report and the exit-code mapping.
    Registered as a plugin object of its own (hooks without a config argument need one)."""

    def __init__(self):
        self.reports: list = []

    def pytest_runtest_logreport(self, report) -> None:
        self.reports.append(report)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.reports.append(report)
