"""Rank 0's verdict applied on this rank: the same outcome everywhere (pass, skip, xfail, or the one
exception of the verdict), rank 0 with the combined report, the others quietly."""

from __future__ import annotations

import pytest

from ..core.diagnosis import Diagnosis
from ..core.messages import Verdict
from ..core.states import Kind, RankState
from ..session import exception_class, item_outcome, record_failure
from ..views.report import NcclLongRepr


def _record(sp, item, run, decided: Verdict) -> None:
    """Rank 0: headline for the JUnit XML, the gate report and --nccl-trace-dir."""
    record_failure(item, sp.nccl, run.result.diagnosis, decided.exception, result=run.result, on_error=sp.say)


def _has_report(sp, run) -> bool:
    return sp.rank == 0 and run is not None and run.result is not None and run.result.diagnosis is not None


def apply_verdict(sp, item, run, decided: Verdict, raise_failure) -> bool:
    """Pass, skip, xfail or raise the verdict's exception for a body that ran on this rank.
    ``raise_failure``: this rank's own exception, re-raised when it already is the verdict (a skip,
    an xfail)."""
    __tracebackhide__ = True
    if run.result is not None:
        item_outcome(item).result = run.result
    if decided.stop:  # set whatever the outcome: an interrupted test that passed stops the session too
        item.session.shouldstop = decided.stop
    if decided.status == RankState.PASSED:
        return True
    if decided.status == RankState.SKIPPED:
        if raise_failure is not None and type(raise_failure).__name__ == "Skipped":
            raise raise_failure
        raise pytest.skip.Exception(decided.message or "skipped on every rank", _use_item_location=True)
    if decided.status == RankState.XFAILED:
        if raise_failure is not None and type(raise_failure).__name__ == "XFailed":
            raise raise_failure
        pytest.xfail(decided.message or "xfail on every rank")
    exc_class = exception_class(decided.exception)
    if _has_report(sp, run):
        _record(sp, item, run, decided)
        raise exc_class(run.result.diagnosis.headline, run.result.diagnosis, run.report)
    diag = Diagnosis(decided.kind or Kind.SETUP, decided.headline)
    if sp.rank == 0:
        record_failure(item, sp.nccl, diag, exc_class.__name__)
    raise exc_class(decided.headline, diag, "")


def setup_failure_report(sp, item, rep, run, decided: Verdict) -> None:
    """The report of a rank that did not run the body, from the verdict: rank 0's carries the
    combined report, the others' stays quiet."""
    if decided.stop:
        item.session.shouldstop = decided.stop
    if not decided.failed:
        return
    rep.outcome = "failed"
    if not _has_report(sp, run):
        said = decided.headline  # a harness verdict says "pytest-nccl:" itself; rank 0 says it once
        rep.longrepr = said if sp.rank != 0 or said.startswith("pytest-nccl:") else f"pytest-nccl: {said}"
        return
    result, diag = run.result, run.result.diagnosis
    before = len(item.user_properties)
    _record(sp, item, run, decided)
    rep.user_properties.extend(item.user_properties[before:])
    rep.longrepr = NcclLongRepr(diag.headline, run.report, str(item.path), (item.location[1] or 0) + 1)
    for view in result.ranks:
        if view.output.strip():
            rep.sections.append((f"Captured output rank {view.rank}", view.output))
