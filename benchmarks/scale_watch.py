"""The watch at scale (issue 39, item 5): a job of N simulated nodes on this one host, each node under
its own real ``pytest-nccl watch`` process, with the real channel between the watches.

Each node is ``python -m pytest_nccl watch --timeout T --json FILE -- python benchmarks/scale_node.py``:
the node process (standard library only, no torch) plays R ranks of that node and writes, in the
watch's job directory, what a real rank writes there (``rank-R.json``, the tracer's journal at a
stated rate of all_reduces per second per rank, the exit record). This script hosts the job's store
(a ``torch.distributed.TCPStore``, standing in for torchrun's agent store at MASTER_ADDR:MASTER_PORT):
the watches find each other through it as on a real cluster (the watch of rank 0's node hosts the
channel's store and announces it there; ``pytest_nccl/watch/channel.py``).

Measured, per node count N (``--nodes 2,8,32,128``), R ranks per node at a rate of collectives per
second per rank (``--ranks``, default 8; ``--rate``, default 50: what this host keeps up with at 54
nodes; each row states both, and the nodes' "late ticks" say whether they kept up):
- store calls per node per second over the channel, for the deciding watch (rank 0's node) and for
  the others (median, max): from each watch's ``PYTEST_NCCL_WATCH_STATS`` file (``<pid>.json`` at
  its exit: calls, bytes_out, bytes_in, seconds, decides), so averaged over the watch's life, its
  start included; "n/a" when the watch writes none (a watch without that hook);
- bytes per node per second over the channel during the healthy run's collectives: the kernel's
  counts of each watch's connections to the channel's store (``ss -tinp``), and what that store
  (in the deciding watch's process) served;
- CPU seconds per second of the deciding watch and the others' median (utime + stime of the watch
  process, ``/proc/PID/stat``, over the healthy run's collectives);
- the job store's own set/get latency p50/p99: a probe client doing set + get at ``--probe-hz``
  (200) during the healthy run, watched and unwatched (the same node processes without watches);
- the time from the stall to the verdict (the watch's "ending the job" line on stderr, from the
  moment the last node wrote the stall's last journal line), and the verdict itself (``--json``:
  kind, headline, ranks, verdict) for (a) a slow rank: the last rank of the last node stops before
  collective #k while every other rank enters #k and waits; (b) a cross-node shape mismatch: that
  rank enters #k with another shape; and (c) a healthy run: every watch must exit 0, verdict false.
Goals printed against: per-node traffic flat in N; the verdict right, the same on every node and
within --timeout + 5 s; the job store's p99 unchanged within noise.

Run:  .venv/bin/python benchmarks/scale_watch.py [--nodes 2,8,32,128] [--ranks 8 | --ranks 2=8,32=2]
      [--rate 50 | --rate 2=500,128=50] [--timeout 10] [--healthy-s 20] [--stall-after-s 5]
      [--scenarios baseline,healthy,slow,shape] [--max-nodes N] [--start-batch 4] [--watch-from REV]
      [--json FILE] [--keep DIR]
Each N costs 4 runs (unwatched baseline, healthy, slow, shape): 1-2 minutes each at 2 and 8 nodes,
3-5 at 32 and more. A node count whose watches do not fit in memory (a watch's RSS, measured on a
first job of 2 nodes, against 60% of MemAvailable: about 250 MB a node, so about 50 nodes on 24 GiB)
runs at the largest count that fits, and its row says so (``--max-nodes`` caps it further). The
watches start as on a cluster, where each imports torch on a host of its own: rank 0's node first,
then ``--start-batch`` (4) at a time once the ones before joined the channel; ``--start-batch 0``
starts all at once (on this host, tens of watches importing torch together take longer than the
watch's connect wait, and some never join). ``--watch-from REV`` runs the watches from a commit's
``pytest_nccl`` (``git archive``), to measure one version while the working tree changes, or to
compare two. ``--keep DIR`` keeps each run's logs, ``--json`` files and stats. Ctrl-C (or SIGTERM)
ends every process it started, by pid; nothing outlives it, and its temporary directories go.

What one host cannot measure: the N watches, N node processes and the store share this host's
cores (2 here): from about 16 nodes on the host is oversubscribed (each watch takes about 3% of a
core while the job runs), so times (CPU per second, latency, time to the verdict) are of a
loaded host, not of a node of a cluster, and a starved watch ticks less often, so its traffic is
then a lower bound; read counts and bytes per node, and their growth with N. 128 nodes do not fit in
24 GiB. The network is loopback (no latency, no bandwidth limit) and every watch's store client is
on the deciding watch's host. The ranks are simulated: their agents do not answer (no stacks nor
Flight Recorder progress in the report), and their collectives are paced on the wall clock, not
synchronized by a real collective.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = os.path.join(REPO, "benchmarks", "scale_node.py")
TAG_ENV = "PYTEST_NCCL_SCALE_BENCH"       # in every process this script starts (and their children)
STATS_ENV = "PYTEST_NCCL_WATCH_STATS"     # where each watch writes its channel's counts at exit
PREFIX = "pytest-nccl-watch"              # the channel's keys (channel.py)
VERDICT_LINE = re.compile(r"; ending the job \(SIGTERM|^pytest-nccl watch: verdict", re.M)
CLK = os.sysconf("SC_CLK_TCK")
SCENARIOS = ("baseline", "healthy", "slow", "shape")
EXPECTED_KIND = {"slow": "slow-rank", "shape": "shape-mismatch"}


# -- processes ----------------------------------------------------------------------------------------

def _stat(pid: int) -> list | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of the process (every thread), seconds; None when it is gone."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLK


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries this run's tag (the watches, the node processes)."""
    mark, found = f"{TAG_ENV}={tag}".encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    fields = _stat(int(name))
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
            fields = _stat(int(name))
            if fields is not None and int(fields[1]) == pid:
                out.append((int(name), int(fields[19])))
    return out


