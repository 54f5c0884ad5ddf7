"""The judge: every transport's one call once the referee stopped watching. From the ranks' reports
(and, only when the call is not clean, their journals) to the views and the diagnosis.

- ``judge``: clean (every rank finished the same clean way and every group's members issued the same
  collectives, by the digests: no journal read for a clean pass, unless transfers must be paired),
  or the diagnosis;
- ``settled``: once decided, whether the ranks still running all wait in a collective (nothing more
  will come), or one may still finish and should get ``Timing.settle`` to do it;
- ``verdict``: the diagnosis of a call that is not clean, never None;
- ``launcher_restarts``: whether a restarting launcher acts on a verdict by itself.

Pure: no torch, no processes; tested on reports and records built by hand.
"""

from __future__ import annotations

from typing import Callable

from .agreement import digest_of, digests_agree, transfers_traced
from .diagnosis import Diagnosis, diagnose
from .diagnosis.pairing import crossed_pairs, pairing_diagnosis
from .diagnosis.wording import TEST, Words, seconds
from .records import CollectiveRecord, RankView
from .reports import CallOutcome, RankReport
from .states import CLEAN_STATES, Kind, Reason

Journals = Callable[[], "dict[int, list[CollectiveRecord]]"]


def is_clean(views: list[RankView], reason: Reason, digests: dict | None) -> bool:
    """Every rank finished the same clean way (passed, skipped or xfailed), and every group's members
    issued the same collectives (``digests``: rank -> {group: Digest}; None: not traced)."""
    states = {v.status for v in views}
    return (reason == Reason.COMPLETED and states <= CLEAN_STATES and len(states) == 1
            and (digests is None or digests_agree(digests, len(views))))


def verdict(views: list[RankView], reason: Reason, bound: float, words: Words = TEST) -> Diagnosis:
    """The diagnosis of a call that is not clean; never None."""
    diag = diagnose(views, reason, bound, words)
    if diag is None and reason == Reason.TIMEOUT and all(v.status in CLEAN_STATES for v in views):
        diag = Diagnosis(Kind.TIMEOUT, f"the test took longer than its {seconds(bound)} s bound: every rank "
                         "finished it, but only after the bound (raise the bound, or make the test shorter)")
    if diag is None:
        diag = Diagnosis(Kind.RAISED, "the ranks disagree on the outcome: "
                         + ", ".join(f"rank {v.rank} {v.status}" for v in views))
    return diag


def settled(journals: dict, live) -> bool:
    """Every rank still running waits in a collective: nothing more will come from them."""
    return all(RankView(r, records=journals.get(r, [])).current is not None for r in live)


def judge(reports: dict[int, RankReport], world: int, reason: Reason, bound: float, journals: Journals,
          elapsed: float = 0.0, trace: bool = True, words: Words = TEST, interrupted: str = "") -> CallOutcome:
    """The views and the verdict of one call. ``reports``: rank -> its report (a rank without one
    never reported: RUNNING); ``journals()``: rank -> its records, asked only when the call is not
    clean or a report carries no digest; ``trace``: the collectives were traced (else digests are
    not compared); ``words``: the headline names a test or a job; ``interrupted``: what ended the
    call first (``Reason.INTERRUPTED``: "SIGINT"), said before the headline."""
    full = {r: reports.get(r) or RankReport(r) for r in range(world)}
    if all(rep.state.finished for rep in full.values()) and (
            reason == Reason.DECIDED
            or (reason == Reason.INTERRUPTED and all(rep.state in CLEAN_STATES for rep in full.values()))):
        # a rule decided (or another hand ended the call) on what it saw then (a rank of another node
        # looked gone, a late report), but by the time the reports were taken every rank had finished:
        # the call completed, and is judged as such (a clean one is clean, not a 'disagreement' among
        # ranks that all passed). Ranks the same Ctrl-C ended (a terminal's reaches the whole process
        # group) stay an interrupted call: their tracebacks say where each was
        reason = Reason.COMPLETED
    views = [full[r].view() for r in range(world)]
    records: dict | None = None
    digests = None
    if trace and reason == Reason.COMPLETED:
        if any(rep.digest is None for rep in full.values()):
            records = journals()
        digests = {r: rep.digest if rep.digest is not None else digest_of(records.get(r, []) if records else [])
                   for r, rep in full.items()}
    result = CallOutcome(views=views, reason=reason, reports=full, elapsed=elapsed, bound=bound,
                         interrupted=interrupted if reason == Reason.INTERRUPTED else "")
    if is_clean(views, reason, digests):
        if not transfers_traced(digests):
            return result
        # transfers pair sends with receives by order: only the journals show a crossed pair
        records = records if records is not None else journals()
        for view in views:
            view.records = records.get(view.rank, [])
        crossed = crossed_pairs({v.rank: v for v in views})
        if crossed:
            result.diagnosis = pairing_diagnosis(crossed, views)
        return result
    if trace:
        records = records if records is not None else journals()
        for view in views:
            view.records = records.get(view.rank, [])
    if reason == Reason.INTERRUPTED:  # where each rank is after ``elapsed`` s, not at a bound
        diag = verdict(views, reason, elapsed, words.interrupted())
        by = f" ({interrupted})" if interrupted else ""
        diag.headline = f"interrupted after {seconds(elapsed)} s{by}: {diag.headline}"
        result.diagnosis = diag
    else:
        result.diagnosis = verdict(views, reason, bound, words)
    return result


def launcher_restarts(diag: Diagnosis) -> bool:
    """A verdict that a launcher which restarts failed workers (torchrun ``--max-restarts``) acts on
    by itself: a rank raised or died, so its process exits and the launcher starts the next attempt.
    A hang or a desync (ranks that wait, disagree, or a rank that exited normally while others wait)
    it never sees: the transport ends the job."""
    return diag.kind in (Kind.RAISED, Kind.DIED)
