"""Controller side of ``pytest-nccl watch``: what the watch does with a verdict, and its exit status.
Pure (no processes, no files): tested on data.

- ``on_verdict``: a verdict of the attempt being followed ends the job, unless the launcher restarts
  failed workers and this attempt has restarts left and the verdict is one the launcher acts on by
  itself (``judge.launcher_restarts``: a rank raised or died): then it is that attempt's verdict,
  reported, and the watch follows the next attempt. ``--keep-running`` reports and waits.
- ``exit_status``: one status per outcome, whoever ended the job first: 3 for a verdict (the watch
  ended the job, or the job ended before the watch concluded and its journals show the failure),
  4 for a verdict with ``--keep-running``, else the launcher's own.
- ``waited_for_peers``: processes that have waited in ``init_process_group`` (or a launcher's
  rendezvous) for ``timeout`` seconds while no process of the attempt created its group: peers
  that never appeared; or members of a side group (one created outside ``init_process_group``:
  OpenRLHF's weight-sync group) that waited ``timeout`` seconds for members that never connected,
  whether or not a default group exists: a verdict (``side_group_verdict``).
- ``no_rank_line``: the one line for a job in which no process created a default group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...core.judge import launcher_restarts

EXIT_DIAGNOSED = 3
# the line at the end of a job whose ranks were a pytest-nccl session's (``Monitor.self_judged``)
SELF_JUDGED = ("the job's ranks were a pytest-nccl session's, which judged their collectives itself, test by "
               "test (its report above); the watch followed the job's processes only")
EXIT_DIAGNOSED_KEPT = 4


class Action(enum.Enum):
    END_JOB = "end the job"
    FOLLOW_NEXT_ATTEMPT = "report it as the attempt's verdict and follow the next attempt"
    KEEP_RUNNING = "report it and wait for the job to end (--keep-running)"


@dataclass(frozen=True)
class Attempt:
    """Which of the launcher's attempts the ranks belong to (torchrun: restart count, 0 first)."""
    restart: int = 0
    max_restarts: int = 0

    @property
    def restartable(self) -> bool:
        return self.restart < self.max_restarts

    def describe(self) -> str:
        return f"attempt {self.restart + 1} of {self.max_restarts + 1}"


def attempt_of(infos: list) -> Attempt:
    """The attempt of a set of ``rank-R.json`` records (``RankInfo``: they agree, one launcher set them)."""
    restarts = [i.attempt for i in infos] or [0]
    limits = [i.max_restarts for i in infos] or [0]
    return Attempt(max(restarts), max(limits))


def on_verdict(diagnosis, attempt: Attempt, keep_running: bool) -> Action:
    if attempt.restartable and launcher_restarts(diagnosis):
        return Action.FOLLOW_NEXT_ATTEMPT
    return Action.KEEP_RUNNING if keep_running else Action.END_JOB


def exit_status(*, verdict: bool, kept_running: bool, job_status: int) -> int:
    if verdict:
        return EXIT_DIAGNOSED_KEPT if kept_running else EXIT_DIAGNOSED
    return job_status


class Waits(enum.Enum):
    """Where a joining process waits for its peers."""
    INIT = "init_process_group"
    RENDEZVOUS = "rendezvous"        # torchrun's agent, for the other nodes (no worker started yet)
    GROUP = "group"                  # a side group's creation (rendezvous, process group helper, backend)

    @classmethod
    def of(cls, what: str) -> "Waits":
        """The wait a ``JoiningNote.what`` names; ``init_process_group`` for any other text."""
        return next((w for w in cls if w.value == what), cls.INIT)


@dataclass(frozen=True)
class Joining:
    """A process waiting for its peers (``joining-PID.json``), first seen at ``since`` (the watch's
    clock). ``rank``/``world``: ranks in init_process_group, nodes in a rendezvous; None unknown."""
    pid: int
    since: float
    rank: int | None = None
    world: int | None = None
    site: str = ""
    waits: Waits = Waits.INIT
    group: str = ""        # a side group: its name, else its store's address
    store: str = ""        # ... its store's host:port