def same_process(pid: int, start: int) -> bool:
    fields = _stat(pid)
    return fields is not None and int(fields[19]) == start and fields[0] not in ("Z", "X")


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def socket_bytes(port: int) -> dict:
    """The established TCP connections to or from ``port`` (the channel's store), from ``ss -tinp``:
    (pid, local, peer) -> (role, bytes sent, bytes received); role "client" for a watch's connection
    to the store, "server" for the store's end of one (in the deciding watch's process). The kernel
    counts every byte of the connection's payload: exact, whatever the store's protocol."""
    try:
        text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out, head = {}, None
    for line in text.splitlines():
        if line and not line[0].isspace():
            head = line.split()
            continue
        if head is None or len(head) < 5:
            continue
        local, peer = head[2], head[3]
        role = "server" if local.rsplit(":", 1)[-1] == str(port) else \
            "client" if peer.rsplit(":", 1)[-1] == str(port) else None
        counts = dict(re.findall(r"\b(bytes_sent|bytes_received):(\d+)", line))
        for pid in re.findall(r"pid=(\d+)", " ".join(head[4:])):
            if role:
                out[(int(pid), local, peer)] = (role, int(counts.get("bytes_sent", 0)),
                                                int(counts.get("bytes_received", 0)))
        head = None
    return out


def traffic(before: dict, after: dict) -> dict:
    """pid -> {role: [bytes sent, bytes received]} between two ``socket_bytes`` (a connection
    opened since counts from 0; one closed since is lost)."""
    out: dict = {}
    for key, (role, sent, received) in after.items():
        _, sent0, received0 = before.get(key, (role, 0, 0))
        mine = out.setdefault(key[0], {}).setdefault(role, [0, 0])
        mine[0] += max(0, sent - sent0)
        mine[1] += max(0, received - received0)
    return out


# -- the job store and its probe ------------------------------------------------------------------------

def tcp_store(host: str, port: int, master: bool, timeout: float = 30.0):
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=master, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout))


class Probe(threading.Thread):
    """A client of the job's store doing set + get ``hz`` times a second; latencies recorded while
    ``recording`` is set (seconds)."""

    def __init__(self, host: str, port: int, hz: float):
        super().__init__(name="store-probe", daemon=True)
        self.client = tcp_store(host, port, master=False)
        self.period = 1.0 / hz
        self.sets: list[float] = []
        self.gets: list[float] = []
        self.errors = 0
        self.recording = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        value = b"x" * 64
        next_at = time.monotonic()
        i = 0
        while not self.stop.is_set():
            key = f"probe/{i % 16}"
            i += 1
            try:
                t0 = time.perf_counter()
                self.client.set(key, value)
                t1 = time.perf_counter()
                self.client.get(key)
                t2 = time.perf_counter()
            except Exception:  # the store's error type differs by torch version
                self.errors += 1
                t0 = t1 = t2 = None
            if self.recording.is_set() and t0 is not None:
                self.sets.append(t1 - t0)
                self.gets.append(t2 - t1)
            next_at += self.period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()

    def summary(self) -> dict:
        def pct(values: list, q: float) -> float | None:
            if not values:
                return None
            s = sorted(values)
            return round(s[min(len(s) - 1, int(q * len(s)))] * 1e3, 3)
        return {"samples": len(self.sets), "errors": self.errors,
                "set_p50_ms": pct(self.sets, 0.5), "set_p99_ms": pct(self.sets, 0.99),
                "get_p50_ms": pct(self.gets, 0.5), "get_p99_ms": pct(self.gets, 0.99)}


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


