"""Controller side of the watch: the engine that follows one job and decides, whatever shows it.

``Engine`` follows a job's directory: the launcher's attempts (torchrun ``--max-restarts`` starts a
new set of ranks per attempt, in ``jobdir.attempt_dir``), one ``Monitor`` for the attempt's first
default world and ``OtherWorlds`` for the others, the processes waiting to join (peers that never
appear), and what a verdict does (``outcome.on_verdict``). It prints nothing and ends nothing
itself: it tells its ``FrontEnd``, which the command (``cli.Watch``: a terminal, the launcher's
process group) and the in-test follower (``testwatch.TestWatch``: pytest, the test's processes)
each implement.

    engine = Engine(directory, front, timeout=...)
    while ...:                   # the front-end's loop
        if engine.tick(now):     # a verdict, reported (``front.report``), the job ended (``front.end_job``)
            ...
        sleep until engine.wake_at(now)
    ending = engine.conclude(job_status)  # the launcher (the test's call) returned: what the journals show
    engine.close()
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Protocol

from ...core import jobdir
from ...core.diagnosis.wording import rank_list
from ...core.messages import AgentRequest
from ...core.records import CollectiveRecord, RankView
from ...core.reports import CallOutcome
from ...core.states import Kind, Reason, RecordState
from ..timing import TIMING
from . import present
from .joining import JoiningProcesses, join_failures
from .monitor import Monitor
from .outcome import (
    SELF_JUDGED,
    Action,
    Attempt,
    attempt_of,
    join_failure_line,
    no_rank_line,
    on_verdict,
    peers_line,
    side_group_report,
    side_group_verdict,
    waited_for_peers,
)
from .pairing import CrossedPairs
from .present import PROG
from .sidecalls import SideCalls, side_callers
from .where import RankPlace, place_of
from .worlds import OtherWorlds


class FrontEnd(Protocol):
    """What shows the engine's findings and acts on the job for it."""

    def say(self, text: str) -> None:
        """One line (or a few) for whoever watches the job, as written (``pytest-nccl watch: ...``)."""

    def report(self, finding: CallOutcome, title: str | None = None, where: str = "") -> None:
        """A verdict, in full. ``title``: how it was found (an attempt the launcher restarts, the
        job's end); None for one found while the job runs, ``where`` then naming the world
        (`` in another default world ...``) or empty for the first."""

    def end_job(self, finding: CallOutcome | None) -> None:
        """End the job on ``finding`` (None: peers that never appeared); returns once it is gone."""


class Ended(enum.Enum):
    """What ``Engine.conclude`` found once the launcher returned."""
    KEPT = "a verdict reported with --keep-running stands"
    PEERS_MISSING = "peers that never appeared, said when found"
    GAVE_UP = "the launcher ended after the attempt's verdict: that verdict stands"
    JOURNALS = "the first default world's journals show a failure"
    OTHER_WORLD = "another default world's journals show a failure"
    CONCLUDED = "the attempt followed had concluded before (ended clean, or its verdict reported)"
    NOTHING = "the journals show no failure (``Engine.remark``: the line that says why, if any)"


@dataclass(frozen=True)
class Ending:
    how: Ended
    finding: CallOutcome | None = None
    world: str = ""                  # OTHER_WORLD: the world's label
    attempt: Attempt | None = None   # GAVE_UP: the attempt whose verdict stands


