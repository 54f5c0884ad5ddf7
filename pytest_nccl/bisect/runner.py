"""Run a pytest selection inside a probed env and turn the outcome into a verdict.

``run_pytest`` is the I/O; ``parse_junit`` and ``verdict_from_run`` are pure.

The command is ``ENV/bin/python -m pytest ARGS -p no:cacheprovider --junitxml=FILE``,
run in the caller's working directory (so relative paths and the project's ini apply), with
``PYTHONPATH`` holding only a shim directory that links this checkout's ``pytest_nccl`` package
and a minimal dist-info carrying the plugin's ``pytest11`` entry point (the env does not install
the plugin: it runs the code being developed, loaded the way an installed plugin is). Verdicts:

========================  =========================================================
pytest exit status        verdict
========================  =========================================================
0                         good, unless every test skipped: skip
1                         bad, unless every failure is infrastructure
                          (import error, ranks could not start): skip
125                       skip (the plugin's ``--nccl-exitcode-infra``)
2 / 3 / 4 / 5             skip (collection error / internal error / usage error /
                          no tests collected); the reason is shown
timeout                   skip
========================  =========================================================

The headline of a failing run is the first failing testcase's ``nccl_diagnosis`` property (put
there by the plugin), else the first line of its failure message.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .. import exitcodes
from ..core.states import CaseOutcome, Phase
from . import tomlcompat
from .search import Verdict

HEADLINE_PROPERTY = "nccl_diagnosis"


@dataclass
class CaseResult:
    nodeid: str
    outcome: CaseOutcome  # from JUnit: never xpassed (JUnit writes an xpass as a pass, a strict one as a failure)
    message: str = ""
    text: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    when: Phase = Phase.CALL

    def __post_init__(self):
        # an outcome or a phase given by its word ("passed", "setup") is the member
        self.outcome, self.when = CaseOutcome(self.outcome), Phase(self.when)

    @property
    def headline(self) -> str:
        h = self.properties.get(HEADLINE_PROPERTY)
        if h:
            return h.strip().splitlines()[0]
        return first_line(self.message) or crash_from_text(self.text)

    def as_failure(self) -> exitcodes.Failure:
        infra = self.properties.get("nccl_infra")
        crash = self.message if self.message and self.message != "collection failure" else crash_from_text(self.text)
        return exitcodes.Failure(
            nodeid=self.nodeid, when=self.when, crash=first_line(crash),
            infra=None if infra is None else infra.strip().lower() in ("1", "true", "yes"),
            kind=self.properties.get("nccl_diagnosis_kind"),
        )


_DOTTED_EXC = re.compile(r"^(?:[A-Za-z_][\w]*\.)+([A-Z]\w*(?:Error|Exception|Failure|Timeout|Mismatch|Raised|Died)\b)")


def first_line(text: str | None) -> str:
    for ln in (text or "").splitlines():
        if ln.strip():
            # "pytest_nccl.errors.CollectiveMismatch: ..." -> "CollectiveMismatch: ..."
            return _DOTTED_EXC.sub(r"\1", ln.strip())
    return ""


def crash_from_text(text: str | None) -> str:
    e_lines = [ln[1:].strip() for ln in (text or "").splitlines() if ln.startswith("E ")]
    if e_lines:
        return first_line(e_lines[0])
    return first_line((text or "").strip().splitlines()[-1] if (text or "").strip() else "")


# a testcase's child element -> its outcome, in the order they are looked for
_JUNIT_TAGS = {"failure": CaseOutcome.FAILED, "error": CaseOutcome.ERROR, "skipped": CaseOutcome.SKIPPED}


def parse_junit(text: str) -> list[CaseResult]:
    """Testcases of a pytest JUnit XML (xunit1 or xunit2), in document order."""
    root = ET.fromstring(text)
    out: list[CaseResult] = []
    for case in root.iter("testcase"):
        classname = case.get("classname") or ""
        name = case.get("name") or ""
        nodeid = f"{classname}::{name}" if classname else name
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        outcome, message, body, when = CaseOutcome.PASSED, "", "", Phase.CALL
        for tag, tag_outcome in _JUNIT_TAGS.items():
            el = case.find(tag)
            if el is not None:
                outcome = tag_outcome
                if tag_outcome is CaseOutcome.SKIPPED and el.get("type") == "pytest.xfail":
                    outcome = CaseOutcome.XFAILED
                message = el.get("message") or ""
                body = el.text or ""
                if tag_outcome is CaseOutcome.ERROR:
                    if message == "collection failure":
                        when = Phase.COLLECT
                    elif message.startswith("failed on setup"):
                        when = Phase.SETUP
                    elif message.startswith("failed on teardown"):
                        when = Phase.TEARDOWN
                break
        out.append(CaseResult(nodeid, outcome, message, body, props, when))
    return out


def verdict_from_run(exit_code: int | None, cases: Sequence[CaseResult], *, timed_out: bool = False,
                     timeout: float | None = None, output_tail: str = "") -> tuple[Verdict, str | None]:
    """(verdict, headline-or-reason) from pytest's exit status and its JUnit testcases."""
    failed = [c for c in cases if c.outcome.failed]
    if timed_out:
        return Verdict.SKIP, f"pytest did not finish within {timeout:.0f}s" if timeout else "pytest timed out"
    if exit_code == exitcodes.EXIT_OK:
        if cases and all(c.outcome is CaseOutcome.SKIPPED for c in cases):
            # nothing ran: a release where the code under test is gone (verl 0.8.0 removed the actor
            # suites/verl drives) is no fix, and one that cannot run the tests is no good bound
            return Verdict.SKIP, "every test skipped: " + (cases[0].headline or "no reason given")
        return Verdict.GOOD, None
    if exit_code == exitcodes.EXIT_TESTS_FAILED:
        real = [c for c in failed if not exitcodes.is_infrastructure(c.as_failure())]
        if real:
            return Verdict.BAD, real[0].headline or "test failed"
        if failed:
            return Verdict.SKIP, "could not test: " + (failed[0].as_failure().crash or failed[0].headline)
        return Verdict.BAD, "tests failed (no JUnit detail)"
    if exit_code == exitcodes.EXIT_GIT_BISECT_SKIP:
        why = failed[0].as_failure().crash if failed else ""
        return Verdict.SKIP, "could not test (infrastructure)" + (f": {why}" if why else "")
    if exit_code == exitcodes.EXIT_INTERRUPTED:
        if failed:
            return Verdict.SKIP, "collection error: " + (failed[0].as_failure().crash or failed[0].headline)
        return Verdict.SKIP, "pytest was interrupted" + _tail_hint(output_tail)
    if exit_code == exitcodes.EXIT_NO_TESTS:
        return Verdict.SKIP, "no tests collected"
    if exit_code == exitcodes.EXIT_USAGE_ERROR:
        return Verdict.SKIP, "pytest usage error" + _tail_hint(output_tail)
    if exit_code == exitcodes.EXIT_INTERNAL_ERROR:
        return Verdict.SKIP, "pytest internal error" + _tail_hint(output_tail)
    return Verdict.SKIP, f"pytest exited {exit_code}" + _tail_hint(output_tail)