# -- measurements of one run ------------------------------------------------------------------------------

def median(values: list) -> float | None:
    return statistics.median(values) if values else None


def channel_rates(run: Run) -> dict:
    """Per node per second: store calls and bytes (out + in), deciding watch and the others."""
    stats = run.stats()
    if not stats:
        return {"available": False}
    def rate(s: dict, what: str) -> float | None:
        seconds = s.get("seconds") or 0
        return (s.get(what, 0) / seconds) if seconds > 0 else None
    rows = {i: {"calls_s": rate(s, "calls"), "bytes_out_s": rate(s, "bytes_out"), "bytes_in_s": rate(s, "bytes_in"),
                "seconds": s.get("seconds"), "decides": bool(s.get("decides"))} for i, s in stats.items()}
    for r in rows.values():
        r["bytes_s"] = (r["bytes_out_s"] or 0) + (r["bytes_in_s"] or 0) if r["bytes_out_s"] is not None else None
    deciding = next((r for r in rows.values() if r["decides"]), rows.get(0))
    others = [r for r in rows.values() if r is not deciding]
    def agg(key: str) -> dict:
        values = [r[key] for r in others if r[key] is not None]
        return {"median": median(values), "max": max(values) if values else None}
    return {"available": True, "watches_reporting": len(rows), "deciding": deciding,
            "others": {k: agg(k) for k in ("calls_s", "bytes_s", "bytes_out_s", "bytes_in_s")}, "per_node": rows}


def window_rates(run: Run, moved: dict, span: float) -> dict:
    """Bytes per second over the channel in the healthy run's window, per node (``ss``): each watch's
    own connections to the store (sent + received), and what the store served (the deciding watch's
    process hosts it)."""
    per_node = {}
    for node in run.nodes:
        mine = moved.get(node.proc.pid, {})
        client = sum(mine.get("client", [0, 0]))
        per_node[node.index] = {"bytes_s": client / span, "sent_s": mine.get("client", [0, 0])[0] / span,
                                "received_s": mine.get("client", [0, 0])[1] / span}
        if "server" in mine:
            per_node[node.index]["store_serves_bytes_s"] = sum(mine["server"]) / span
    others = [v["bytes_s"] for i, v in per_node.items() if i]
    return {"seconds": round(span, 2), "deciding": per_node.get(0, {}),
            "others": {"median": median(others), "max": max(others, default=None)}, "per_node": per_node}


