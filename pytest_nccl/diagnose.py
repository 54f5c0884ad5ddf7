"""Pure analysis: per-rank records and outcomes -> the first divergence and a one-line headline.

No torch, no processes (like torch's flight_recorder ``builder.py`` / ``utils.py``): everything here
is tested on hand-written data. The controller calls ``diagnose(ranks, reason, bound)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .records import P2P_OPS, CollectiveRecord, RankView, RankState

# kinds, and the exception class each maps to (names from errors.py)
SHAPE_MISMATCH, DTYPE_MISMATCH, OP_MISMATCH = "shape-mismatch", "dtype-mismatch", "op-mismatch"
RANK_LEFT, GROUP_MISMATCH = "rank-left", "group-mismatch"
MISMATCH_KINDS = frozenset({SHAPE_MISMATCH, DTYPE_MISMATCH, OP_MISMATCH})
# What gloo prints when ranks disagree on a collective's sizes (gloo::EnforceNotMet, then SIGABRT)
GLOO_SIZE_MISMATCH = ("Received data size doesn't match expected size", "invalid tensor size")
RAISED, DIED, HANG, SLOW_RANK, TIMEOUT = "rank-raised", "rank-died", "hang", "slow-rank", "timeout"
SKIP_MISMATCH, SETUP = "skip-mismatch", "setup"
RENDEZVOUS = "rendezvous"

EXCEPTION_FOR_KIND = {
    SHAPE_MISMATCH: "CollectiveMismatch", DTYPE_MISMATCH: "CollectiveMismatch",
    OP_MISMATCH: "CollectiveMismatch", RANK_LEFT: "CollectiveMismatch",
    GROUP_MISMATCH: "CollectiveMismatch", RAISED: "RankRaised", DIED: "RankDied",
    HANG: "CollectiveTimeout", SLOW_RANK: "CollectiveTimeout", TIMEOUT: "CollectiveTimeout",
    SKIP_MISMATCH: "DistributedTestFailure", SETUP: "RankSetupError", RENDEZVOUS: "CollectiveTimeout",
}

# Where a rank waits for the members of a new group to join: a TCPStore server waiting for its
# clients (``wait_for_workers``), torch's rendezvous handlers, process group creation.
RENDEZVOUS_FUNCTIONS = frozenset({
    "rendezvous", "_create_c10d_store", "_tcp_rendezvous_handler", "_env_rendezvous_handler",
    "_file_rendezvous_handler", "init_process_group", "new_group", "new_subgroups",
    "_new_process_group_helper", "_store_based_barrier", "init_device_mesh",
})


@dataclass
class Divergence:
    """The first place where the ranks' collective sequences part."""
    pg: str
    seq: int                                  # 1-based position in the group where they part
    records: dict[int, CollectiveRecord]      # member rank -> its record at seq (if it has one)
    absent: list[int]                         # members with no record at seq
    kind: str                                 # SHAPE_MISMATCH | DTYPE_MISMATCH | OP_MISMATCH | RANK_LEFT


@dataclass
class Diagnosis:
    kind: str
    headline: str
    ranks: list[int] = field(default_factory=list)   # the rank(s) at fault
    pg: str | None = None
    seq: int | None = None
    divergence: Divergence | None = None

    @property
    def exception_name(self) -> str:
        return EXCEPTION_FOR_KIND.get(self.kind, "DistributedTestFailure")


def members_of(pg: str, world: int) -> list[int]:
    """Ranks of a group, from its label ("default", "pg1[0,2]")."""
    if pg != "default" and "[" in pg:
        inside = pg[pg.find("[") + 1: pg.find("]")]
        if inside and "..." not in inside:
            try:
                return sorted(int(x) for x in inside.split(","))
            except ValueError:
                pass
    return list(range(world))


def _ordered_groups(ranks: list[RankView]) -> list[str]:
    seen: dict[str, float] = {}
    for view in ranks:
        for rec in view.records:
            if rec.pg.endswith(":p2p") or rec.op in P2P_OPS:
                continue
            seen[rec.pg] = min(seen.get(rec.pg, rec.t_start), rec.t_start)
    return sorted(seen, key=lambda pg: (pg != "default", seen[pg]))


