"""Exit codes for ``git bisect run`` (and for the release bisect's verdicts).

``git bisect run CMD`` reads CMD's exit status: 0 = good, 125 = cannot test (skip), any other value
in 1..127 = bad, anything else aborts the bisect. pytest's own statuses therefore already work for
the common case: a hang (``CollectiveTimeout``) or a desync (``CollectiveMismatch``) fails the test,
so pytest exits 1 = bad. What does *not* work out of the box is a commit that cannot be tested at
all: the library does not import, the ranks cannot start, or no test was collected. pytest exits
1, 2, 3 or 5 for those, which ``git bisect`` takes as "bad" and so blames the wrong commit.

Behind the plugin's flag ``--nccl-exitcode-infra`` (``plugin.pytest_sessionfinish``) they map to
125: the plugin records every failed report and calls :func:`map_exitstatus` at the end.

Rules of :func:`map_exitstatus` (``infra_code`` None = option off = status unchanged):

==========================  ======================================================
pytest status               result
==========================  ======================================================
0 passed                    0
1 tests failed              ``infra_code`` if every failure is infrastructure, else 1
2 interrupted               ``infra_code`` if there were failures (collection errors)
                            and all are infrastructure; else 2 (Ctrl-C stays 2)
3 internal error            ``infra_code``
4 usage error               ``infra_code`` (a node id not found, a bad setting: may
                            depend on the commit)
5 no tests collected        ``infra_code`` (the test does not exist at this commit)
==========================  ======================================================

A failure is infrastructure when the plugin marked it so (user property ``nccl_infra`` true, or a
diagnosis kind of ``infra``/``setup``), when it is a collection error, when its exception is
``RankSetupError`` (the group could not start / the test could not be loaded in a rank), or when
the crash is an ``ImportError``/``ModuleNotFoundError``. A hang, a desync, a dead rank or an
assertion in a rank is never infrastructure: those are the regressions being hunted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from .core.states import Phase

EXIT_OK = 0
EXIT_TESTS_FAILED = 1
EXIT_INTERRUPTED = 2
EXIT_INTERNAL_ERROR = 3
EXIT_USAGE_ERROR = 4
EXIT_NO_TESTS = 5
#: ``git bisect run``'s "cannot test this commit"
EXIT_GIT_BISECT_SKIP = 125

INFRA_KINDS = frozenset({"infra", "infrastructure", "setup", "startup"})
# exception names that mean "could not test", wherever they appear in the crash line
_INFRA_EXC = re.compile(r"\b(RankSetupError|ModuleNotFoundError|ImportError)\b")
# exception names that mean "this is the bug": they win over an ImportError mentioned in the text
_REAL_EXC = re.compile(r"\b(CollectiveTimeout|CollectiveMismatch|RankDied)\b")


@dataclass(frozen=True)
class Failure:
    """A failed report, reduced to what the classification needs."""

    nodeid: str
    when: Phase
    crash: str = ""  # the crash line, e.g. "ModuleNotFoundError: No module named 'trl'"
    infra: bool | None = None  # the plugin's own knowledge, when it has it
    kind: str | None = None  # the diagnosis kind, when there is one

    def __post_init__(self):
        object.__setattr__(self, "when", Phase(self.when))  # a phase given by its word ("call") is the member


def is_infrastructure(f: Failure) -> bool:
    if f.infra is not None:
        return bool(f.infra)
    if f.kind and f.kind.lower() in INFRA_KINDS:
        return True
    if f.when is Phase.COLLECT:
        return True
    if _REAL_EXC.search(f.crash or ""):
        return False
    return bool(_INFRA_EXC.search(f.crash or ""))


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def crash_line(longrepr: Any) -> str:
    """First line of the crash from a pytest ``longrepr`` (any of its shapes)."""
    if longrepr is None:
        return ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message).splitlines()[0] if str(crash.message) else ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # skip tuples (path, lineno, msg)
        return str(longrepr[2])
    text = str(longrepr)
    # the first "E   Exc: msg" line of a text longrepr (collection errors) is the crash
    e_lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    if e_lines:
        return e_lines[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def failure_from_report(report: Any) -> Failure:
    """Duck-typed adapter from a pytest ``TestReport``/``CollectReport``."""
    props = dict(getattr(report, "user_properties", None) or [])
    infra = props.get("nccl_infra")
    when = Phase(getattr(report, "when", None) or Phase.COLLECT)  # CollectReport has no ``when``
    return Failure(
        nodeid=getattr(report, "nodeid", ""),
        when=when,
        crash=crash_line(getattr(report, "longrepr", None)),
        infra=None if infra is None else _truthy(infra),
        kind=props.get("nccl_diagnosis_kind"),
    )


def map_exitstatus(exitstatus: int, failures: Iterable[Failure], infra_code: int | None = EXIT_GIT_BISECT_SKIP) -> int:
    """The exit status to use; see the module docstring for the table."""
    exitstatus = int(exitstatus)
    if infra_code is None or exitstatus == EXIT_OK:
        return exitstatus
    failures = list(failures)
    all_infra = bool(failures) and all(is_infrastructure(f) for f in failures)
    if exitstatus in (EXIT_TESTS_FAILED, EXIT_INTERRUPTED):
        return infra_code if all_infra else exitstatus
    if exitstatus in (EXIT_INTERNAL_ERROR, EXIT_USAGE_ERROR, EXIT_NO_TESTS):
        return infra_code
    return exitstatus


def git_bisect_meaning(code: int) -> str:
    """How ``git bisect run`` reads an exit status."""
    if code == 0:
        return "good"
    if code == EXIT_GIT_BISECT_SKIP:
        return "skip"
    if 1 <= code <= 127:
        return "bad"
    return "abort"