def run_one(args, root: str, n: int, ranks: int, rate: float, scenario: str, tag: str, log) -> dict:
    run = Run(args, root, n, ranks, rate, scenario, tag)
    out: dict = {"scenario": scenario, "nodes": n, "ranks_per_node": ranks, "rate": rate}
    t_begin = time.monotonic()
    try:
        ready, waited = run.start(args.sync_wait + 3.0 * n, log)
        out["watches_in_sync"], out["start_s"], out["watches_joined"] = ready, round(waited, 1), run.joined
        if not ready:
            log(f"    {scenario}: the watches not all joined and in sync after {waited:.0f} s "
                f"({run.joined} of {n} joined); going on")
        start = run.go_now()
        if scenario in ("baseline", "healthy"):
            while time.time() < start:
                time.sleep(0.01)
            run.probe.recording.set()
            cpu0 = {node.index: cpu_seconds(node.proc.pid) for node in run.nodes}
            net0 = socket_bytes(run.channel_port) if run.channel_port else {}
            t_cpu0 = time.monotonic()
            time.sleep(max(0.0, args.healthy_s - 0.3))   # the collectives' window, less the ends
            cpu1 = {node.index: cpu_seconds(node.proc.pid) for node in run.nodes}
            net1 = socket_bytes(run.channel_port) if run.channel_port else {}
            span = time.monotonic() - t_cpu0
            if run.channel_port:
                out["window"] = window_rates(run, traffic(net0, net1), span)
            run.probe.recording.clear()
            out["store"] = run.probe.summary()
            cpu = {i: (cpu1[i] - cpu0[i]) / span for i in cpu0 if cpu0[i] is not None and cpu1[i] is not None}
            out["cpu_per_s"] = {"deciding": cpu.get(0), "others_median": median([v for i, v in cpu.items() if i]),
                                "others_max": max([v for i, v in cpu.items() if i], default=None),
                                "what": "watch processes" if run.watched else "node processes"}
            run.wait(time.time() + args.exit_wait + 0.5 * n)
            ended = start + args.healthy_s   # the node processes' last lines and exit records
            exits = [node.exited_at - ended for node in run.nodes if node.exited_at is not None]
            out["exit_after_job_s"] = {"deciding": _round(run.nodes[0].exited_at - ended)
                                       if run.nodes[0].exited_at is not None else None,
                                       "median": _round(median(exits)), "max": _round(max(exits, default=None))}
        else:
            run.wait(start + args.stall_after_s + args.verdict_wait + args.exit_wait)
        out["wall_s"] = round(time.monotonic() - t_begin, 1)
    finally:
        run.close()
    reports = run.node_reports()
    out["node_late_ticks_max"] = max((r.get("late_ticks", 0) for r in reports), default=0)
    out["collectives"] = max((r.get("collectives", 0) for r in reports), default=0)
    codes = [node.proc.returncode for node in run.nodes]
    out["exit_codes"] = codes
    out["rss_mb"] = {"deciding": round(run.nodes[0].rss_max, 1),
                     "max": round(max(node.rss_max for node in run.nodes), 1)}
    if not run.watched:
        out["ok"] = all(c == 0 for c in codes)
        _cleanup_dir(run, args)
        return out
    out["channel"] = channel_rates(run)
    summaries = run.summaries()
    first = summaries[0] or {}
    out["verdict"] = {k: first.get(k) for k in ("verdict", "kind", "headline", "ranks", "exit_code")}
    out["verdicts_agree"] = None not in summaries and len({s.get("headline") for s in summaries}) == 1
    out["kinds"] = {str(k): v for k, v in Counter((s or {}).get("kind") for s in summaries).items()}
    out["summaries_missing"] = sum(s is None for s in summaries)
    last_rank = n * ranks - 1
    if scenario == "healthy":
        out["ok"] = all(c == 0 for c in codes) and all(s is not None and s.get("verdict") is False for s in summaries)
        bad = [i for i, (c, s) in enumerate(zip(codes, summaries, strict=True)) if c != 0 or not s or s.get("verdict")]
        out["bad_nodes"] = bad
        for i in bad[:2]:
            log(f"    healthy: node {i} exit {codes[i]}, verdict {(summaries[i] or {}).get('headline')!r}\n"
                + _indent(run.tail(i)))
    else:
        stalled = [r.get("stalled_at") for r in reports if r.get("stalled_at")]
        stall = max(stalled) if stalled else None
        out["stall_written_by_nodes"] = len(stalled)
        times = {node.index: node.verdict_at - stall for node in run.nodes
                 if node.verdict_at is not None and stall is not None}
        out["to_verdict_s"] = {"deciding": _round(times.get(0)),
                               "others_median": _round(median([t for i, t in times.items() if i])),
                               "others_max": _round(max([t for i, t in times.items() if i], default=None)),
                               "watches_with_verdict": len(times)}
        right = (first.get("verdict") is True and first.get("kind") == EXPECTED_KIND[scenario]
                 and last_rank in (first.get("ranks") or []))
        if scenario == "slow":
            right = right and first.get("ranks") == [last_rank]
        in_time = times.get(0) is not None and times[0] <= args.timeout + 5.0
        out["expected"] = {"kind": EXPECTED_KIND[scenario], "ranks": [last_rank], "collective": run.stall_at}
        out["right"], out["in_time"] = right, in_time
        out["all_exit_3"] = all(c == 3 for c in codes)
        out["ok"] = right and in_time and out["verdicts_agree"] and out["all_exit_3"]
        if not right:
            log(f"    {scenario}: deciding watch: exit {codes[0]}, {first.get('kind')} {first.get('ranks')}: "
                f"{first.get('headline')!r}\n" + _indent(run.tail(0)))
        if not out["verdicts_agree"]:
            log(f"    {scenario}: the watches' verdicts differ: {out['kinds']} (exit codes "
                f"{dict(Counter(codes))}); node {n - 1}: {(summaries[-1] or {}).get('headline')!r}")
    _cleanup_dir(run, args)
    return out