def waited_for_peers(joining: list, ranks_seen: int, now: float, timeout: float) -> list:
    """The joining processes, when one has waited ``timeout`` seconds while no process of the
    attempt has a group yet (empty: keep waiting); first, the members of a side group that have
    waited ``timeout`` seconds for members that never connected."""
    side = _side_group_waiting([j for j in joining if j.waits == Waits.GROUP], now, timeout)
    if side:
        return side
    joining = [j for j in joining if j.waits != Waits.GROUP]
    if ranks_seen or not joining:
        return []
    if min(j.since for j in joining) + timeout > now:
        return []
    return sorted(joining, key=lambda j: (j.waits != Waits.INIT, j.rank is None, j.rank or 0, j.pid))


def _side_group_waiting(members: list, now: float, timeout: float) -> list:
    """The waiting members of the first side group (by its store) that has waited ``timeout``
    seconds with fewer members than its size: the others never connected. A member of unknown
    rank or size says nothing (a complete group is only slow to create)."""
    groups: dict = {}
    for j in members:
        if j.rank is not None and j.world:
            groups.setdefault(j.store or j.group, []).append(j)
    for key in sorted(groups):
        waiting = groups[key]
        if len({j.rank for j in waiting}) < waiting[0].world and min(j.since for j in waiting) + timeout <= now:
            return sorted(waiting, key=lambda j: (j.rank, j.pid))
    return []


# seconds a side group's members wait for one that has not connected before the watch says so in a
# line (not a verdict: an inference engine loading a large model joins minutes late); the verdict
# comes at --timeout
SIDE_GROUP_NOTICE = 15.0


def notice_after(timeout: float) -> float | None:
    """Seconds after which a side group's wait is said (c10d's and vLLM's groups alike), or None where
    --timeout comes as soon (the verdict itself then)."""
    return SIDE_GROUP_NOTICE if timeout > SIDE_GROUP_NOTICE else None


def side_group_notice(joining: list, now: float, timeout: float, said: set) -> str | None:
    """The line for a side group whose members have waited ``SIDE_GROUP_NOTICE`` seconds for one that
    has not connected, once per group (``said``: the groups' stores already said, updated), and only
    where --timeout is further away."""
    if notice_after(timeout) is None:
        return None
    members = [j for j in joining if j.waits == Waits.GROUP and (j.store or j.group) not in said]
    waiting = _side_group_waiting(members, now, SIDE_GROUP_NOTICE)
    if not waiting:
        return None
    said.add(waiting[0].store or waiting[0].group)
    joined, never, name, store, where = _side_group_facts(waiting)
    many = len(never) > 1
    return (f"group {name}: {len(joined)} of {waiting[0].world} members joined{store}; member{'s' if many else ''} "
            f"{_shown(never)} not connected after {SIDE_GROUP_NOTICE:g} s{where}; a verdict at --timeout "
            f"({timeout:g} s) unless {'they connect' if many else 'it connects'}")


def side_group_verdict(waiting: list) -> bool:
    """Members of a side group waited for members that never connected: the job's verdict (exit 3);
    peers of the default group that never appeared are not (the launcher's status stands)."""
    return bool(waiting) and waiting[0].waits == Waits.GROUP


def _side_group_facts(waiting: list) -> tuple:
    """(joined ranks, ranks never connected, the group's name, " (store h:p)", "; created at SITE")."""
    first = waiting[0]
    joined = sorted({j.rank for j in waiting if j.rank is not None})
    never = [r for r in range(first.world or 0) if r not in joined]
    name = first.group or next((j.group for j in waiting if j.group), "") or "(unnamed)"
    store = f" (store {first.store})" if first.store else ""
    site = next((j.site for j in waiting if j.site), "")
    return joined, never, name, store, f"; created at {site}" if site else ""


def _shown(ranks: list) -> str:
    return ",".join(map(str, ranks[:8])) + (",..." if len(ranks) > 8 else "")


def _side_group_line(waiting: list, timeout: float) -> str:
    joined, never, name, store, where = _side_group_facts(waiting)
    pids = ", ".join(f"{j.rank}: pid {j.pid}" for j in waiting[:8])
    return (f"group {name}: {len(joined)} of {waiting[0].world or 0} members joined{store}; "
            f"member{'s' if len(never) > 1 else ''} {_shown(never)} never connected (the others waited "
            f"{timeout:g} s, --timeout: {pids}){where}")


