"""The views of a failed call (docs/views.md): ``<name>.trace.json`` (Chrome trace events, checked
against the format), ``<name>.html`` (the swimlane page, rendered by headless Chromium when one is
installed), and the gate report's links to them. Pure parts on hand-written data; one real inner
session for the files as --nccl-trace-dir writes them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from collective_records import record
from conftest import run_inner_once

from pytest_nccl.core.diagnosis import diagnose
from pytest_nccl.core.records import CollectiveRecord, RankView
from pytest_nccl.core.states import RankState
from pytest_nccl.views import gate
from pytest_nccl.views.swimlane import page_data, swimlane_html
from pytest_nccl.views.timeline import timeline_json, trace_events

RENDER_BOUND_MS = 2000  # the page must draw 64 ranks x 10,000 collectives within this (docs/views.md)

# -- the trace-event format ------------------------------------------------------------------------

PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f"}


def check_trace_events(data: dict, world: int) -> list[dict]:
    """Structure of the JSON Object Format of Chrome's trace events, as Perfetto and chrome://tracing
    read it; returns the collective slices."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    assert data.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = data["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(threads.values(), key=lambda n: int(n.split()[1])) == [f"rank {r}" for r in range(world)]
    assert processes and all(name.startswith("node ") for name in processes.values())
    open_slices: dict = {}
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["pid"] > 0 and e["tid"] > 0, e
        assert e["pid"] in processes, e
        assert isinstance(e["name"], str) and e["name"], e
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] in ("X", "B", "E") or (e["ph"] == "i" and e.get("s", "t") == "t"):
            assert (e["pid"], e["tid"]) in threads, f"no rank track for {e}"
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        elif e["ph"] == "B":
            open_slices.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e["ph"] == "E":
            assert open_slices.get((e["pid"], e["tid"])), f"E without B: {e}"
            open_slices[(e["pid"], e["tid"])].pop()
        elif e["ph"] in ("i", "I"):
            assert e.get("s", "t") in ("g", "p", "t"), e
    assert not any(open_slices.values()), "B without E"
    flows: dict = {}
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            flows.setdefault((e.get("cat"), e["id"]), []).append(e["ph"])
    for phases in flows.values():
        assert phases[0] == "s" and phases[-1] == "f" and phases.count("s") == phases.count("f") == 1, phases
    verdicts = [e for e in events if e["ph"] == "i" and e.get("s") == "g"]
    assert len(verdicts) == 1 and verdicts[0]["args"]["headline"] == data["otherData"]["headline"]
    slices = [e for e in events if e["ph"] == "X"]
    for s in slices:
        assert re.fullmatch(r"\S+ #\d+ \S+", s["name"]), s["name"]
        assert {"group", "seq", "state"} <= set(s["args"]), s
    return slices


# -- hand-written calls --------------------------------------------------------------------------------

def rec(rank, seq, op="all_reduce", shapes="[4]", state="completed", t=0.0, dur=0.001, pg="default", **kw):
    return record(rank, seq, op, shapes, state, pg, dtype="torch.float32", site="test_x.py:12 <- test_x.py:30",
                  t=t, duration=dur if state == "completed" else None, **kw)


def shape_mismatch_call():
    """Rank 1 all_reduces [5] at #3 and dies; ranks 0 and 2 wait there; rank 3 never gets there."""
    ranks = []
    for r in range(4):
        recs = [rec(r, 1, t=0.010), rec(r, 2, "broadcast", "[2]", t=0.020)]
        if r != 3:
            recs.append(rec(r, 3, shapes="[5]" if r == 1 else "[4]", state="entered", t=0.030 + r / 1000))
        status = {1: RankState.DEAD, 3: RankState.RUNNING}.get(r, RankState.RUNNING)
        ranks.append(RankView(r, status, recs, stack='Thread MainThread:\n  File "test_x.py", line 12, in t',
                              exit_code=None, signal_name="SIGABRT" if r == 1 else None,
                              finished_at=0.050 if r == 1 else None))
    return ranks, diagnose(ranks, "decided", 10.0)