def _cleanup_dir(run: Run, args) -> None:
    if args.keep:
        dest = os.path.join(args.keep, os.path.basename(run.dir))
        shutil.copytree(run.dir, dest, ignore=shutil.ignore_patterns("jobdir-*"), dirs_exist_ok=True)
    shutil.rmtree(run.dir, ignore_errors=True)


def _round(value, digits: int = 1):
    return None if value is None else round(value, digits)


def _indent(text: str) -> str:
    return "".join(f"      | {line}\n" for line in text.rstrip("\n").splitlines())


def package(args, root: str) -> tuple[str, str]:
    """(the directory the watches import pytest_nccl from, what code that is)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", REPO, *argv], capture_output=True, text=True).stdout.strip()
    if not args.watch_from:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "pytest_nccl")
        return REPO, f"the working tree at {git('rev-parse', '--short', 'HEAD')}" + (
            " (with uncommitted changes to pytest_nccl)" if dirty else "")
    commit = git("rev-parse", "--verify", f"{args.watch_from}^{{commit}}")
    if not commit:
        raise SystemExit(f"scale_watch: --watch-from {args.watch_from}: no such commit")
    into = os.path.join(root, "package")
    os.makedirs(into)
    archive = subprocess.Popen(["git", "-C", REPO, "archive", commit, "pytest_nccl"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", into], stdin=archive.stdout, check=True)
    archive.wait()
    return into, f"commit {commit[:10]} ({git('log', '-1', '--format=%s', commit)[:70]})"


# -- sizing: how many nodes fit ------------------------------------------------------------------------

def per_node_mb(calibration: dict | None) -> float | None:
    """Memory one simulated node takes: its watch (the largest seen), guardian and node process."""
    if not calibration:
        return None
    return calibration["watch_rss_mb"] + calibration["helpers_mb"]


def calibrate(args, root: str, tag: str, log) -> dict:
    """One watched job of 2 nodes, 1 rank each, a few seconds: each watch's RSS once its channel is up."""
    saved = args.healthy_s
    args.healthy_s = 4.0
    run = Run(args, root, 2, 1, 10.0, "healthy", tag)
    try:
        run.start(args.sync_wait, log)
        run.go_now(0.2)
        time.sleep(3.0)
        run.sample()
        helpers_mb = 0.0
        for pid, _ in run.nodes[0].helpers:
            helpers_mb += rss_mb(pid) or 0.0
        run.wait(time.time() + args.exit_wait)
        watch = max(node.rss_max for node in run.nodes)
    finally:
        run.close()
        shutil.rmtree(run.dir, ignore_errors=True)
        args.healthy_s = saved
    out = {"watch_rss_mb": round(watch, 1), "helpers_mb": round(max(helpers_mb, 20.0), 1)}
    log(f"  one watch: {out['watch_rss_mb']:.0f} MB RSS (its guardian and node process: {out['helpers_mb']:.0f} MB); "
        f"MemAvailable {mem_available_mb():.0f} MB")
    return out


def fitting(n: int, calibration: dict | None, max_nodes: int | None) -> int:
    fit = n
    each = per_node_mb(calibration)
    if each:
        fit = min(fit, max(2, int(0.6 * mem_available_mb() / each)))
    if max_nodes:
        fit = min(fit, max_nodes)
    return fit


# -- the table ------------------------------------------------------------------------------------------------

def by_n(text: str, kind, name: str) -> dict:
    """"8" (every N) or "2=8,32=2" (per N; an N not named takes the value of the largest N named below
    it, else the smallest named)."""
    text = text.strip()
    if "=" not in text:
        return {None: kind(text)}
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        try:
            out[int(key)] = kind(value)
        except ValueError:
            raise SystemExit(f"scale_watch: --{name}: {item!r} is not N=VALUE") from None
    return out