def first_divergence(ranks: list[RankView]) -> Divergence | None:
    """The earliest position, over all groups, where members disagree or some member is absent
    while another one is waiting there (or went past it)."""
    world = len(ranks)
    found: list[tuple[float, Divergence]] = []
    for pg in _ordered_groups(ranks):
        members = [r for r in members_of(pg, world) if r < world]
        seqs = {r: ranks[r].records_in(pg) for r in members}
        longest = max(len(s) for s in seqs.values())
        for i in range(longest):
            at = {r: s[i] for r, s in seqs.items() if len(s) > i}
            absent = [r for r in members if r not in at]
            present = list(at.values())
            ops = {rec.op for rec in present}
            kind = None
            if len(ops) > 1:
                kind = OP_MISMATCH
            elif len({rec.signature for rec in present}) > 1:
                kind = DTYPE_MISMATCH if len({rec.dtype for rec in present}) > 1 else SHAPE_MISMATCH
            elif absent:
                kind = RANK_LEFT
            if kind:
                t = min(rec.t_start for rec in present)
                found.append((t, Divergence(pg, i + 1, at, absent, kind)))
                break
    if not found:
        return None
    # the mismatches that explain a hang come first in time; among ties, the default group
    found.sort(key=lambda item: item[0])
    return found[0][1]


def short_path(path: str) -> str:
    """'…/site-packages/trl/trainer/x.py:12' -> 'trl/trainer/x.py:12'; test files relative to cwd."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    except ValueError:
        pass
    return path


def short_site(site: str, depth: int = 3) -> str:
    return " <- ".join(short_path(s) for s in site.split(" <- ")[:depth] if s)


def brief(message: str, limit: int = 100) -> str:
    """An exception line without gloo's source location prefix, cut to ``limit`` characters."""
    if message.count("[") and "] " in message and (".cc:" in message or ".cpp:" in message):
        head, _, rest = message.partition("[")
        message = head + rest.split("] ", 1)[-1]
    return message if len(message) <= limit else message[: limit - 3] + "..."


# Libraries whose frames only relay a collective for the code that asked for it: the headline names
# the caller (trl/trainer/sft_trainer.py:448, "via accelerate"); the trace keeps every frame.
RELAY_PACKAGES = ("accelerate",)


def headline_site(site: str) -> str:
    """The call site for a headline: the first frame outside the relaying libraries, then the
    frame after it."""
    frames = [short_path(s) for s in site.split(" <- ") if s]
    relays = []
    while len(frames) > 1 and frames[0].split("/", 1)[0] in RELAY_PACKAGES:
        package = frames.pop(0).split("/", 1)[0]
        if package not in relays:
            relays.append(package)
    text = " <- ".join(frames[:2])
    return f"{text}, via {', '.join(relays)}" if relays and text else text


def _rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _where(rec: CollectiveRecord) -> str:
    site = headline_site(rec.site)
    if rec.source == "flight-recorder":
        origin = " (issued from C++, seen by the Flight Recorder)"
    else:
        origin = f" from {site}" if site else ""
    return f"{rec.op} #{rec.seq} of group {rec.pg}{origin}"


def _main_frames(stack: str) -> list[tuple[str, str, str, str]]:
    """(path, line, function, source) of the main thread's frames, outermost first, from our
    format or faulthandler's (most recent call first)."""
    lines = stack.splitlines()
    start = next((i for i, l in enumerate(lines) if "MainThread" in l or "Current thread" in l), 0)
    frames = []
    for i in range(start + 1, len(lines)):
        l = lines[i].strip()
        if l.startswith("Thread ") or (l.startswith("Current thread") and frames):
            break
        if not l.startswith("File "):
            continue
        try:
            path, rest = l.split('"')[1], l.split('"', 2)[2]
            line = rest.split("line ", 1)[1].split(",")[0].split()[0]
            func = rest.rsplit("in ", 1)[1].strip()
        except IndexError:
            continue
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        frames.append((path, line, func, "" if nxt.startswith("File ") else nxt))
    if lines and "most recent call first" in lines[start]:
        frames.reverse()
    return frames


def _user_frames(stack: str) -> list[tuple[str, str, str, str]]:
    harness = os.sep + "pytest_nccl" + os.sep
    return [f for f in _main_frames(stack or "")
            if not (harness in f[0] and os.sep + "testing" + os.sep not in f[0])]