def test_trace_events_follow_the_format_and_mark_the_divergence():
    ranks, diag = shape_mismatch_call()
    assert diag.kind == "shape-mismatch" and (diag.pg, diag.seq) == ("default", 3)
    data = json.loads(timeline_json("test_x.py::t", ranks, diag, 0.5, 10.0, "gloo"))
    slices = check_trace_events(data, 4)
    assert len(slices) == sum(len(v.records) for v in ranks)
    first = next(s for s in slices if s["tid"] == 1 and s["name"] == "all_reduce #1 default")
    assert (first["ts"], first["dur"]) == (10_000.0, 1_000.0)  # microseconds
    assert first["args"] == {"group": "default", "seq": 1, "state": "completed", "shapes": "[4]",
                             "dtype": "torch.float32", "site": "test_x.py:12 <- test_x.py:30"}
    diverging = {s["tid"] - 1: s for s in slices if s["args"].get("diverging")}
    assert sorted(diverging) == [0, 1, 2] and all(s["name"] == "all_reduce #3 default" for s in diverging.values())
    # never completed: to the verdict (0.5 s), or to when the rank died (0.05 s)
    assert diverging[0]["ts"] + diverging[0]["dur"] == pytest.approx(500_000, abs=1)
    assert diverging[1]["ts"] + diverging[1]["dur"] == pytest.approx(50_000, abs=1)
    events = data["traceEvents"]
    marks = [e for e in events if e["ph"] == "i" and e.get("cat") == "diagnosis" and e.get("s") == "t"]
    assert sorted(e["tid"] - 1 for e in marks) == [0, 1, 2, 3]   # rank 3: "never entered"
    assert any(e["name"] == "never entered default #3" and e["tid"] == 4 for e in marks)
    assert [e["ph"] for e in events if e["ph"] in "stf"] == ["s", "t", "f"]
    verdict = next(e for e in events if e.get("s") == "g")
    assert verdict["ts"] == 500_000 and verdict["args"]["kind"] == "shape-mismatch"
    assert any(e["name"] == "rank 1 killed by SIGABRT" for e in events if e["ph"] == "i")


def test_trace_events_group_ranks_by_node():
    ranks, diag = shape_mismatch_call()
    data = trace_events("t", ranks, diag, 0.5, 10.0, nodes={0: "a", 1: "a", 2: "b", 3: "b"})
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "node 0 (a): ranks 0,1", 2: "node 1 (b): ranks 2,3"}
    check_trace_events(data, 4)


def test_a_hang_marks_the_collective_every_rank_waits_in():
    ranks = [RankView(r, RankState.RUNNING, [rec(r, 1), rec(r, 2, state="entered", t=0.01)]) for r in range(2)]
    diag = diagnose(ranks, "timeout", 5.0)
    assert diag.kind == "hang"
    data = trace_events("t", ranks, diag, 5.0, 5.0)
    check_trace_events(data, 2)
    assert [s["name"] for s in data["traceEvents"] if s["ph"] == "X" and s["args"].get("diverging")] == \
        ["all_reduce #2 default"] * 2


def test_page_data_folds_agreement_and_keeps_what_differs():
    ranks, diag = shape_mismatch_call()
    data = page_data("test_x.py::t", ranks, diag, 0.5, 10.0, "gloo")
    (group,) = data["groups"]
    assert (group["pg"], group["n"], group["members"], group["match"]) == ("default", 3, [0, 1, 2, 3], "110")
    assert group["same"][:2] != [-1, -1] and group["same"][2] == -1
    at3 = [None if k < 0 else data["kinds"][k][:4] for k in group["cols"]["2"]]
    assert at3 == [["all_reduce", "[4]", "torch.float32", "entered"], ["all_reduce", "[5]", "torch.float32", "entered"],
                   ["all_reduce", "[4]", "torch.float32", "entered"], None]
    assert data["position"] == {"pg": "default", "seq": 3} and data["odd"] == [1, 3] and data["absent"] == [3]
    assert data["ranks"][1]["exit"] == "killed by SIGABRT"


def test_page_data_never_compares_point_to_point_ops():
    ranks = [RankView(r, RankState.RUNNING, [rec(r, 1, "send" if r == 0 else "recv", pg="pg1[0,1]")]) for r in range(2)]
    assert page_data("t", ranks, None, 1.0, 1.0)["groups"][0]["match"] == "1"