def _tail_hint(tail: str) -> str:
    lines = [ln.strip() for ln in (tail or "").splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    pick = errs[-1] if errs else (lines[-1] if lines else "")
    return f": {pick[:200]}" if pick else ""


@dataclass
class RunOutcome:
    exit_code: int | None
    seconds: float
    verdict: Verdict
    headline: str | None
    cases: list[CaseResult]
    log: Path | None
    timed_out: bool = False


def plugin_source_dir() -> Path:
    """The directory of this checkout's ``pytest_nccl`` package."""
    return Path(__file__).resolve().parents[1]


def plugin_entry_points(pyproject: Path | None = None) -> tuple[str, dict[str, str]]:
    """(version, {name: module}) of pytest-nccl's ``pytest11`` entry points.

    From this checkout's pyproject.toml when there is one (the code being run), else the installed
    distribution, else ``nccl = pytest_nccl.plugin``."""
    pyproject = pyproject or plugin_source_dir().parent / "pyproject.toml"
    try:
        doc = tomlcompat.loads(pyproject.read_text())
        project = doc.get("project", {})
        eps = dict(project.get("entry-points", {}).get("pytest11", {}))
        if eps:
            return str(project.get("version", "0+checkout")), eps
    except Exception:  # missing, not TOML, or another shape: the installed metadata next
        pass
    try:
        import importlib.metadata as md

        dist = md.distribution("pytest-nccl")
        eps = {ep.name: ep.value for ep in dist.entry_points if ep.group == "pytest11"}
        if eps:
            return dist.version, eps
    except Exception:  # a broken install's metadata, whatever it raises: the default
        pass
    return "0+checkout", {"nccl": "pytest_nccl.plugin"}


def make_shim(shim: Path) -> Path:
    """A directory that exposes only this checkout's ``pytest_nccl`` (a symlink) and a minimal
    ``pytest_nccl`` dist-info with its ``pytest11`` entry points: on ``PYTHONPATH`` in a probed env,
    pytest loads the plugin exactly as an installed one (same name, so ``-p no:nccl`` works and an
    ``*.egg-info`` of an editable install in the working directory registers nothing twice)."""
    shim.mkdir(parents=True, exist_ok=True)
    os.symlink(plugin_source_dir(), shim / "pytest_nccl")
    version, eps = plugin_entry_points()
    info = shim / f"pytest_nccl-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pytest-nccl\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    (info / "INSTALLER").write_text("pytest-nccl-bisect\n")
    return shim


def build_command(python: Path, pytest_args: Sequence[str], junit: Path, plugin: str | None = None) -> list[str]:
    cmd = [str(python), "-m", "pytest", *pytest_args, "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if plugin:
        cmd += ["-p", plugin]
    return cmd


def run_pytest(python: Path, pytest_args: Sequence[str], *, log: Path, timeout: float = 1800,
               cwd: str | os.PathLike | None = None, stream: bool = False,
               plugin: str | None = None, shim: bool = True) -> RunOutcome:
    """Run pytest in the env; never raises for test outcomes. The plugin comes from the shim's
    entry point; ``plugin`` adds an explicit ``-p MODULE`` (for a plugin outside the shim)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pytest-nccl-run-") as tmp:
        shim_dir = make_shim(Path(tmp) / "shim") if shim else None
        junit = Path(tmp) / "junit.xml"
        env = dict(os.environ)
        for k in ("VIRTUAL_ENV", "PYTHONHOME", "CONDA_PREFIX"):
            env.pop(k, None)
        if shim_dir is not None:
            env["PYTHONPATH"] = str(shim_dir)
        else:
            env.pop("PYTHONPATH", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = build_command(python, pytest_args, junit, plugin)
        t0 = time.monotonic()
        timed_out = False
        rc: int | None
        with open(log, "w") as fh:
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    cwd=cwd, env=env, start_new_session=True)
            assert proc.stdout is not None
            fired = threading.Event()

            def _expire() -> None:
                fired.set()
                _kill_group(proc, wait=False)

            timer = threading.Timer(timeout, _expire)
            timer.daemon = True
            timer.start()
            try:
                for line in proc.stdout:
                    fh.write(line)
                    if stream:
                        sys.stderr.write("    | " + line)
                rc = proc.wait()
            except BaseException:
                _kill_group(proc)
                raise
            finally:
                timer.cancel()
            if fired.is_set():
                timed_out, rc = True, None
            fh.write(f"\n[exit {rc}]\n")
        seconds = time.monotonic() - t0
        cases: list[CaseResult] = []
        if junit.exists():
            try:
                cases = parse_junit(junit.read_text())
            except ET.ParseError:
                cases = []
    tail = _read_tail(log)
    verdict, headline = verdict_from_run(rc, cases, timed_out=timed_out, timeout=timeout, output_tail=tail)
    return RunOutcome(rc, seconds, verdict, headline, cases, log, timed_out)


def _kill_group(proc: subprocess.Popen, wait: bool = True) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if wait:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _read_tail(path: Path, n: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
