"""Where each rank of a running job is, without judging it: asked for (SIGUSR1 to the watch,
``pytest-nccl where``) and as a progress line (``--progress``).

What each rank did (its collectives, the last it completed), what it waits in and for how long, or
where it is outside any collective (its stack's line), and the slowest rank: said in a few lines, the
job untouched. Pure: built from the ``RankPlace`` values the monitor makes (``Monitor.places``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.diagnosis.outside import running_state
from ...core.diagnosis.wording import rank_list, waiting_for, where
from ...core.records import CollectiveRecord, RankView
from ...core.states import RankState, RecordState
from .follow import Followed
from .rankreport import report_of

SHOWN_RANKS = 32  # ranks listed one a line; the rest in one line (the slowest and longest waits are named)


@dataclass(frozen=True)
class RankPlace:
    """One rank, as the watch knows it now."""
    view: RankView                      # its state, the window of its records, its stack when asked
    count: int                          # collectives it entered, every group
    last: CollectiveRecord | None       # the last one it completed
    pending: CollectiveRecord | None    # the one it waits in (entered, waited on, in flight)
    waited: float | None                # seconds since it entered ``pending``

    @property
    def rank(self) -> int:
        return self.view.rank

    @property
    def running(self) -> bool:
        return self.view.status == RankState.RUNNING

    def now(self) -> str:
        """'waits in all_reduce #4 of group default from x.py:10 for 3.2 s', 'is busy outside any
        collective at x.py:9: time.sleep(600)', 'exited normally'."""
        v = self.view
        if v.status == RankState.UNSEEN:
            return "cannot be seen by this watch (on another node)"
        if not self.running:
            return v.exit_description if v.status == RankState.DEAD else f"{v.status}"
        if self.pending is not None:
            waited = f" for {self.waited:.1f} s" if self.waited is not None else ""
            return f"waits {waiting_for(self.pending, v)}{waited}"
        return running_state(v) or "runs, outside any collective"

    def line(self) -> str:
        done = f"{self.count} collective{'s' if self.count != 1 else ''}"
        last = f", the last completed {where(self.last)}" if self.last is not None else ""
        return f"rank {self.rank}: {self.now()}; {done}{last}"


def place_of(f: Followed, stack: str, wall_now: float) -> RankPlace:
    """Rank ``f`` now (``stack``: its agent's answer, '' when not asked); ``wall_now``: ``time.time()``,
    the clock of its records' start (its ``RankInfo.t0``)."""
    view = RankView(f.rank, status=RankState.UNSEEN if f.unseen and f.state is None else f.state or RankState.RUNNING,
                    records=f.records, stack=stack)
    if f.exit is not None:
        view.exit_code, view.signal_name, view.message = f.exit.exit_code, f.exit.signal_name, f.exit.message
    if view.status == RankState.DEAD:  # how it ended as a verdict says it (its signal, the OOM killer)
        ended = report_of(f.rank, f, None, 0.0, None)
        if ended.signal_name is not None or ended.exit_code is not None:
            view.exit_code, view.signal_name, view.oom = ended.exit_code, ended.signal_name, ended.oom
    pending = view.current if view.status == RankState.RUNNING else None
    last = next((r for r in reversed(f.records) if r.state == RecordState.COMPLETED), None)
    waited = max(0.0, wall_now - (f.info.t0 + pending.t_start)) if pending is not None and f.info.t0 else None
    return RankPlace(view, sum(f.count.values()), last, pending, waited)


def slowest(places: list[RankPlace]) -> RankPlace | None:
    """The running rank with the fewest collectives, when the running ranks' counts differ."""
    running = [p for p in places if p.running]
    counts = {p.count for p in running}
    if len(counts) < 2:
        return None
    return min(running, key=lambda p: (p.count, p.rank))


def longest_wait(places: list[RankPlace]) -> RankPlace | None:
    waiting = [p for p in places if p.running and p.pending is not None and p.waited is not None]
    return max(waiting, key=lambda p: (p.waited, -p.rank), default=None)


def lines(places: list[RankPlace], elapsed: float) -> list[str]:
    """The answer to "where is each rank?": a line a rank (the first ``SHOWN_RANKS``), then the
    slowest rank and the longest wait."""
    out = [f"where each rank is, {elapsed:.1f} s after init_process_group (the job goes on):"]
    shown = sorted(places, key=lambda p: p.rank)
    out += [f"  {p.line()}" for p in shown[:SHOWN_RANKS]]
    if len(shown) > SHOWN_RANKS:
        out.append(f"  ... and {len(shown) - SHOWN_RANKS} more ranks")
    if (slow := slowest(places)) is not None:
        most = max(p.count for p in places if p.running)
        out.append(f"  slowest: rank {slow.rank}, {slow.count} collectives (the most: {most})")
    if (wait := longest_wait(places)) is not None:
        assert wait.pending is not None and wait.waited is not None
        out.append(f"  longest wait: rank {wait.rank}, {wait.waited:.1f} s in {where(wait.pending)}")
    if not places:
        out[0] = f"no rank has created its default process group yet ({elapsed:.1f} s)"
    return out


def progress_line(places: list[RankPlace], elapsed: float) -> str:
    """One line for a long job's log (``elapsed``: since the watch started): 'progress at 120 s: ranks
    0-3 running, 1204-1210 collectives; slowest rank 2 (1204); longest wait rank 0, 3.2 s in
    all_reduce #1211 of group default'."""
    if not places:
        return f"progress at {elapsed:.0f} s: no rank has created its default process group yet"
    running = [p.rank for p in places if p.running]
    counts = [p.count for p in places if p.running] or [p.count for p in places]
    span = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    text = f"progress at {elapsed:.0f} s: {rank_list(running) + ' running' if running else 'no rank running'}, " \
           f"{span} collectives"
    ended = len(places) - len(running)
    if ended:
        text += f", {ended} ended"
    if (slow := slowest(places)) is not None:
        text += f"; slowest rank {slow.rank} ({slow.count})"
    if (wait := longest_wait(places)) is not None:
        assert wait.pending is not None and wait.waited is not None
        text += f"; longest wait rank {wait.rank}, {wait.waited:.1f} s in {where(wait.pending)}"
    return text
