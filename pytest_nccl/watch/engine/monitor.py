"""Controller side of ``pytest-nccl watch``: follow the ranks' files and feed the referee.

``Monitor.poll(now)`` is one tick: new ``rank-R.json`` files (the world size is the one the ranks
saw), the bytes each journal gained since the last tick (read by offset, following the file across
rotations), exit records and vanished pids (``Referee.finished``), then ``Referee.step`` with a
``JobView`` (``jobview.py``). Its cost per tick does not grow with the job: journals are read
incrementally and the records kept are a window (``window.py``). ``conclude`` runs the call driver's conclusion
(``core.call``: settle, stacks of the ranks still running, the judge), as the test modes do: a
``CallOutcome``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Callable

from ...core import jobdir
from ...core.call import CallDriver, Dumps
from ...core.diagnosis.wording import JOB
from ...core.groups import DEFAULT
from ...core.jobdir import RankInfo
from ...core.messages import AgentRequest
from ...core.referee import TIMING as RULES
from ...core.referee import Referee
from ...core.reports import CallOutcome, RankReport
from ...core.states import RankState, Reason, RecordState
from ..debug import debug as _debug
from ..timing import TIMING
from .acrossnodes import AcrossNodes
from .channel import CONNECT_WAIT
from .channel import connect as channel_connect
from .follow import Followed, LocalRank, RemoteRank, fr_progress
from .jobview import JobView
from .nodes import Nodes
from .rankreport import ON_ANOTHER_NODE, OUTSIDE, report_of
from .window import REMOTE_KEEP, Window

# The rules' timing for a job: once decided, a rank outside any collective gets 2 s (the test modes:
# 0.3 s) to reach it before the report says where each rank is. A job's ranks run real steps between
# collectives, and on a loaded host one may lag by a second: a shape mismatch that gloo rejected on
# rank 0 at once was reported with two ranks "never entered it" (the soak, 1 round in 9). It ends as
# soon as every running rank waits in a collective, so a verdict is late by 2 s at most.
JOB_RULES = replace(RULES, settle=2.0)


class Monitor:
    """``connect``: how the watch reaches the other nodes' watches, from a rank's info
    (``channel.connect``; tests give a fake)."""

    def __init__(self, directory: str, timeout: float, connect: Callable = channel_connect):
        self.dir, self.timeout = directory, timeout
        self.ranks: dict[int, Followed] = {}
        self.world = 0
        self.connect = connect
        self.node_count = 1                 # nodes the job's ranks run on (LOCAL_WORLD_SIZE < WORLD_SIZE: more)
        self.elsewhere = False              # ranks this watch never saw took part in a collective (_ranks_elsewhere)
        self.nodes: Nodes | None = None      # the other nodes' watches, when the channel is up
        self.referee: Referee | None = None
        self.driver: CallDriver | None = None  # the call's driver, once the referee exists
        self.t0 = 0.0
        self.window = Window()
        self.view = JobView(self)
        self._next_scan = 0.0
        self._stop = threading.Event()
        self._connecting = threading.Event()  # the channel to the other nodes is being opened
        self._prewarmed = False
        # the window's reads and trims on the loop's thread, the relay's answers on its own
        self.lock = threading.RLock()
        self.across = AcrossNodes(self)     # what crosses the channel, from this monitor's side
        self._poller = threading.Thread(target=self._poll_status, name="pytest-nccl-watch-status", daemon=True)
        self._poller.start()

    # -- one tick ------------------------------------------------------------------------------------
    @property
    def other_nodes(self) -> bool:
        """Ranks run outside this watch too: on other nodes (LOCAL_WORLD_SIZE < WORLD_SIZE), or ranks it
        never saw are known to run somewhere (``_ranks_elsewhere``)."""
        return self.node_count > 1 or self.elsewhere

    @property
    def self_judged(self) -> bool:
        """The ranks are a pytest-nccl session's (``RankInfo.self_judged``): it bounds and judges their
        collectives test by test, and its exit status says how they went; the watch follows the
        job's processes only (they end with it), and gives no verdict of its own."""
        return any(f.info.self_judged for f in self.ranks.values())

    def poll(self, now: float) -> Reason | None:
        if now >= self._next_scan and (self.referee is None or len(self.ranks) < self.world):
            self._next_scan = now + TIMING.scan_every
            self._discover(now)
        if self.referee is None or self.self_judged:
            return None
        with self.lock:
            self.read_all()
            if self.nodes is not None and self.nodes.decides:
                self.across.summaries(self.nodes)
            self._ranks_elsewhere()
            self.window.trim(self.ranks, self.world)
        self.finished(now)
        self._lose_sight()
        if self.follows_only:
            return None
        reason = self._driver().step(now)
        if reason is not None:
            _debug(f"referee: {reason}")
        return reason

    def wake_at(self, now: float) -> float:
        if self.follows_only:  # it looks for the deciding watch's verdict only
            return now + TIMING.verdict_poll
        return self.referee.wake_at() if self.referee is not None else now + TIMING.scan_every

    def _discover(self, now: float) -> None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            names = []
        if self.referee is None and not self._prewarmed:
            self._prewarm(names)
        for name in names:
            rank = jobdir.rank_of(name)
            if rank is None or rank in self.ranks:
                continue
            info = jobdir.read_rank_info(os.path.join(self.dir, name))
            if info is None:
                continue
            self.ranks[rank] = Followed(rank, LocalRank(rank, info, self.dir))
            _debug(f"rank {rank} joined: pid {info.pid}")
            if self.referee is None:
                self._first_rank(info, now)
            if self.nodes is not None:
                self.nodes.channel.publish_info(rank, info.to_dict())

    def _prewarm(self, names: list) -> None:
        """A process of a job on several nodes waits for its peers: import torch now, in the
        background, for the channel to the other nodes' watches (seconds on a loaded host), so that it
        is up soon after the group is."""
        for name in names:
            if name.startswith("joining-") and name.endswith(".json"):
                note = jobdir.read_joining(os.path.join(self.dir, name))
                world, local = (note.world, note.local_world) if note is not None else (None, None)
                if world and local and local < world:
                    self._prewarmed = True
                    threading.Thread(target=_import_torch_distributed, name="pytest-nccl-watch-prewarm",
                                     daemon=True).start()
                    return

    def _first_rank(self, info: RankInfo, now: float) -> None:
        """The world is the one the first rank saw; a world larger than its node's ranks runs on
        other nodes too: reach their watches through the job's store."""
        self.world = info.world
        self.t0 = now
        self.referee = Referee(self.world, self.timeout, now, trace=True, rolling=True, timing=JOB_RULES)
        self.driver = CallDriver(self.referee, self.view)
        local_world = info.local_ranks or self.world
        self.node_count = -(-self.world // local_world)
        if self.other_nodes:  # reached in the background: the store may be slow to answer, or gone
            self._connecting.set()
            threading.Thread(target=self._reach_other_nodes, args=(info,), name="pytest-nccl-watch-connect",
                             daemon=True).start()

    def _reach_other_nodes(self, info: RankInfo) -> None:
        """Reach the other nodes' watches; tried again every second while the job runs (a node whose
        launcher started more than ``CONNECT_WAIT`` after rank 0's never joined: its ranks were unseen
        by the deciding watch for the whole job). A verdict waits for the first try only."""
        try:
            _debug("ranks on other nodes: reaching their watches")
            channel = self.connect(info, lambda: 0 in self.local_ranks())
            _debug(f"ranks on other nodes; their watches {'reached' if channel else 'out of reach'}")
            self._connecting.clear()
            while channel is None and not self._stop.wait(1.0):
                channel = self.connect(info, lambda: 0 in self.local_ranks())
            if channel is None or self._stop.is_set():
                return
            for rank, f in self.local_ranks().items():
                channel.publish_info(rank, f.info.to_dict())
            nodes = Nodes(channel, self.across, lambda: 0 in self.local_ranks())
            if nodes.decides:  # other nodes' records are asked for when read: a window of that size
                self.window.keep = REMOTE_KEEP
            self.nodes = nodes
        except Exception as exc:  # said, and on with what this watch sees itself
            _debug(f"the channel to the other nodes: {type(exc).__name__}: {exc}")
        finally:
            self._connecting.clear()

    def local_ranks(self) -> dict:
        return {r: f for r, f in list(self.ranks.items()) if f.local}

    @property
    def follows_only(self) -> bool:
        """Another node's watch decides, and the channel to it holds: this one follows its own ranks
        for it, and gives no verdict of its own (``Nodes``)."""
        return self.nodes is not None and not self.nodes.decides and not self.nodes.channel.lost

    def ask_all(self, followed: list[Followed], request: AgentRequest) -> dict:
        """rank -> its agent's answer to ``request`` (None when it did not answer in time), asked at
        once, another node's ranks through one question to their node."""
        return self.across.ask_all(self.nodes if self.nodes is not None and self.nodes.decides else None,
                                   followed, request)

    def fresh_records(self, ranks: list | None = None, every: bool = False) -> None:
        """The deciding watch: the other nodes' ranks' records, fresh (``AcrossNodes``)."""
        if self.nodes is not None and self.nodes.decides:
            self.across.fresh_records(self.nodes, ranks, every)

    def read(self, f: Followed) -> None:
        with self.lock:
            self.window.read(f)

    def read_all(self) -> None:
        """What every followed rank's journal gained, into the window."""
        with self.lock:
            for f in list(self.ranks.values()):
                self.read(f)

    def finished(self, now: float) -> None:
        # another node's ranks that ended: what they did before, before they count as ended
        ended = [f for f in self.ranks.values() if f.state is None and isinstance(f.source, RemoteRank)
                 and f.source.summary.exit is not None]
        if ended:
            self.fresh_records([f.rank for f in ended])
        for f in self.ranks.values():
            if f.state is not None:
                continue
            if isinstance(f.source, RemoteRank) and f.source.summary.exit is not None and f.source.stale:
                continue  # its node did not answer yet: next tick
            record = f.source.exit_report()
            if record is None and f.source.gone():
                record = f.source.exit_report()  # written just before
                if record is None:
                    record = RankReport(f.rank, RankState.DEAD)
            if record is None:
                continue
            # its journal again: the lines it wrote before its exit record may have come after this
            # tick's read (a rank that passed would look as if it left its last collective pending)
            self.read(f)
            _debug(f"rank {f.rank} finished: {record.state}")
            f.exit = record
            f.state = record.state if record.state in (RankState.PASSED, RankState.FAILED) else RankState.DEAD
            f.finished_at = now
            self._referee().finished(f.rank, f.state, now)

    def _ranks_elsewhere(self) -> None:
        """A collective of the default group completes only once every rank of the world is in it: one
        completed while some ranks were never seen here proves they run outside this watch (another
        node of a job launched without torchrun's variables, another default world's ranks there, a
        process not started under the watch). They are unseen then, never "never started": a healthy
        job was failed with "ranks 2,3 never created the default process group"."""
        if self.elsewhere or self.referee is None or len(self.ranks) >= self.world:
            return
        self.elsewhere = any(rec.state is RecordState.COMPLETED and rec.pg == DEFAULT
                             for f in list(self.ranks.values()) for rec in f.records)
        if self.elsewhere:
            _debug(f"ranks {sorted(set(range(self.world)) - set(self.ranks))} run outside this watch")

    def _lose_sight(self) -> None:
        """The channel to the other nodes' watches ended (their deciding watch exited, or its store
        failed past every retry): their ranks still running are unseen from now on, neither running
        nor finished, so that where they were last seen is never taken for a hang."""
        if self.nodes is None or not self.nodes.channel.lost:
            return
        for f in self.ranks.values():
            if not f.local and f.state is None and not f.unseen:
                f.unseen = True
                _debug(f"rank {f.rank}: lost sight of it (the channel ended)")

    def unseen(self) -> list[int]:
        """Ranks of other nodes this watch lost sight of before they ended (a watch that followed
        only its own node's ranks for the deciding one: every other node's)."""
        lost = {r for r, f in self.ranks.items() if f.unseen and f.state is None}
        if self.nodes is not None and self.nodes.channel.lost and not self.nodes.decides:
            lost |= set(range(self.world)) - set(self.ranks)
        return sorted(lost)

    def _poll_status(self) -> None:
        while not self._stop.wait(TIMING.status_every):
            for f in list(self.local_ranks().values()):  # another node's: as its summary says
                if f.state is not None:
                    continue
                answer = f.ask(AgentRequest.STATUS, 1.0)
                if answer is not None and answer.get("fr"):
                    f.fr_progress = fr_progress(answer["fr"])

    def _driver(self) -> CallDriver:
        if self.driver is None:
            raise RuntimeError("pytest-nccl watch: no rank has reported yet")
        return self.driver

    def _referee(self) -> Referee:
        """The referee, which exists once the first rank reported (the world size is its)."""
        if self.referee is None:
            raise RuntimeError("pytest-nccl watch: no rank has reported yet")
        return self.referee

    def agree(self, finding: CallOutcome) -> CallOutcome:
        """The job's finding, the same on every node's watch (``Nodes.agree``)."""
        return self.nodes.agree(finding) if self.nodes is not None else finding

    def decided_elsewhere(self) -> CallOutcome | None:
        """The finding of the watch of rank 0's node, once it published one (``Nodes``)."""
        return self.nodes.decided_elsewhere() if self.nodes is not None else None

    def close(self) -> None:
        self._stop.set()
        if self.nodes is not None:
            self.nodes.close()
        for f in self.ranks.values():
            f.file.close()

    # -- the verdict ------------------------------------------------------------------------------------
    def conclude(self, reason: Reason, now: float, interrupted: str = "") -> CallOutcome:
        """The driver's conclusion (settle, stacks of the ranks still running, the judge), as in the
        test modes, with the window's numbering (``interrupted``: the signal, ``Reason.INTERRUPTED``)."""
        self._await_other_nodes()
        view = self.view
        view.answers = {}
        backend = next((f.info.backend for f in self.ranks.values()), "")
        outcome = self._driver().conclude(reason, bound=self.timeout, elapsed=now - self.t0,
                                          backend=backend, trace=True, words=JOB, interrupted=interrupted)
        if not outcome.fr_pickle:  # no rank was left to ask (NCCL's watchdog ended them): their dump files
            left = Dumps()
            view.timeout_dumps(left)
            outcome.fr_json, outcome.fr_pickle = left.fr_json, left.fr_pickle
        if outcome.diagnosis is None:  # clean: the views carry the window all the same
            journals = view.final_journals(outcome.reports, Dumps(fr_json=outcome.fr_json))
            for v in outcome.views:
                v.records = journals[v.rank]
        outcome.bases = dict(self.window.base)
        outcome.counts = {r: dict(f.count) for r, f in self.ranks.items()}
        return outcome

    def after_exit(self, now: float, launcher_ok: bool = False) -> CallOutcome | None:
        """The job ended on its own: what the journals say, when the ranks did not all pass.
        ``launcher_ok``: the launcher reported success; a rank that vanished without an exit record
        and without a fatal signal (faulthandler's record) was ended by it with the job, whatever
        status the watch saw it end with: Ray ends its actors so once the driver is done (SIGTERM,
        which Ray's handler turns into status 1, or a quick exit from C++), and a script may end
        with ``os._exit(0)``. Not a rank that died."""
        self._discover(now)  # ranks that came and went between two scans (a job of a second)
        if self.referee is None or self.self_judged:
            return None
        for f in self.ranks.values():
            self.read(f)
        self._ranks_elsewhere()
        self.finished(now)
        local = self.local_ranks()
        for f in local.values():  # another node's ranks are its launcher's to end
            if f.state is None:  # it outlived the launcher
                f.state = RankState.DEAD
                self._referee().finished(f.rank, f.state, now)
            if launcher_ok and f.state == RankState.DEAD and not f.source.fatal():
                f.state = RankState.PASSED
        failed = [f for f in self.ranks.values() if f.state not in (None, RankState.PASSED)]
        if self.other_nodes and not failed:
            return None  # this node's ranks passed; the other nodes' are their own watches' to judge
        finding = self.conclude(Reason.COMPLETED, now)
        return finding if finding.diagnosis is not None else None

    def _await_other_nodes(self) -> None:
        """On several nodes: the other nodes' watches reached and in sync (within
        ``WatchTiming.agree_wait``), and what they published read, before judging the whole job."""
        if not self.other_nodes:
            return
        deadline = time.monotonic() + CONNECT_WAIT  # a loaded host: a verdict late, not a verdict blind
        while self.nodes is None and self._connecting.is_set() and time.monotonic() < deadline:
            time.sleep(TIMING.poll)
        if self.nodes is None:
            return
        self.nodes.await_synced(self.node_count - 1, time.monotonic() + TIMING.agree_wait)
        now = time.monotonic()
        self._discover(now)
        if self.nodes.decides:  # a verdict: a node that missed three beats is not followed
            with self.lock:
                self.across.summaries(self.nodes, silent_after=3 * TIMING.beat_every)
        self.finished(now)

    def report(self, r: int, answer: dict | None) -> RankReport:
        outside = ON_ANOTHER_NODE if self.node_count > 1 else OUTSIDE if self.elsewhere else None
        return report_of(r, self.ranks.get(r), answer, self.t0, outside)


def _import_torch_distributed() -> None:
    # before torch loads (the job was started already: its environment is its own): torch's C++ log
    # would print each failed connection to the job's store with a 30-line stack, before the verdict
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    try:
        import torch.distributed  # noqa: F401
    except Exception:  # a prewarm only: a broken torch says so where it is used
        pass