def side_group_report(waiting: list, timeout: float) -> str:
    """A side group's verdict as every verdict reads: its headline, then where each member that
    joined waits (rank, pid, the line that created the group)."""
    _, never, name, _, _ = _side_group_facts(waiting)
    lines = [_side_group_line(waiting, timeout), "",
             f"-- where each member of group {name} is --"]
    lines += [f"  member {j.rank} (pid {j.pid}): waits for members {_shown(never)} in its creation"
              f"{f' at {j.site}' if j.site else ''}" for j in waiting if j.rank is not None]
    return "\n".join(lines)


def join_failure_line(failed: list, attempt: int, job_code: int) -> str:
    """'attempt 2: ranks 0,1 failed in init_process_group at t.py:9: DistStoreError: ... (the
    launcher's exit status 1)': a (restarted) attempt whose ranks could not form their group."""
    ranks = sorted({n.rank for n in failed if n.rank is not None})
    who = (f"rank{'s' if len(ranks) > 1 else ''} {_shown(ranks)}" if ranks else
           f"process{'es' if len(failed) > 1 else ''} {_shown([n.pid for n in failed])}")
    site = next((n.site for n in failed if n.site), "")
    return (f"attempt {attempt + 1}: {who} failed in init_process_group{f' at {site}' if site else ''}: "
            f"{failed[0].error} (the launcher's exit status {job_code})")


def _missing(waiting: list, noun: str) -> str:
    world = next((j.world for j in waiting if j.world), None)
    present = {j.rank for j in waiting if j.rank is not None}
    if not world or len(present) != len(waiting):
        return ""
    absent = [r for r in range(world) if r not in present]
    if not absent:
        return ""
    shown = ",".join(map(str, absent[:8])) + (",..." if len(absent) > 8 else "")
    return f"; {noun}{'s' if len(absent) > 1 else ''} {shown} of {world} never joined"


def peers_line(waiting: list, timeout: float) -> str:
    """The one line for peers that never appeared (or side group members that never connected)."""
    if side_group_verdict(waiting):
        return _side_group_line(waiting, timeout)
    ranks = [j for j in waiting if j.waits == Waits.INIT]
    if ranks:
        first = ranks[0]
        who = f"rank {first.rank} (pid {first.pid})" if first.rank is not None else f"pid {first.pid}"
        others = f" (and {len(ranks) - 1} more)" if len(ranks) > 1 else ""
        where = f" at {first.site}" if first.site else ""
        what = f"{who}{others} waited {timeout:g} s (--timeout) in init_process_group{where}{_missing(ranks, 'rank')}"
    else:
        first = waiting[0]
        node = f" as node {first.rank}" if first.rank is not None else ""
        nodes = f" of {first.world}" if first.world and node else ""
        what = (f"the launcher (pid {first.pid}) waited {timeout:g} s (--timeout) in its rendezvous{node}{nodes}"
                f"{_missing(waiting, 'node')}")
    return (f"peers never appeared: {what} (a node or process that never started, or another "
            "MASTER_ADDR/MASTER_PORT)")


def no_rank_line(torch_processes: int, members: int = 0, side_callers: int = 0) -> str | None:
    """No process created a default process group and the job ended (``members`` of them created
    side groups, whose creation the watch followed). None when ``side_callers`` processes reported
    through a group outside c10d (vLLM's, whose calls the watch followed and judged): a healthy job,
    as one whose ranks reported, with nothing to say."""
    if side_callers:
        return None
    if members:
        return (f"{members} process{'es' if members > 1 else ''} created groups outside init_process_group "
                "(side groups) and none a default process group: their creation was followed, their "
                "collectives were not")
    if torch_processes == 0:
        return ("not a distributed job: no process of it imported torch (or its Python ran with -S, -I "
                "or -E, which skip the start-up hook); nothing was watched")
    return (f"no rank reported: {torch_processes} process{'es' if torch_processes > 1 else ''} imported "
            "torch, none created a default process group (it ended before init_process_group, or never "
            "called it)")