def pick(table: dict, n: int):
    if None in table:
        return table[None]
    below = [k for k in table if k <= n]
    return table[max(below)] if below else table[min(table)]


def fmt(value, spec: str = ".0f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def row_cells(row: dict) -> list[str]:
    runs = row["runs"]
    healthy, base = runs.get("healthy", {}), runs.get("baseline", {})
    ch, win = healthy.get("channel", {}), healthy.get("window")
    cells = [f"{row['asked']}" + (f"->{row['nodes']}" if row["nodes"] != row["asked"] else ""),
             str(row["ranks"]), fmt(row["rate"], "g")]
    if ch.get("available"):
        d, o = ch["deciding"] or {}, ch["others"]["calls_s"]
        cells += [fmt(d.get("calls_s")), f"{fmt(o['median'])}/{fmt(o['max'])}"]
    else:
        cells += ["n/a", "n/a"]
    if win:
        d, o = win["deciding"], win["others"]
        cells += [fmt(_kb(d.get("bytes_s")), ".1f"), f"{fmt(_kb(o['median']), '.1f')}/{fmt(_kb(o['max']), '.1f')}",
                  fmt(_kb(d.get("store_serves_bytes_s")), ".1f")]
    else:
        cells += ["n/a"] * 3
    cpu = healthy.get("cpu_per_s", {})
    cells += [fmt(cpu.get("deciding"), ".3f"), fmt(cpu.get("others_median"), ".3f")]
    s0, s1 = base.get("store", {}), healthy.get("store", {})
    cells += [f"{fmt(s0.get('set_p50_ms'), '.2f')}/{fmt(s0.get('set_p99_ms'), '.2f')}",
              f"{fmt(s1.get('set_p50_ms'), '.2f')}/{fmt(s1.get('set_p99_ms'), '.2f')}",
              f"{fmt(s0.get('get_p99_ms'), '.2f')}->{fmt(s1.get('get_p99_ms'), '.2f')}"]
    if "healthy" in runs:
        bad = healthy.get("bad_nodes", [])
        cells.append("ok" if healthy.get("ok") else f"FAIL({len(bad)})")
    else:
        cells.append("-")
    for scenario in ("slow", "shape"):
        r = runs.get(scenario)
        if r is None:
            cells.append("-")
            continue
        v = r.get("verdict", {})
        t = r.get("to_verdict_s", {}).get("deciding")
        mark = "ok" if r.get("ok") else ("WRONG" if not r.get("right") else "LATE" if not r.get("in_time") else "FAIL")
        cells.append(f"{v.get('kind') or 'none'} {v.get('ranks') or ''} {fmt(t, '.1f')}s {mark}")
    return cells


def _kb(value):
    return None if value is None else value / 1e3


HEADER = ["nodes", "R", "rate", "calls/s dec", "calls/s oth med/max", "kB/s dec", "kB/s oth med/max",
          "store kB/s", "CPU dec", "CPU oth", "job store set p50/p99 ms: unwatched", "watched", "get p99 ms",
          "healthy", "slow rank: verdict, s", "shape mismatch: verdict, s"]
LEGEND = """\
  nodes: asked->run (what fits); R: ranks per node; rate: collectives/s per rank
  calls/s: store calls per second of the watch's channel life (its PYTEST_NCCL_WATCH_STATS file; n/a: none
    written), deciding watch (dec) and the others (oth, median/max)
  kB/s: bytes sent + received on the watch's connections to the channel's store during the healthy run's
    collectives (ss, the kernel's counts); store kB/s: what the deciding watch's store served (every node)
  CPU: the watch process's CPU seconds per second during the healthy run's collectives
  job store: the probe's set and get latency on the job's own store, unwatched run vs watched run
  healthy: every watch exit 0 with verdict false; verdicts: the deciding watch's --json kind and ranks,
    seconds from the stall's last journal line to its "ending the job" line; ok = right, the same on every
    node, every watch exit 3, within --timeout + 5 s"""


def print_table(rows: list, out=sys.stdout) -> None:
    table = [HEADER] + [row_cells(r) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    print(LEGEND, file=out)


def _growth(rows: list, value) -> tuple | None:
    """(first N, last N, ratio of ``value`` between them) over the rows that have it."""
    have = [(r["nodes"], value(r)) for r in rows]
    have = [(n, v) for n, v in have if v]
    if len(have) < 2 or have[0][0] == have[-1][0]:
        return None
    return have[0][0], have[-1][0], have[-1][1] / have[0][1]


def goals(rows: list, args) -> list[str]:
    out = []
    def others(r, key, field):
        src = r["runs"].get("healthy", {}).get(key) or {}
        if key == "channel":
            return src.get("others", {}).get("calls_s", {}).get("median") if src.get("available") else None
        return src.get("others", {}).get(field)
    calls = _growth(rows, lambda r: others(r, "channel", None))
    moved = _growth(rows, lambda r: others(r, "window", "median"))
    if calls or moved:
        parts, met = [], True
        for what, g in (("store calls/s (life)", calls), ("bytes/s (window)", moved)):
            if g:
                parts.append(f"{what} x{g[2]:.1f} from {g[0]} to {g[1]} nodes (nodes x{g[1] / g[0]:g})")
                met = met and g[2] < 1.5
        out.append(f"per-node traffic flat in N (a non-deciding watch, median; flat: < 1.5x): "
                   f"{'MET' if met else 'NOT MET'}: " + "; ".join(parts))
    else:
        out.append("per-node traffic flat in N: n/a (fewer than two node counts with a measured channel)")
    for scenario, what in (("slow", "slow rank"), ("shape", "cross-node shape mismatch")):
        cases = [(r["nodes"], r["runs"][scenario]) for r in rows if scenario in r["runs"]]
        if not cases:
            continue
        bad = [f"{n} nodes: {c.get('verdict', {}).get('kind')} {c.get('verdict', {}).get('ranks')} in "
               f"{fmt(c.get('to_verdict_s', {}).get('deciding'), '.1f')} s"
               f"{'' if c.get('verdicts_agree') else ', the watches disagree'}"
               f"{'' if c.get('all_exit_3') else ', exit codes ' + str(sorted(set(c.get('exit_codes', []))))}"
               for n, c in cases if not c.get("ok")]
        out.append(f"{what}: verdict right and within --timeout + 5 s ({args.timeout + 5:g} s), the same on "
                   f"every node: {'MET' if not bad else 'NOT MET: ' + '; '.join(bad)}")
    cases = [(r["nodes"], r["runs"]["healthy"]) for r in rows if "healthy" in r["runs"]]
    if cases:
        bad = [f"{n} nodes: {len(c.get('bad_nodes', []))} watches not exit 0 or with a verdict"
               for n, c in cases if not c.get("ok")]
        out.append("healthy run: every watch exit 0, verdict false: "
                   + ("MET" if not bad else "NOT MET: " + "; ".join(bad)))
    pairs = [(r["nodes"], r["runs"]["baseline"].get("store", {}), r["runs"]["healthy"].get("store", {}))
             for r in rows if "baseline" in r["runs"] and "healthy" in r["runs"]]
    if pairs:
        parts, met = [], True
        for n, b, w in pairs:
            for op in ("set", "get"):
                p0, p1 = b.get(f"{op}_p99_ms"), w.get(f"{op}_p99_ms")
                if p0 is None or p1 is None:
                    met = False
                    continue
                # within noise: at most 1.5x, or 1 ms more (a loaded host's scheduler quantum)
                if p1 > max(1.5 * p0, p0 + 1.0):
                    met = False
                parts.append(f"{n} nodes {op} {p0:.2f}->{p1:.2f} ms")
        out.append(f"job store p99 unchanged within noise (<= 1.5x or +1 ms): {'MET' if met else 'NOT MET'}: "
                   + ", ".join(parts))
    return out


# -- main -------------------------------------------------------------------------------------------------------

def parse(argv: list | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="2,8,32,128", help="node counts, comma-separated (default 2,8,32,128)")
    p.add_argument("--ranks", default="8", help="ranks per node: 8, or per node count: 2=8,32=2,128=1")
    p.add_argument("--rate", default="50", help="collectives per second per rank: 50, or per node count: 2=500,32=50")
    p.add_argument("--timeout", type=float, default=10.0, help="the watches' --timeout (default 10)")
    p.add_argument("--healthy-s", type=float, default=20.0, help="seconds of collectives in a healthy run (20)")
    p.add_argument("--stall-after-s", type=float, default=5.0, help="seconds of collectives before the stall (5)")
    p.add_argument("--probe-hz", type=float, default=200.0, help="set + get pairs per second on the job's store")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {','.join(SCENARIOS)}")
    p.add_argument("--max-nodes", type=int, help="run at most this many nodes (else: as many as fit in memory)")
    p.add_argument("--sync-wait", type=float, default=60.0,
                   help="how long the watches may take to reach the channel before the job starts, plus 2 s a node")
    p.add_argument("--verdict-wait", type=float, default=120.0,
                   help="slow, shape: how long after the stall the watches may take to give their verdict (120)")
    p.add_argument("--exit-wait", type=float, default=30.0,
                   help="how long the watches may take to exit, plus 0.5 s a node")
    p.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python") if os.path.exists(
        os.path.join(REPO, ".venv", "bin", "python")) else sys.executable, help="the interpreter of the watches")
    p.add_argument("--start-batch", type=int, default=4,
                   help="start the watches as on a cluster: rank 0's node first, then this many at a time, "
                        "each batch once the one before joined the channel (0: all at once; default 4)")
    p.add_argument("--watch-from", metavar="REV",
                   help="run the watches from this commit's pytest_nccl (git archive), not the working tree")
    p.add_argument("--debug", action="store_true",
                   help="the deciding watch writes its timeline (PYTEST_NCCL_WATCH_DEBUG) in its log (--keep)")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--keep", help="keep each run's logs, --json files and stats in this directory")
    args = p.parse_args(argv)
    args.node_counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    args.ranks_by = by_n(args.ranks, int, "ranks")
    args.rate_by = by_n(args.rate, float, "rate")
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    unknown = set(args.scenario_list) - set(SCENARIOS)
    if unknown or any(n < 2 for n in args.node_counts):
        p.error(f"unknown scenarios {sorted(unknown)}" if unknown else "a job has at least 2 nodes")
    return args