def stack_top(stack: str) -> str:
    """The innermost frame of the main thread outside pytest_nccl: 'file (line n, in f)'."""
    frames = _user_frames(stack)
    if not frames:
        return ""
    path, line, func, _ = frames[-1]
    return f"{short_path(path)} (line {line}, in {func})"


def _rendezvous_at(stack: str) -> str:
    """'file:line (in f)' of the code that entered a rendezvous, when the main thread waits in one
    (its innermost frame creates a TCPStore or is one of torch's rendezvous / group creation
    functions); else ''."""
    frames = _user_frames(stack)
    if not frames:
        return ""
    path, _, func, source = frames[-1]
    torch_dir = os.sep + "torch" + os.sep + "distributed" + os.sep
    if not ("TCPStore(" in source or (torch_dir in path and func in RENDEZVOUS_FUNCTIONS)):
        return ""
    user = next((f for f in reversed(frames) if torch_dir not in f[0]), frames[-1])
    return f"{short_path(user[0])}:{user[1]} (in {user[2]})"


def _state_of(view: RankView, pg: str) -> str:
    """Why this rank is not in the collective the others wait in."""
    count = len(view.records_in(pg))
    after = f"after {count} collective{'s' if count != 1 else ''} in group {pg}"
    if view.status == RankState.DEAD:
        return f"{view.exit_description} {after}"
    if view.status == RankState.FAILED:
        return f"raised {brief(view.message or view.exc_type)} {after}"
    if view.status in (RankState.PASSED, RankState.SKIPPED, RankState.XFAILED):
        return f"left the test ({view.status}) {after}"
    cur = view.current
    if cur is not None and cur.pg != pg:
        return f"waits in {_where(cur)} instead, {after}"
    if view.status == RankState.NOT_STARTED:
        return f"never started this test, {after}"
    rendezvous = _rendezvous_at(view.stack)
    if rendezvous:
        return f"waits in a rendezvous at {rendezvous} that a member of the new group never joined, {after}"
    top = stack_top(view.stack)
    return f"is busy outside any collective{' at ' + top if top else ''}, {after}"


def diagnose(ranks: list[RankView], reason: str, bound: float) -> Diagnosis | None:
    """``reason``: "completed" (every rank finished), "decided" (a rank failed or left while others
    waited), "timeout" (the bound was hit). Returns None for a clean pass."""
    div = first_divergence(ranks)
    failed = [v for v in ranks if v.status == RankState.FAILED]
    dead = [v for v in ranks if v.status == RankState.DEAD]
    running = [v for v in ranks if v.status == RankState.RUNNING]

    if div is not None and div.kind != RANK_LEFT:
        return _mismatch(div, ranks)
    if div is not None:  # some members absent from a collective that others entered
        return _absent(div, ranks, reason, bound)
    gloo_mismatch = [v for v in ranks if any(m in v.output for m in GLOO_SIZE_MISMATCH)]
    if gloo_mismatch and (dead or failed):
        # no records to compare (trace off, or the rank died before writing), but gloo said it
        victim = gloo_mismatch[0]
        said = next(line.strip() for line in victim.output.splitlines()
                    if any(m in line for m in GLOO_SIZE_MISMATCH))
        return Diagnosis(SHAPE_MISMATCH, f"shape mismatch in a collective (gloo on rank {victim.rank}: "
                         f"{brief(said, 120)}); rank {victim.rank} {victim.exit_description}"
                         f"{_waiting_summary(ranks)}", [victim.rank])
    if dead:
        first = min(dead, key=lambda v: v.finished_at or 0)
        return Diagnosis(DIED, f"{_rank_list([first.rank])} {first.exit_description}"
                         f"{_others(dead, first)}{_waiting_summary(ranks)}", [first.rank])
    if failed:
        return _raised(failed, ranks)
    if running:
        inside = [v for v in running if v.current is not None]
        if inside and len(inside) == len(running) and len({(v.current.pg, v.current.seq) for v in inside}) == 1:
            rec = inside[0].current
            every = "every rank is" if len(running) == len(ranks) else f"{_rank_list([v.rank for v in running])} are"
            return Diagnosis(HANG, f"{every} inside {_where(rec)} and none completed within the "
                             f"{bound:g} s bound (a transport or peer problem: all ranks entered it)",
                             [v.rank for v in running], rec.pg, rec.seq)
        busy = [v for v in running if v.current is None]
        if busy and inside:
            return _slow(busy, inside, bound)
        where = "; ".join(f"rank {v.rank} at {stack_top(v.stack) or 'unknown'}" for v in running[:4])
        return Diagnosis(TIMEOUT, f"the test exceeded its {bound:g} s bound outside any collective "
                         f"({where})", [v.rank for v in running])
    statuses = {v.status for v in ranks}
    if RankState.SKIPPED in statuses and len(statuses) > 1:
        skipped = [v.rank for v in ranks if v.status == RankState.SKIPPED]
        others = [v.rank for v in ranks if v.status != RankState.SKIPPED]
        return Diagnosis(SKIP_MISMATCH, f"pytest.skip was called on {_rank_list(skipped)} only "
                         f"({ranks[skipped[0]].message}); {_rank_list(others)} did not skip: "
                         "skip on every rank or on none", skipped)
    return None