class Engine:
    """One watched job in ``directory``, followed tick by tick; ``front`` shows and acts.
    ``quiet``: only verdicts and what stands for one are said; ``keep_running``: a verdict leaves the
    job running (``--keep-running``)."""

    def __init__(self, directory: str, front: FrontEnd, *, timeout: float, quiet: bool = False,
                 keep_running: bool = False):
        self.dir, self.front = directory, front
        self.timeout, self.quiet, self.keep_running = timeout, quiet, keep_running
        self.finding: CallOutcome | None = None  # the job's verdict (an attempt's, unless the launcher gave up)
        self.kept = False               # reported with --keep-running: the job goes on
        self.ended_by_watch = False     # the engine had the front-end end the job
        self.attempt = 0                # the launcher's attempt followed (its restart count)
        self.attempt_done = False       # ... has its verdict, or ended clean: wait for the next
        self.earlier: list[tuple[Attempt, CallOutcome]] = []  # verdicts of earlier attempts, reported as they came
        self.peers_missing = ""         # the line for peers that never appeared
        self.side_group_missing = False  # ... members of a side group that never connected: a verdict
        self.joining = JoiningProcesses(self.attempt_dir)  # of the attempt followed
        self.side_calls = SideCalls(self.attempt_dir)      # ... its groups outside c10d (vLLM's)
        # the attempt's default worlds beside its first (the first one's monitor: once the job started)
        self.worlds = OtherWorlds(self.attempt_dir, timeout)
        self.monitor = Monitor(directory, timeout)
        self.crossed = CrossedPairs()  # the attempt's transfers, paired as they come (a line, the job goes on)

    @property
    def attempt_dir(self) -> str:
        """The directory of the attempt followed."""
        return jobdir.attempt_dir(self.dir, self.attempt)

    def watched(self) -> dict[int, int]:
        """Rank: collectives it entered, of the attempt followed."""
        return {r: sum(f.count.values()) for r, f in self.monitor.ranks.items()}

    def close(self) -> None:
        self.monitor.close()
        self.worlds.close()
        self.side_calls.close()
        self.crossed.close()

    # -- while the job runs -----------------------------------------------------------------------------
    def tick(self, now: float) -> bool:
        """One tick: a newer attempt followed, then the attempt's worlds; True once the job was ended
        on a verdict (``finding``)."""
        self._next_attempt(now)
        return not self.kept and self._step(now)

    def wake_at(self, now: float) -> float:
        """When the next tick is due: the first world's referee's, while it is followed, and the others'."""
        if self.kept:
            return now + 0.2
        first = now + 0.2 if self.attempt_done else self.monitor.wake_at(now)
        return min(first, self.worlds.wake_at(now))

    def _attempt(self) -> Attempt:
        return attempt_of([f.info for f in self.monitor.ranks.values()])

    def _next_attempt(self, now: float) -> None:
        """torchrun started another attempt: what the journals of this one show, then follow that one."""
        newer = [a for a in jobdir.attempts(self.dir) if a > self.attempt
                 and any(jobdir.rank_of(n) is not None or n.startswith("joining-")
                         for n in jobdir.listdir(jobdir.attempt_dir(self.dir, a)))]
        if not newer:
            return
        if not self.attempt_done:
            finding = self.monitor.after_exit(now)
            if finding is not None:
                self._report_attempt(finding, self._attempt())
        self.monitor.close()
        self.worlds.close()
        self.side_calls.close()
        self.attempt, self.attempt_done = max(newer), False
        self.joining = JoiningProcesses(self.attempt_dir)
        self.side_calls = SideCalls(self.attempt_dir)
        self.monitor = Monitor(self.attempt_dir, self.timeout)
        self.crossed.close()
        self.crossed = CrossedPairs()
        self.worlds = OtherWorlds(self.attempt_dir, self.timeout)
        if not self.quiet:
            self.front.say(f"{PROG}: following the launcher's attempt {self.attempt + 1} (restart {self.attempt})")

    def _report_attempt(self, finding: CallOutcome, attempt: Attempt) -> None:
        self.earlier.append((attempt, finding))
        self.front.report(finding, title=f"{attempt.describe()} failed; the launcher restarts it")
        self.finding = None  # not the job's verdict, unless the launcher gives up (``conclude``)

    def _step(self, now: float) -> bool:
        """One tick of the attempt followed; True once the job was ended with a verdict."""
        if self.peers_missing:
            return False
        if not self.attempt_done and self._step_first(now):
            return True
        # the other default worlds, also once the first one's ranks are done (an engine's world goes on)
        if (other := self.worlds.poll(now)) is not None:
            return self._act(other[1], world=other[0])
        return False

    def _step_first(self, now: float) -> bool:
        """The attempt's first default world (the one followed across nodes)."""
        monitor = self.monitor
        reason = monitor.poll(now)
        # on several nodes, every node's watch gives the one finding of rank 0's node
        elsewhere = monitor.decided_elsewhere()
        if elsewhere is not None or reason in (Reason.DECIDED, Reason.TIMEOUT):
            finding = elsewhere or monitor.agree(monitor.conclude(reason or Reason.DECIDED, time.monotonic()))
            if finding.diagnosis is None:
                # every rank had finished clean by the time the reports were taken: nothing to act
                # on; the launcher's own end is the job's (a loaded host's slow exit barrier)
                self.attempt_done = True
                return False
            return self._act(finding)
        if not self.quiet:  # a crossed pair ends nothing (the bytes match): said at once, the job goes on
            for line in self.crossed.lines(monitor.ranks):
                self.front.say(f"{PROG}: {line}")
        if reason == Reason.COMPLETED and self._attempt().restartable:
            # every rank of an attempt that may be restarted ended: its verdict now, not at the job's end
            ended = monitor.after_exit(now)
            if ended is not None:
                self._report_attempt(ended, self._attempt())
            self.attempt_done = True
        elif self._peers_never_appeared(now):  # a side group's members are followed beside the ranks
            self.front.say(f"{PROG}: {self.peers_missing}; ending the job")
            self.front.end_job(None)
            self.ended_by_watch = True
        return False

    def _act(self, finding: CallOutcome, world: str = "") -> bool:
        """A verdict on the attempt (``world``: found in a default world beside its first); True once
        the job is ended."""
        attempt = self._attempt()
        action = on_verdict(finding.diagnosis, attempt, self.keep_running)
        where = f" in {world}" if world else ""
        if action == Action.FOLLOW_NEXT_ATTEMPT:
            self._report_attempt(finding, attempt)
            self.attempt_done = True
        elif action == Action.KEEP_RUNNING:
            self.front.report(finding, where=where)
            self.finding = finding
            self.kept = True
            self.front.say(f"{PROG}: --keep-running: the job goes on; the watch waits for it to end")
        else:
            if not self.quiet:
                self.front.say(f"{PROG}: {finding.verdict.kind} diagnosed{where}; ending the job (SIGTERM, "
                               f"then SIGKILL after {TIMING.job_term_wait:g} s)")
            self.front.end_job(finding)
            self.ended_by_watch = True
            self.front.report(finding, where=where)
            self.finding = finding
            return True
        return False

    def _peers_never_appeared(self, now: float) -> bool:
        waiting = waited_for_peers(self.joining.read(now), len(self.monitor.ranks), now, self.timeout)
        side = None if waiting else self.side_calls.verdict(self.timeout)  # vLLM's groups
        if not (waiting or side or self.quiet) and (
                notice := self.joining.notice(now, self.timeout) or self.side_calls.notice(self.timeout)):
            self.front.say(f"{PROG}: {notice}")
        if waiting:
            self.peers_missing = peers_line(waiting, self.timeout)
            self.side_group_missing = side_group_verdict(waiting)
            if self.side_group_missing and not self.quiet:  # a verdict: as every verdict reads
                self.front.say(present.banner(PROG, f"diagnosed ({Kind.RENDEZVOUS}, side group)"))
                self.front.say(side_group_report(waiting, self.timeout))
        elif side is not None:
            self.peers_missing, self.side_group_missing = side.headline, True
            if not self.quiet:
                self.front.say(present.banner(PROG, "diagnosed (side group)"))
                self.front.say(side.report)
            return True
        return bool(waiting)

    # -- asked while the job runs, or as another hand ends it -------------------------------------------
    def places(self, stacks: bool = True) -> tuple[list[RankPlace], float]:
        """Where each rank of the attempt followed is now, the job untouched; and the seconds since its
        first rank's group. ``stacks``: the stack of a rank outside any collective, or at its sync
        point behind one in flight, is asked of its agent (its line)."""
        monitor = self.monitor
        monitor.read_all()
        ranks = dict(monitor.ranks)
        placed = [f for f in ranks.values() if f.state is None and not f.unseen
                  and _line_from_stack(RankView(f.rank, records=f.records).current)]
        answers = monitor.ask_all(placed, AgentRequest.STACK) if stacks and placed else {}
        wall = time.time()
        places = [place_of(f, (answers.get(r) or {}).get("stack") or "", wall) for r, f in sorted(ranks.items())]
        return places, time.monotonic() - monitor.t0 if monitor.referee is not None else 0.0

    def interrupt(self, signal_name: str) -> CallOutcome | None:
        """Another hand ends the job (``signal_name``): the referee's conclusion on what is known now,
        where each rank was; None when no rank is followed, the attempt concluded already, or every
        rank had ended clean."""
        monitor = self.monitor
        if self.kept or self.attempt_done or monitor.referee is None or monitor.self_judged:
            return None
        if monitor.follows_only:
            # on several nodes the deciding watch (rank 0's node) says where every rank was; this
            # one's relay answers it for its ranks meanwhile (Slurm signals every node at once)
            deadline = time.monotonic() + TIMING.agree_wait
            while time.monotonic() < deadline and monitor.follows_only:
                if (elsewhere := monitor.decided_elsewhere()) is not None:
                    return elsewhere if elsewhere.diagnosis is not None else None
                time.sleep(TIMING.verdict_poll)
        now = time.monotonic()
        monitor.read_all()
        monitor.finished(now)
        finding = monitor.agree(monitor.conclude(Reason.INTERRUPTED, now, interrupted=signal_name))
        return finding if finding.diagnosis is not None else None

    # -- once the launcher returned ---------------------------------------------------------------------
    def conclude(self, job_status: int, *, agree: bool = True) -> Ending:
        """The launcher returned with ``job_status`` (0: success): the verdict of the attempt followed
        (the launcher gave up, or the job ended before the engine concluded), set as ``finding``.
        ``agree``: a verdict from the journals is made the job's, the same on every node's watch
        (``Monitor.agree``); the in-test follower takes its own."""
        launcher_ok = job_status == 0
        if self.kept:
            return Ending(Ended.KEPT, self.finding)
        if self.attempt_done:
            if self.earlier and self.earlier[-1][0].restart == self.attempt:  # the launcher gave up
                self.finding = self.earlier[-1][1]
                return Ending(Ended.GAVE_UP, self.finding, attempt=self.earlier[-1][0])
            # the first world ended clean; another may not have
            return self._other_world(launcher_ok) or Ending(Ended.CONCLUDED)
        if self.peers_missing:
            return Ending(Ended.PEERS_MISSING)
        finding = self.monitor.after_exit(time.monotonic(), launcher_ok=launcher_ok)
        if finding is not None:
            self.finding = self.monitor.agree(finding) if agree else finding
            return Ending(Ended.JOURNALS, self.finding)
        return self._other_world(launcher_ok) or Ending(Ended.NOTHING)

    def _other_world(self, launcher_ok: bool) -> Ending | None:
        if (other := self.worlds.after_exit(time.monotonic(), launcher_ok)) is None:
            return None
        self.finding = other[1]
        return Ending(Ended.OTHER_WORLD, other[1], world=other[0])

    def remark(self, job_status: int) -> str | None:
        """After ``Ended.NOTHING``: the line that says why the job had no verdict, when it is worth
        saying (quiet: only for a job in which no process created a default group)."""
        if (failed := join_failures(self.joining.directory)) and not self.quiet:
            return f"{PROG}: {join_failure_line(failed, self.attempt, job_status)}"
        if self.monitor.self_judged and not self.quiet:
            return f"{PROG}: {SELF_JUDGED}"
        if self.monitor.unseen() and not self.quiet:  # said, never a verdict
            return (f"{PROG}: {rank_list(self.monitor.unseen())} (on another node) could not be followed to "
                    "the end: the channel to that node's watch ended; this node's ranks ended cleanly")
        if self.monitor.referee is None and not self.earlier:
            count = [n.split("-", 1)[0] for n in jobdir.listdir(self.dir)].count
            line = no_rank_line(count('torch'), members=count('member'), side_callers=side_callers(self.dir))
            return f"{PROG}: {line}" if line else None
        return None


def _line_from_stack(pending: CollectiveRecord | None) -> bool:
    """Where a rank is takes its stack: outside any collective, or at its sync point behind one whose
    call returned before its work completed (NCCL)."""
    return pending is None or pending.state == RecordState.IN_FLIGHT
