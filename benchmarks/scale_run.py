"""One job of ``scale_watch.py`` (the command, its options and its results: that script's docstring):
its processes, from start to end. The job's store; each node, a ``pytest-nccl watch`` over
``scale_node.py`` (or the node process alone, unwatched); the watches' start, batch by batch, until
they joined the channel; the wait for their exits and verdict lines; what they left (the nodes'
reports, the watches' ``--json`` files and channel stats, their logs); and the end of every process
of the run, by pid, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import uuid

from scale_measure import Probe, proc_stat, rss_mb, tcp_store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = os.path.join(REPO, "benchmarks", "scale_node.py")
TAG_ENV = "PYTEST_NCCL_SCALE_BENCH"       # in every process this script starts (and their children)
STATS_ENV = "PYTEST_NCCL_WATCH_STATS"     # where each watch writes its channel's counts at exit
PREFIX = "pytest-nccl-watch"              # the channel's keys (channel.py)
VERDICT_LINE = re.compile(r"; ending the job \(SIGTERM|^pytest-nccl watch: verdict", re.M)


# -- processes, by pid ------------------------------------------------------------------------------------

def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries this run's tag (the watches, the node processes)."""
    mark, found = f"{TAG_ENV}={tag}".encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    fields = proc_stat(int(name))
                    if fields is not None and fields[0] not in ("Z", "X"):
                        found.append(int(name))
        except OSError:
            continue
    return found