def _others(group: list[RankView], first: RankView) -> str:
    rest = [v for v in group if v is not first]
    if not rest:
        return ""
    return "; also " + ", ".join(f"rank {v.rank} {v.exit_description}" for v in rest[:3])


def _waiting_summary(ranks: list[RankView]) -> str:
    waiting = [v for v in ranks if v.status == RankState.RUNNING and v.current is not None]
    if not waiting:
        return ""
    rec = waiting[0].current
    return f"; {_rank_list([v.rank for v in waiting])} wait{'s' if len(waiting) == 1 else ''} in {_where(rec)}"


def _raised(failed: list[RankView], ranks: list[RankView]) -> Diagnosis:
    by_message: dict[str, list[int]] = {}
    for v in failed:
        by_message.setdefault(v.message or v.exc_type, []).append(v.rank)
    parts = [f"{_rank_list(rs)} raised {brief(msg, 160)}" for msg, rs in by_message.items()]
    return Diagnosis(RAISED, "; ".join(parts[:3]) + _waiting_summary(ranks), [v.rank for v in failed])


def _mismatch(div: Divergence, ranks: list[RankView]) -> Diagnosis:
    recs = div.records
    if div.kind == OP_MISMATCH:
        detail = ", ".join(f"rank {r} {rec.op}" for r, rec in sorted(recs.items()))
        what = f"op mismatch at collective #{div.seq} of group {div.pg}: {detail}"
    else:
        attr = "dtype" if div.kind == DTYPE_MISMATCH else "shapes"
        groups: dict[str, list[int]] = {}
        for r, rec in sorted(recs.items()):
            groups.setdefault(getattr(rec, attr), []).append(r)
        detail = ", ".join(f"{_rank_list(rs)} {value or '?'}" for value, rs in groups.items())
        op = next(iter(recs.values())).op
        what = f"{'dtype' if attr == 'dtype' else 'shape'} mismatch in {op} #{div.seq} of group {div.pg}: {detail}"
    site = headline_site(next(iter(recs.values())).site)
    if site:
        what += f" (from {site})"
    consequences = []
    for r, rec in sorted(recs.items()):
        view = ranks[r]
        if view.status == RankState.DEAD:
            consequences.append(f"rank {r} {view.exit_description} inside it")
        elif view.status == RankState.FAILED:
            consequences.append(f"rank {r} raised {brief(view.message)}")
    if div.absent:
        consequences.append(f"{_rank_list(div.absent)} never entered it")
    if not consequences and all(not rec.pending for rec in recs.values()):
        consequences.append("the backend completed it without an error: its result is wrong")
    if consequences:
        what += "; " + "; ".join(consequences)
    # the rank(s) whose value differs from the majority
    values: dict = {}
    for r, rec in recs.items():
        values.setdefault(rec.signature, []).append(r)
    odd = min(values.values(), key=len) if len(values) > 1 else []
    return Diagnosis(div.kind, what, sorted(odd), div.pg, div.seq, div)


