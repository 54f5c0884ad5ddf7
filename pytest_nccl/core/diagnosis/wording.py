"""How a headline reads: rank lists ("ranks 0-14,16"), ranks grouped by value, a position ("all_reduce
#3 of group tp[2,3] from x.py:5"), where a rank is instead, and durations for people."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..groups import GroupId, rank_ranges
from ..records import CollectiveRecord, RankView
from ..sites import headline_site, rendezvous_at
from ..states import RankState, RecordState, Source
from .outside import FULL, NO_FUNCTION, elsewhere, place, running_state


def seconds(value: float) -> str:
    """A duration in a headline, rounded for people: 120 -> '120', 2.87518 -> '2.9'."""
    return f"{round(value, 1):g}"


@dataclass(frozen=True)
class Words:
    """What a call is called where a report names it: a test (the pytest modes) or a job (the watch,
    whose bound is ``--timeout``, a stall)."""
    call: str                 # "the test exceeded its 60 s bound"
    left: str                 # a rank that passed, in a headline
    not_started: str          # a rank that never began the call, in a headline
    passed: str               # a rank that passed, where each rank is
    raised: str               # before a failed rank's exception, where each rank is
    timeout: str              # the bound: "{} s bound" or "{} s (--timeout)"
    stalled: str              # waited the whole bound
    # the call outside any collective when it ended: "the test exceeded its {} s bound"
    exceeded: str = "the {call} exceeded its {} s bound"
    unseen: str = "cannot be seen by this watch (on another node)"  # a rank whose records are not known
    outside: str = "is busy outside any collective"  # a running rank in no collective
    since_last: bool = False  # ... followed by the last collective it completed (nothing else says where it is)
    spanned: str = ""  # the report's trace header, where neither a test's nor a job's: "{bound}" in it

    def bound(self, value: float) -> str:
        """'the 60 s bound' / '60 s (--timeout)'."""
        return self.timeout.format(seconds(value))

    def whole(self, value: float) -> str:
        """How long ranks waited when the bound ended the call."""
        return self.stalled.format(seconds(value))

    def over(self, value: float) -> str:
        """'the test exceeded its 60 s bound' / 'the job was' (interrupted): before "outside any collective"."""
        return self.exceeded.format(seconds(value), call=self.call)

    def interrupted(self) -> "Words":
        """The same words for a call another hand ended: the bound is the time it ran, not a limit
        reached ("none completed within 8.2 s", "waited 8.2 s")."""
        return replace(self, timeout="{} s", stalled="{} s", exceeded="the {call} was")

    def span(self, elapsed: float, bound: float) -> str:
        """The report's trace header: how long the call ran, against what."""
        if self.spanned:
            return self.spanned.format(bound=f"{bound:g}")
        if self is JOB:
            return f"{elapsed:.1f} s after init_process_group, --timeout {bound:g} s"
        return f"{elapsed:.2f} s of a {bound:g} s bound"


TEST = Words(call="test", left="left the test (passed)", not_started="never started this test", passed="passed",
             raised="failed: ", timeout="the {} s bound", stalled="for the whole {} s bound")
JOB = Words(call="job", left="exited normally", not_started="never created the default process group",
            passed="exited normally", raised="raised ", timeout="{} s (--timeout)",
            stalled="{} s (--timeout) with no progress")


SHOWN_VALUES = 3   # distinct values a headline lists before "and N more"
HEADLINE_WIDTH = 200  # a headline adds optional detail (a second p2p side, a site) only while shorter
def brief(message: str, limit: int = 100) -> str:
    """An exception line without gloo's source location prefix, cut to ``limit`` characters."""
    if message.count("[") and "] " in message and (".cc:" in message or ".cpp:" in message):
        head, _, rest = message.partition("[")
        message = head + rest.split("] ", 1)[-1]
    return message if len(message) <= limit else message[: limit - 3] + "..."


def rank_list(ranks) -> str:
    """'rank 3', 'ranks 0-14,16'; a list that would not be short: '32 ranks (0,2,...,62)'."""
    ranks = sorted(set(ranks))
    text = rank_ranges(ranks)
    if len(text) > 30:
        return f"{len(ranks)} ranks ({ranks[0]},{ranks[1]},...,{ranks[-1]})"
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def few(ranks) -> str:
    """A rank list for a side note: '62 ranks' when it would not be short."""
    text = rank_list(ranks)
    return text if len(text) <= 24 else f"{len(set(ranks))} ranks"


def grouped(values: dict[int, str], limit: int = SHOWN_VALUES) -> str:
    """'ranks 0-14 SUM, rank 15 MAX': ranks with the same value together, in rank order."""
    by_value: dict[str, list[int]] = {}
    for r, value in sorted(values.items()):
        by_value.setdefault(value, []).append(r)
    parts = [f"{rank_list(rs)} {value}" for value, rs in by_value.items()]
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" and {more} more value{'s' if more > 1 else ''}" if more > 0 else "")


