"""What ``scale_watch.py`` measures of a job (the command, its options and its results: that script's
docstring): the CPU and memory of a process (``/proc``), the bytes on the channel's connections (the
kernel's counts, ``ss -tinp``), the job store's latency (a probe client doing set + get), and each
watch's channel counts (its ``PYTEST_NCCL_WATCH_STATS`` file) as rates per node per second.
"""

from __future__ import annotations

import datetime
import os
import re
import statistics
import subprocess
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scale_run import Run

CLK = os.sysconf("SC_CLK_TCK")


# -- processes: /proc, and the channel's connections (ss) ----------------------------------------------

def proc_stat(pid: int) -> list | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state first); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of the process (every thread), seconds; None when it is gone."""
    fields = proc_stat(pid)
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


# -- a run's channel, per node per second ---------------------------------------------------------------

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