def _absent(div: Divergence, ranks: list[RankView], reason: str, bound: float) -> Diagnosis:
    waiting_recs = div.records
    rec = min(waiting_recs.values(), key=lambda r: r.t_start)
    absent = [ranks[r] for r in div.absent]
    # the rank that left first decides the headline
    first = min(absent, key=lambda v: (v.finished_at if v.finished_at is not None else float("inf"), v.rank))
    state = _state_of(first, div.pg)
    same = [v.rank for v in absent if _state_of(v, div.pg) == state]  # ranks 1,2 both left alike
    waiting = sorted(waiting_recs)
    verb = "wait" if len(waiting) > 1 else "waits"
    if reason == "timeout" and first.status == RankState.RUNNING:
        verb = "waited" + f" for the whole {bound:g} s bound"
    headline = f"{_rank_list(same)} {state}; {_rank_list(waiting)} {verb} in {_where(rec)}"
    others = [v for v in absent if v.rank not in same]
    if others:
        headline += "; also " + "; ".join(f"rank {v.rank} {_state_of(v, div.pg)}" for v in others[:2])
    if first.status == RankState.DEAD:
        kind = DIED
    elif first.status == RankState.FAILED:
        kind = RAISED
    elif first.status == RankState.RUNNING:
        cur = first.current
        kind = GROUP_MISMATCH if cur is not None else SLOW_RANK
        if kind == SLOW_RANK and _rendezvous_at(first.stack):
            kind = RENDEZVOUS
        elif kind == SLOW_RANK:
            headline = "slow rank: " + headline
    else:
        kind = RANK_LEFT
    return Diagnosis(kind, headline, [first.rank], div.pg, div.seq, div)


def _slow(busy: list[RankView], inside: list[RankView], bound: float) -> Diagnosis:
    rec = inside[0].current
    tops = "; ".join(f"rank {v.rank} at {stack_top(v.stack) or 'unknown'}" for v in busy[:3])
    return Diagnosis(SLOW_RANK, f"slow rank: {_rank_list([v.rank for v in busy])} busy outside any "
                     f"collective ({tops}); {_rank_list([v.rank for v in inside])} waited for the whole "
                     f"{bound:g} s bound in {_where(rec)}", [v.rank for v in busy], rec.pg, rec.seq)


# -- rules the controller applies while a call runs (also SPMD mode's decider) ------------------

def waits_for_a_finished_rank(journals: dict, live: dict) -> bool:
    """True when a running rank sits in collective #k of a group while a finished or dead member of
    that group never completed its #k there: it can never be matched."""
    finished = [r for r in journals if r not in live]
    for rank in live:
        current = RankView(rank, records=journals[rank]).current
        if current is None or current.pg.endswith(":p2p"):
            continue
        members = members_of(current.pg, len(journals))
        for other in finished:
            if other not in members:
                continue
            theirs = [r for r in journals[other] if r.pg == current.pg]
            if len(theirs) < current.seq:
                return True  # it never reached it
            # it left it without completing (raised or died inside); the Flight Recorder's own
            # completion flag is too late to trust for this
            if theirs[current.seq - 1].pending and theirs[current.seq - 1].source == "python":
                return True
    return False


def stuck_on_mismatch(journals: dict, views: dict, live: dict) -> bool:
    """True when every running rank waits in a collective and the first divergence is a mismatch
    (op, shape or dtype at the same sequence number): NCCL would hang there for good."""
    for rank in live:
        if not any(r.pending and (not r.async_op or r.state == "waiting") for r in journals[rank]):
            return False
    trial = [RankView(r, status=views[r].status, records=journals[r]) for r in range(len(journals))]
    div = first_divergence(trial)
    return div is not None and div.kind in MISMATCH_KINDS


def digests_agree(digests: dict, world: int) -> bool:
    """Every member of every group issued the same collectives (count and signatures), from the
    per-rank digests (rank -> {group: (count, crc)}) the ranks send with their outcomes: no journal
    needs reading for a clean pass."""
    per_pg: dict[str, dict] = {}
    for rank, by_pg in digests.items():
        for pg, digest in by_pg.items():
            per_pg.setdefault(pg, {})[rank] = tuple(digest)
    for pg, by_rank in per_pg.items():
        if len({by_rank.get(r, (0, 0)) for r in members_of(pg, world)}) > 1:
            return False
    return True