def where(rec: CollectiveRecord, transfer=None) -> str:
    """'all_reduce #3 of group tp[2,3] from x.py:5', 'recv(src=0, tag=2) from x.py:9': a position in a
    headline (a point-to-point record by the ``transfer`` it waits on)."""
    site = headline_site(rec.site)
    if rec.source == Source.FLIGHT_RECORDER:
        origin = " (issued from C++, seen by the Flight Recorder)"
    else:
        origin = f" from {site}" if site else ""
    if rec.p2p:
        group = GroupId.parse(rec.pg).collectives.label
        transfer = transfer or (rec.blocking_p2p() or rec.p2p)[0]
        return f"{transfer.call(rec.op)}{'' if group == 'default' else ' in group ' + group}{origin}{_flight(rec)}"
    return f"{rec.op} #{rec.number} of group {rec.pg}{origin}{_flight(rec)}"


def _flight(rec: CollectiveRecord) -> str:
    return " (enqueued, not completed)" if rec.state == RecordState.IN_FLIGHT else ""


def waiting_for(rec: CollectiveRecord, view: RankView | None = None) -> str:
    """What a rank waits in, after 'waits': 'in all_reduce #3 of group default from x.py:5'; for a
    collective whose call returned before its work completed (NCCL), the rank waits for it at its
    sync point: 'for all_reduce #3 of group default from x.py:5 (enqueued, not completed) at x.py:7:
    loss.item()' (the line from the rank's stack, when it was asked for)."""
    if rec.state != RecordState.IN_FLIGHT:
        return f"in {where(rec)}"
    sync = place(view, NO_FUNCTION) if view is not None else ""
    return f"for {where(rec)}" + (f" at {sync}" if sync else "")


def ended_in(view: RankView, rec: CollectiveRecord) -> str:
    """How a rank that died inside ``rec`` went, after "until": 'it was killed by SIGABRT (NCCL's
    watchdog ...)' for an abort while the collective was enqueued and not completed (the watchdog's
    way of ending a rank), 'it exited with code 1'."""
    how = ("it was " if view.signal_name else "it ") + view.exit_description
    if view.signal_name == "SIGABRT" and rec.state == RecordState.IN_FLIGHT:
        how += " (NCCL's watchdog ends a rank so when a collective it enqueued times out or fails)"
    return how


def state_of(view: RankView, pg: str, views: dict | None = None, quote: int = FULL, words: Words = TEST) -> str:
    """Why this rank is not in the collective the others wait in (``quote``: how much of its place a
    headline quotes, ``outside.FULL`` first)."""
    if view.status == RankState.UNSEEN:  # how far it got is not known here
        return words.unseen
    count = view.count_in(pg)
    after = f"after {count} collective{'s' if count != 1 else ''} in group {pg}"
    if view.status == RankState.DEAD:  # where it was when it went, if its stack was written then
        at = place(view, quote) if view.current is None else ""
        if at:
            return f"{view.exit_description} at {at} {after}"
        # no stack (SIGKILL: the OOM killer, kill -9): its last journaled place
        last = next((r for r in reversed(view.records_in(pg)) if r.state == RecordState.COMPLETED), None)
        return f"{view.exit_description} {after}" + (f", the last {where(last)}" if last is not None else "")
    if view.status == RankState.FAILED:
        return f"raised {brief(view.message or view.exc_type)} {after}"
    if view.status == RankState.PASSED:
        return f"{words.left} {after}"
    if view.status in (RankState.SKIPPED, RankState.XFAILED):
        return f"left the test ({view.status}) {after}"
    cur = view.current
    if cur is not None and cur.pg != pg:
        return f"waits {waiting_for(cur, view)} instead, {after}"
    if view.status == RankState.NOT_STARTED:
        return f"{words.not_started}, {after}"
    rendezvous = rendezvous_at(view.stack) if view.outside_wait is None else ""  # else: the tracer saw it
    if rendezvous:
        return f"waits in a rendezvous at {rendezvous} that a member of the new group never joined, {after}"
    idle = running_state(view, views, quote) or words.outside
    last = last_completed(view) if words.since_last else None
    if last is not None:
        idle += f" since {where(last)}"
    return f"{idle}, {after}"


def last_completed(view: RankView) -> CollectiveRecord | None:
    """The collective this rank completed last, in any group (issue order)."""
    return next((r for r in reversed(view.records) if r.state == RecordState.COMPLETED), None)


def waiting_summary(views: list[RankView]) -> str:
    """'; ranks 0,1 wait in X; rank 3 waits in Y': running ranks grouped by where they wait."""
    at: dict[str, list[int]] = {}
    for v in views:
        if v.status == RankState.RUNNING and v.current is not None:
            at.setdefault(waiting_for(v.current, v), []).append(v.rank)
    parts = [f"{rank_list(rs)} wait{'s' if len(rs) == 1 else ''} {pos}" for pos, rs in list(at.items())[:2]]
    return "".join("; " + p for p in parts + elsewhere(views))  # and the ranks outside any collective