def main(argv: list | None = None) -> int:
    args = parse(argv)
    tag = uuid.uuid4().hex
    root = tempfile.mkdtemp(prefix="scale-watch-")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def on_signal(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    rows: list = []
    result = {"host": {"cores": os.cpu_count(), "mem_available_mb": round(mem_available_mb()),
                       "load": os.getloadavg()}, "args": {k: v for k, v in vars(args).items()
                                                        if k not in ("ranks_by", "rate_by")}, "rows": rows}
    code = 0
    try:
        args.package, result["watch_code"] = package(args, root)
        log(f"scale_watch: the watches run {result['watch_code']}")
        log(f"scale_watch: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; --timeout {args.timeout:g} s; "
            f"scenarios {','.join(args.scenario_list)}")
        calibration = calibrate(args, root, tag, log) if any(s != "baseline" for s in args.scenario_list) else None
        result["calibration"] = calibration
        for asked in args.node_counts:
            n = fitting(asked, calibration, args.max_nodes)
            ranks, rate = pick(args.ranks_by, asked), pick(args.rate_by, asked)
            log(f"{asked} nodes" + (f" (running {n}: what fits)" if n != asked else "") +
                f", {ranks} ranks each, {rate:g} collectives/s per rank")
            row = {"asked": asked, "nodes": n, "ranks": ranks, "rate": rate, "runs": {}}
            rows.append(row)
            for scenario in args.scenario_list:
                t0 = time.monotonic()
                r = run_one(args, root, n, ranks, rate, scenario, tag, log)
                row["runs"][scenario] = r
                log(f"  {scenario}: {'ok' if r.get('ok') else 'NOT ok'} ({time.monotonic() - t0:.0f} s, of them "
                    f"{r.get('start_s', 0):.0f} s to start the watches and reach the channel; load "
                    f"{os.getloadavg()[0]:.1f}; nodes' late ticks max {r.get('node_late_ticks_max')})")
        print()
        print(f"pytest-nccl watch at scale: simulated nodes on one host ({os.cpu_count()} cores), --timeout "
              f"{args.timeout:g} s, healthy run {args.healthy_s:g} s; the watches: {result['watch_code']}, started "
              + (f"{args.start_batch} at a time" if args.start_batch > 0 else "all at once"))
        print_table(rows)
        print()
        for line in goals(rows, args):
            print(f"goal: {line}")
        result["goals"] = goals(rows, args)
    except KeyboardInterrupt:
        log("scale_watch: interrupted; ending every process it started")
        code = 130
    finally:
        left = tagged(tag)
        for pid in left:
            kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1, default=str)
    return code


if __name__ == "__main__":
    sys.exit(main())