def children(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of the processes whose parent is ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat(int(name))
            if fields is not None and int(fields[1]) == pid:
                out.append((int(name), int(fields[19])))
    return out


def same_process(pid: int, start: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and int(fields[19]) == start and fields[0] not in ("Z", "X")


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass



# -- one run: N nodes, one scenario ----------------------------------------------------------------------

class Node:
    def __init__(self, index: int, proc: subprocess.Popen, log: str, summary: str | None):
        self.index, self.proc, self.log, self.summary = index, proc, log, summary
        self.verdict_at: float | None = None   # time.time() of its verdict line on stderr
        self.exited_at: float | None = None    # time.time() when it was seen ended
        self.read = 0
        self.rss_max = 0.0
        self.helpers: list[tuple[int, int]] = []  # (pid, start) of its guardian (and node process)

    def scan_log(self, now: float) -> None:
        if self.verdict_at is not None:
            return
        try:
            with open(self.log, "rb") as f:
                f.seek(self.read)
                data = f.read()
        except OSError:
            return
        cut = data.rfind(b"\n") + 1
        self.read += cut
        if VERDICT_LINE.search(data[:cut].decode(errors="replace")):
            self.verdict_at = now


class Run:
    """One job of ``n`` simulated nodes (``ranks`` each, ``rate`` collectives/s/rank) for ``scenario``,
    watched (one watch per node) or not (``baseline``)."""

    def __init__(self, args, root: str, n: int, ranks: int, rate: float, scenario: str, tag: str):
        self.args, self.n, self.ranks, self.rate, self.scenario, self.tag = args, n, ranks, rate, scenario, tag
        self.watched = scenario != "baseline"
        self.dir = tempfile.mkdtemp(prefix=f"{scenario}-n{n}-", dir=root)
        self.stats_dir = os.path.join(self.dir, "stats")
        os.makedirs(self.stats_dir)
        self.go = os.path.join(self.dir, "go.json")
        self.run_id = f"scale-{uuid.uuid4().hex[:8]}"
        self.nodes: list[Node] = []
        self.store = None
        self.probe: Probe | None = None
        self.stall_at = int(args.stall_after_s * rate) + 1 if scenario in ("slow", "shape") else 0
        self.channel_port: int | None = None   # the deciding watch's store, once announced
        self.channel = None                    # this script's client of it, while the watches start
        self.joined = 0

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_NCCL_WATCH", "TORCHELASTIC_"))}
        env.update({TAG_ENV: self.tag, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
            p for p in (self.args.package, os.environ.get("PYTHONPATH")) if p)})
        if self.watched:
            env[STATS_ENV] = self.stats_dir
        return env

    def launch(self, i: int, port: int, env: dict) -> None:
        py = self.args.python
        node_cmd = [py, NODE, "--node", str(i), "--nodes", str(self.n), "--ranks", str(self.ranks),
                    "--rate", str(self.rate), "--store", f"127.0.0.1:{port}", "--run-id", self.run_id,
                    "--go", self.go, "--scenario", "healthy" if self.scenario == "baseline" else self.scenario,
                    "--duration", str(self.args.healthy_s), "--stall-at", str(self.stall_at),
                    "--report", os.path.join(self.dir, f"node-{i}.json")]
        summary = None
        if self.watched:
            summary = os.path.join(self.dir, f"watch-{i}.json")
            cmd = [py, "-m", "pytest_nccl", "watch", "--timeout", str(self.args.timeout), "--json", summary,
                   "--", *node_cmd]
        else:
            node_dir = os.path.join(self.dir, f"jobdir-{i}")
            os.makedirs(node_dir)
            cmd = [*node_cmd, "--dir", node_dir]
        if self.args.debug and i == 0 and self.watched:  # the deciding watch's own timeline, in its log
            env = dict(env, PYTEST_NCCL_WATCH_DEBUG="1")
        log = os.path.join(self.dir, f"node-{i}.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=self.dir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes.append(Node(i, proc, log, summary))

    def start(self, limit: float, log) -> tuple[bool, float]:
        """Start the job's store, its probe and the nodes; for a watched job, until every watch joined
        the channel and published what its ranks wrote (``limit`` seconds at most). With
        ``--start-batch B`` the watches start as on a cluster, where each imports torch on a host of its
        own: rank 0's node first (its watch hosts the channel), then B at a time, each batch once the
        one before joined. (every watch joined and in sync, seconds it took)."""
        t0 = time.monotonic()
        self.store = tcp_store("127.0.0.1", 0, master=True)
        port = self.store.port
        env = self.env()
        self.probe = Probe("127.0.0.1", port, self.args.probe_hz)
        self.probe.start()
        batch = self.args.start_batch if self.watched else 0
        if batch <= 0:
            for i in range(self.n):
                self.launch(i, port, env)
            return self.await_joined(self.n, t0 + limit, synced=True), time.monotonic() - t0
        self.launch(0, port, env)
        for first in range(1, self.n, batch):
            if not self.await_joined(first, t0 + limit):
                log(f"    {self.scenario}: {first} watches did not join within {limit:.0f} s; starting the rest")
                batch = self.n
            for i in range(first, min(self.n, first + batch)):
                self.launch(i, port, env)
        return self.await_joined(self.n, t0 + limit, synced=True), time.monotonic() - t0

    def await_joined(self, count: int, deadline: float, synced: bool = False) -> bool:
        """Until ``count`` watches joined the channel (its ``watches`` counter) and, with ``synced``,
        every one but the deciding watch published what its ranks wrote (``synced``: the deciding
        watch counts itself there in some versions of the channel). Read through one client of the
        deciding watch's store, twice a second."""
        if not self.watched:
            return True
        job = f"{PREFIX}/{self.run_id}/0"
        while time.monotonic() < deadline:
            self.sample()
            if all(node.proc.poll() is not None for node in self.nodes):
                return False
            try:
                if self.channel is None and self.store.check([f"{job}/channel"]):
                    host, _, port = self.store.get(f"{job}/channel").decode().rpartition(":")
                    self.channel_port = int(port)
                    self.channel = tcp_store(host, int(port), master=False, timeout=10.0)
                if self.channel is not None:
                    self.joined = self.channel.add(f"{job}/watches", 0)
                    ready = self.joined >= count
                    if ready and synced:
                        ready = self.channel.add(f"{job}/synced", 0) >= count - 1
                    if ready:
                        if synced:
                            self.channel = None  # closed: nothing of this script stays on the channel
                        return True
            except Exception:  # a store slow to answer on a loaded host: read again
                self.channel = None
            time.sleep(0.5)
        self.channel = None
        return False

    def sample(self) -> None:
        """RSS of each watch; its guardian's and node process's pids (ended at cleanup if left)."""
        for node in self.nodes:
            if node.proc.poll() is None:
                node.rss_max = max(node.rss_max, rss_mb(node.proc.pid) or 0.0)
                if len(node.helpers) < (2 if self.watched else 0):
                    node.helpers = children(node.proc.pid)

    def go_now(self, delay: float = 1.0) -> float:
        start = time.time() + delay
        with open(self.go + ".tmp", "w") as f:
            json.dump({"start": start}, f)
        os.replace(self.go + ".tmp", self.go)
        return start

    def wait(self, until_wall: float) -> None:
        """Until every process exited (or ``until_wall``), noting each watch's verdict line."""
        next_sample = 0.0
        while time.time() < until_wall:
            now = time.time()
            if time.monotonic() >= next_sample:
                self.sample()
                next_sample = time.monotonic() + 1.0
            running = 0
            for node in self.nodes:
                if self.watched:
                    node.scan_log(now)
                if node.proc.poll() is None:
                    running += 1
                elif node.exited_at is None:
                    node.exited_at = now
                    if self.watched:
                        node.scan_log(now)
            if not running:
                return
            time.sleep(0.1)

    def close(self) -> None:
        """End whatever is left: each watch (it ends its node), then anything of this run by pid."""
        if self.probe is not None:
            self.probe.stop.set()
            self.probe.join(timeout=5)
        end_processes([node.proc for node in self.nodes], [h for node in self.nodes for h in node.helpers],
                      self.tag)
        self.store = None

    # -- what it found --------------------------------------------------------------------------------
    def node_reports(self) -> list[dict]:
        out = []
        for i in range(self.n):
            try:
                with open(os.path.join(self.dir, f"node-{i}.json")) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                out.append({})
        return out

    def summaries(self) -> list[dict | None]:
        out = []
        for node in self.nodes:
            try:
                with open(node.summary) as f:
                    out.append(json.load(f))
            except (OSError, ValueError, TypeError):
                out.append(None)
        return out

    def stats(self) -> dict[int, dict]:
        """node -> its watch's channel stats (the watch's pid names its file)."""
        by_pid = {node.proc.pid: node.index for node in self.nodes}
        out = {}
        for name in os.listdir(self.stats_dir):
            if name.endswith(".json"):
                try:
                    pid = int(name[:-5])
                    with open(os.path.join(self.stats_dir, name)) as f:
                        data = json.load(f)
                except (OSError, ValueError):
                    continue
                if pid in by_pid:
                    out[by_pid[pid]] = data
        return out

    def tail(self, node: int, lines: int = 15) -> str:
        try:
            with open(self.nodes[node].log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def end_processes(procs: list, helpers: list, tag: str) -> None:
    """SIGTERM to each live watch (it ends its job: SIGTERM, SIGKILL after 5 s), SIGKILL after 15 s;
    then the helpers noted (guardians: they end on their own once their watch is gone) and any
    process still carrying ``tag``, by pid."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill(p.pid, signal.SIGKILL)
            p.wait()
    deadline = time.monotonic() + 6   # a guardian whose watch was killed sweeps for 3 s
    while time.monotonic() < deadline and (any(same_process(*h) for h in helpers) or tagged(tag)):
        time.sleep(0.2)
    for pid, start in helpers:
        if same_process(pid, start):
            kill(pid, signal.SIGKILL)
    for pid in tagged(tag):
        kill(pid, signal.SIGKILL)