def test_page_is_self_contained_and_escapes_what_it_shows():
    ranks, diag = shape_mismatch_call()
    ranks[2].message = "</script><script>alert(1)</script> <!-- &"
    page = swimlane_html("test_x.py::t[<b>]", ranks, diag, 0.5, 10.0, "gloo")
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<title>shape-mismatch: test_x.py::t[&lt;b&gt;]</title>" in page
    for external in ("http://", "https://", "<link", " src=", "@import", "url("):
        assert external not in page, external
    data = page.split('id="nccl-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["ranks"][2]["message"].startswith("</script><script>")


def test_gate_links_each_failure_to_its_page(tmp_path):
    page = str(tmp_path / "traces" / "t.py__test_a.html")
    rep = SimpleNamespace(nodeid="suites/x/t.py::test_a", when="call", failed=True, skipped=False, duration=1.0,
                          user_properties=[("nccl_diagnosis", "boom"), ("nccl_trace_page", page)], longrepr=None)
    result = gate.result_from_report(rep)
    assert result.page == page
    md = gate.render_report({}, [result], "gloo", 2, report_path=str(tmp_path / "report.md"))
    assert ("- `suites/x/t.py::test_a` (failed, 1.0s)  \n  `boom`  \n  [swimlane](traces/t.py__test_a.html) "
            "\u00b7 [Perfetto trace](traces/t.py__test_a.trace.json)") in md
    md = gate.render_report({}, [result], "gloo", 2, report_path=str(tmp_path / "out" / "report.md"))
    assert "[swimlane](../traces/t.py__test_a.html)" in md
    plain = gate.render_report({}, [gate.TestResult("t.py::b", "failed", 1.0, "boom")], "gloo", 2)
    assert "swimlane" not in plain


# -- a real failure, as --nccl-trace-dir writes it -------------------------------------------------------

INNER = """
import pytest, torch
import torch.distributed as dist


@pytest.mark.nccl(world=4, timeout=10)
def test_train_loop(rank):
    grads = torch.ones(64)
    for step in range(6):
        dist.all_reduce(grads)
        if rank == 2 and step == 3:
            continue                  # skips the broadcast: #8 differs
        dist.broadcast(torch.zeros(2), src=0)


def diverge():
    if dist.get_rank() == 0:
        dist.barrier()


def test_world_desync(nccl_world):
    import pytest_nccl
    with pytest.raises(pytest_nccl.CollectiveMismatch):
        nccl_world.run(diverge)
"""
BASE = "test_views_inner.py__test_train_loop"
WORLD_BASE = "test_views_inner.py__test_world_desync"


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    run = run_inner_once(tmp_path_factory, INNER, "--nccl-world=4", "--nccl-trace-dir=traces",
                         "--nccl-report=report.md", "--junitxml=junit.xml", name="test_views_inner")
    (folder,) = tmp_path_factory.getbasetemp().glob("test_views_inner[0-9]*")  # run_inner_once's mktemp
    return SimpleNamespace(run=run, dir=folder, traces=folder / "traces")


def test_trace_dir_holds_both_views(inner):
    assert inner.run.result.parseoutcomes() == {"failed": 1, "passed": 1}, inner.run.text
    names = {p.name for p in inner.traces.iterdir()}
    for base in (BASE, WORLD_BASE):  # an item's failure, and nccl_world.run's (no item)
        assert {base + ".json", base + ".trace.json", base + ".html"} <= names, names


def test_real_trace_events_follow_the_format(inner):
    data = json.loads((inner.traces / (BASE + ".trace.json")).read_text())
    slices = check_trace_events(data, 4)
    assert data["otherData"]["headline"].startswith("op mismatch at collective #8 of group default")
    diverging = {s["name"] for s in slices if s["args"].get("diverging")}
    assert diverging == {"broadcast #8 default", "all_reduce #8 default"}
    assert all(s["args"]["site"].startswith("test_views_inner.py:") for s in slices)


def test_gate_report_links_the_page(inner):
    report = (inner.dir / "report.md").read_text()
    assert f"[swimlane](traces/{BASE}.html) \u00b7 [Perfetto trace](traces/{BASE}.trace.json)" in report, report
    cases = {c.get("name"): c for c in ET.parse(inner.dir / "junit.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_train_loop"].iter("property")}
    assert props["nccl_trace_page"] == str(inner.traces / (BASE + ".html"))


# -- a real browser ------------------------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,900", "--enable-logging=stderr", "--v=0"]


def chromium() -> str | None:
    """$PYTEST_NCCL_CHROMIUM, else the first Chromium or Chrome on PATH."""
    explicit = os.environ.get("PYTEST_NCCL_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell"):
        found = shutil.which(name)
        if found:
            return found
    return None


needs_chromium = pytest.mark.skipif(chromium() is None, reason="no Chromium found (apt-get install chromium, "
                                    "or set PYTEST_NCCL_CHROMIUM)")


def render(page: Path, tmp_path: Path, fragment: str = "") -> tuple[dict, str, str]:
    """Load the page headless; (the <body>'s data attributes once the page has run, console lines,
    the DOM)."""
    proc = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom",
                           page.as_uri() + fragment], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert proc.returncode == 0 and body, f"chromium exited {proc.returncode}: {proc.stderr[-3000:]}"
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(1)))
    console = [line for line in proc.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]
    return attrs, "\n".join(console), proc.stdout


