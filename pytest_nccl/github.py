"""GitHub Actions in a pytest session (``--nccl-github``): each failed distributed test (marked,
adopted or launched) as one error annotation at its call site in the checkout, printed after the
tests, and a short table appended to the job summary. The words and the escaping are
``views/github.py``'s; this module only gathers them from pytest's reports.

Controller side. What a worker of pytest-xdist finds travels to the controller on the report
(``nccl_github``, plain JSON values), which prints and writes for the session, once; under a
launcher (SPMD), rank 0 does.
"""

from __future__ import annotations

import os
from typing import Mapping

import pytest

from .adopt.adopter import ADOPTED_KEY
from .core.states import Phase
from .errors import DistributedTestFailure
from .session import OUTCOME_KEY, NcclSession
from .views import gate
from .views import github as words
from .views.report import trace_files

REPORT_ATTRIBUTE = "nccl_github"


def _quiet(config) -> bool:
    """Another process says it: an xdist worker (its controller), a rank other than 0 under a
    launcher (rank 0 reports for every rank; ``spmd.quiet`` blocks that rank's terminal reporter)."""
    return hasattr(config, "workerinput") or config.pluginmanager.is_blocked("terminalreporter")


class GithubReporter:
    """Registered as a plugin object when annotations or the summary are wanted; else never."""

    def __init__(self, session: NcclSession, annotate: bool, summary_path: str | None, root: str):
        self.session, self.annotate, self.summary_path, self.root = session, annotate, summary_path, root
        self.failures: dict[str, dict] = {}     # nodeid -> what the report carried; one per test
        self.distributed: set[str] = set()
        self.others_failed: set[str] = set()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        if Phase(call.when) is not Phase.CALL:
            return rep
        adopted = item.stash.get(ADOPTED_KEY, None)
        exc = call.excinfo.value if call.excinfo is not None else None
        if isinstance(exc, DistributedTestFailure) and rep.failed and not getattr(rep, "wasxfail", None):
            setattr(rep, REPORT_ATTRIBUTE, self._failure(item, call, exc))
        elif item.get_closest_marker("nccl") is not None or (adopted is not None and adopted.adopted):
            setattr(rep, REPORT_ATTRIBUTE, {})
        return rep

    def _failure(self, item, call, exc: DistributedTestFailure) -> dict:
        outcome = item.stash.get(OUTCOME_KEY, None)
        headline = str(exc).split("\n", 1)[0]
        note = words.annotation(type(exc).__name__, headline, outcome.result if outcome is not None else None,
                                self.root, (str(item.path), (item.location[1] or 0) + 1), about=item.nodeid)
        directory = self.session.settings.trace_dir
        files = [path for path, _ in trace_files(directory, item.nodeid, getattr(call, "start", None))] \
            if directory else []
        return {"title": note.title, "message": note.message, "file": note.file, "line": note.line,
                "headline": headline, "files": files}

    def pytest_runtest_logreport(self, report) -> None:
        found = getattr(report, REPORT_ATTRIBUTE, None)
        if found is not None:
            self.distributed.add(report.nodeid)
            if found and report.nodeid not in self.failures:
                self.failures[report.nodeid] = found
        elif report.failed:
            self.others_failed.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter, config) -> None:
        if not self.annotate or _quiet(config) or not self.failures:
            return
        notes = [words.Annotation(f["title"], f["message"], f["file"], f["line"]) for f in self.failures.values()]
        for line in words.capped(notes):
            terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session) -> None:
        """Before the plugin's own (trylast), which appends the gate report under this table."""
        if self.summary_path is None or _quiet(session.config) or not self.distributed:
            return
        rows = [words.Row(nodeid, f["title"], f["headline"], tuple(map(_shown, f["files"])))
                for nodeid, f in self.failures.items()]
        others = len(self.others_failed - set(self.failures))
        gate.append_step_summary(words.summary(rows, len(self.distributed), others),
                                 {"GITHUB_STEP_SUMMARY": self.summary_path})


def _shown(path: str) -> str:
    """A trace file as the summary names it: relative to the current directory when under it."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


def install(config: pytest.Config, session: NcclSession, environ: Mapping[str, str] | None = None) -> None:
    """Register the reporter when the session's setting and the environment want it."""
    environ = os.environ if environ is None else environ
    annotate, summary_path = words.wanted(session.settings.github, environ)
    if annotate or summary_path:
        root = words.checkout_root(environ, str(config.rootpath))
        config.pluginmanager.register(GithubReporter(session, annotate, summary_path, root), "nccl-github")
