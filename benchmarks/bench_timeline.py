"""A pytest plugin (``-p bench_timeline``, with benchmarks/ on PYTHONPATH) that writes to stderr, at
exit, when each stage of a pytest-nccl session happened, in seconds since the process started:
pytest's hooks, the fork server's start and readiness, the group's start (fork + join), the call,
the teardown. bench_cold.py --timeline runs it; it wraps the plugin's internals where it finds them
and skips what it does not find, so it changes nothing the session does. With
BENCH_TIMELINE_GC_FREEZE=1 in the environment it calls gc.freeze() once collection is done: an
experiment (what that would save pytest's two gc.collect() passes at exit and the interpreter's
own final collection, with torch's ~175,000 objects loaded).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time

import pytest

_EVENTS: list[tuple[float, str]] = []


def _process_start() -> float:
    """Wall-clock time at which this process started (from /proc, to a clock tick)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


T0 = _process_start()


def mark(what: str) -> None:
    _EVENTS.append((time.time() - T0, what))


mark(f"bench_timeline loaded (torch {'already' if 'torch' in sys.modules else 'not yet'} imported)")


def _wrap(owner, name: str, label: str, note=None) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        extra = note(*args, **kwargs) if note else ""
        mark(f"{label} begins{extra}")
        try:
            return original(*args, **kwargs)
        finally:
            mark(f"{label} ends")

    setattr(owner, name, wrapper)


def _ready_note(zygote, *args, **kwargs) -> str:
    try:
        if getattr(zygote, "info", None) is not None:
            return " (already known)"
        return " (its answer already waiting)" if zygote.conn.poll(0) else " (waits for it)"
    except Exception:
        return ""


def _instrument() -> None:
    from pytest_nccl.forked import group, pool, zygote_client
    _wrap(zygote_client.Zygote, "__init__", "fork server: Popen")
    _wrap(zygote_client.Zygote, "ready", "fork server: ready()", _ready_note)
    _wrap(zygote_client.Zygote, "import_modules", "fork server: import_modules()")
    _wrap(zygote_client.Zygote, "settle_imports", "fork server: imports answered")
    _wrap(group.RankGroup, "start", "group start (fork + join)")
    _wrap(group.RankGroup, "run", "call")
    _wrap(group.RankGroup, "kill", "group kill")
    _wrap(zygote_client.Zygote, "close", "fork server: close")
    _wrap(pool.GroupPool, "close", "pool close")


def _report() -> None:
    mark("atexit")
    lines = [f"[timeline] +{t:7.3f} s  {what}" for t, what in _EVENTS]
    os.write(2, ("\n".join(lines) + "\n").encode())


atexit.register(_report)
_instrument()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    mark(f"pytest_configure (torch {'imported' if 'torch' in sys.modules else 'not imported'})")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    mark("collection begins")
    yield
    mark(f"collection ends (torch {'imported' if 'torch' in sys.modules else 'not imported'})")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_finish(session):
    yield
    mark("pytest_collection_finish done (the fork server is started by now)")
    if os.environ.get("BENCH_TIMELINE_GC_FREEZE"):  # an experiment: what gc.freeze() here would save
        import gc
        gc.freeze()
        mark("gc.freeze() done")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    mark(f"test {item.name}: begins")
    yield
    mark(f"test {item.name}: ends")


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session, exitstatus):
    mark("sessionfinish begins")
    yield
    mark("sessionfinish ends")


@pytest.hookimpl(hookwrapper=True)
def pytest_unconfigure(config):
    mark("unconfigure begins")
    yield
    mark("unconfigure ends")