@needs_chromium
def test_chromium_draws_the_real_failure(inner, tmp_path):
    attrs, console, dom = render(inner.traces / (BASE + ".html"), tmp_path, "#rank=3")
    assert not console, console           # the page logs nothing: any console line is an error
    assert "error" not in attrs, attrs["error"]
    assert attrs["drawn"] == "1" and attrs["diverging-drawn"] == "default#8", attrs
    # the fragment opened rank 3: its record at the divergence and its stack, harness frames hidden
    detail = dom.split('<section id="detail">', 1)[1].split("</section>", 1)[0]
    assert "<h2>rank 3: " in detail and "rank 3  broadcast #8 of group default" in detail, detail
    assert "test_views_inner.py" in detail and "zygote.py" not in detail, detail


def synthetic_call(world: int = 64, n: int = 10_000, skip_rank: int = 7, skip_at: int = 5_000):
    """A loop of three collectives; one rank skips one at ``skip_at``: half the run agrees (folded),
    the other half differs on every position (drawn), and every rank hangs in the last one."""
    ops = [("all_reduce", "[4096]", "torch.float32"), ("broadcast", "[16]", "torch.int64"),
           ("all_gather_into_tensor", "[8, 4096]", "torch.bfloat16")]
    ranks = []
    for r in range(world):
        recs = []
        for i in range(n):
            if r == skip_rank and i == skip_at - 1:
                continue
            op, shapes, dtype = ops[i % 3]
            last = i == n - 1
            recs.append(CollectiveRecord(r, "default", len(recs) + 1, op, shapes, dtype,
                                         site=f"train.py:{40 + i % 3} <- train.py:12",
                                         state="entered" if last else "completed", t_start=i * 0.001,
                                         duration=None if last else 0.0005))
        ranks.append(RankView(r, RankState.RUNNING, recs, stack='Thread MainThread:\n  File "train.py", line 40'))
    return ranks


@needs_chromium
def test_a_64_rank_10000_collective_page_draws_within_the_bound(tmp_path):
    ranks = synthetic_call()
    diag = diagnose(ranks, "timeout", 60.0)
    assert (diag.kind, diag.seq) == ("op-mismatch", 5_000)
    page = tmp_path / "big.html"
    page.write_text(swimlane_html("train.py::test_big", ranks, diag, 60.0, 60.0, "gloo"))
    attrs, console, _ = render(page, tmp_path)
    assert not console and "error" not in attrs, console or attrs["error"]
    assert attrs["diverging-drawn"] == "default#5000", attrs
    ms = float(attrs["render-ms"])
    print(f"64 ranks x 10,000 collectives: drawn {ms:.0f} ms after navigation start")
    assert ms < RENDER_BOUND_MS, f"the page took {ms:.0f} ms to draw"


def test_the_report_hides_the_rank_loop_and_fork_server_around_the_body():
    """A stuck rank's stack as the rank formats it: the fork server and the rank loop (wherever the
    package keeps them) go, the test body and what it called stay; the reader thread goes."""
    from pytest_nccl.rank import loop, zygote
    from pytest_nccl.views.report import _trim_stack

    stack = (
        "Thread MainThread:\n"
        f'  File "{zygote.__file__}", line 245, in main\n    _Server(conn, state).serve()\n'
        f'  File "{loop.__file__}", line 217, in main\n    report = run_call(calls.get(), rank)\n'
        f'  File "{loop.__file__}", line 140, in run_call\n    value = fn(*args, **kwargs)\n'
        '  File "/w/test_x.py", line 9, in test_train_loop\n    dist.all_reduce(grads)\n'
        "Thread pytest-nccl-reader:\n"
        f'  File "{loop.__file__}", line 40, in _reader\n    msg = conn.recv()\n')
    shown = _trim_stack(stack)
    assert "test_x.py" in shown and "dist.all_reduce(grads)" in shown
    assert "zygote.py" not in shown and "loop.py" not in shown, shown
