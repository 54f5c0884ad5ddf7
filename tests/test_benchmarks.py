"""Smoke tests of the benchmark's helpers (benchmarks/bench_cold.py, whole_process.py): the files it generates, the
commands it runs, its A/B bookkeeping and its clean-up. No timing is asserted."""

from __future__ import annotations

import os
import py_compile
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_cold  # noqa: E402
import whole_process  # noqa: E402


def test_generated_files_compile_and_hold_the_tests(tmp_path):
    paths = bench_cold.write_files(str(tmp_path), 3)
    assert sorted(paths) == ["mpct-1", "mpct-3", "mptc-1", "mptc-3", "ours-1", "ours-3", "plain"]
    assert "@pytest.mark.nccl" not in open(paths["plain"]).read()
    for path in paths.values():
        py_compile.compile(path, doraise=True)
    ours = open(paths["ours-3"]).read()
    assert ours.count("@pytest.mark.nccl") == 3 and ours.count("dist.all_reduce(t)") == 3
    mpct = open(paths["mpct-3"]).read()
    assert "class AllReduce(MultiProcContinuousTest)" in mpct and "world_size = 4" in mpct
    assert 'return "gloo"' in mpct and mpct.count("    def test_") == 3 and "run_tests()" in mpct
    mptc = open(paths["mptc-1"]).read()
    assert "class AllReduce(MultiProcessTestCase)" in mptc and "self._spawn_processes()" in mptc


@pytest.mark.parametrize("runner", ["python", "pytest"])
def test_commands(tmp_path, runner):
    cmds = bench_cold.commands(bench_cold.write_files(str(tmp_path), 20), 20, runner)
    assert set(cmds) == {"floor", "pytest-floor", "ours-1", "ours-20", "mpct-1", "mpct-20", "mptc-1", "mptc-20"}
    assert cmds["pytest-floor"].argv[-1] == str(tmp_path / "plain.py") and cmds["pytest-floor"].expect == "1 passed"
    assert cmds["ours-1"].argv[1:6] == ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    assert cmds["ours-1"].argv[-1] == "--nccl-world=4" and cmds["ours-20"].expect == "20 passed"
    if runner == "python":
        assert cmds["mpct-20"].argv[1:] == [str(tmp_path / "mpct_20.py")]
        assert cmds["mpct-20"].expect == "Ran 20 tests" and cmds["mptc-1"].expect == "Ran 1 test"
    else:
        assert "no:nccl" in cmds["mpct-1"].argv and cmds["mpct-1"].expect == "1 passed"
    assert cmds["mptc-20"].timeout > cmds["mptc-1"].timeout
    assert cmds["floor"].argv[1:] == ["-c", "import torch, pytest"]


def test_plan_and_summary():
    cmds = {n: whole_process.Command(n, ["true"], "") for n in
            ("floor", "pytest-floor", "ours-1", "ours-20", "mpct-1", "mpct-20", "mptc-1", "mptc-20")}
    keys = [c.key for c in bench_cold.plan(cmds, 20, pairs=5, spawn_pairs=0)]
    assert keys == ["one-test vs MultiProcContinuousTest", "one-test vs import floor", "one-test vs pytest floor",
                    "20-test vs MultiProcContinuousTest", "one-test vs MultiProcessTestCase"]
    comps = bench_cold.plan(cmds, 20, pairs=5, spawn_pairs=2)
    assert comps[-1].key == "20-test vs MultiProcessTestCase" and comps[-1].pairs == 2

    comp = comps[0]
    comp.runs_a = [whole_process.Run(w, 1.0, 0) for w in (1.0, 2.0, 3.0)]
    comp.runs_b = [whole_process.Run(w, 2.0, 0) for w in (4.0, 4.0, 6.0)]
    s = comp.summary()
    assert s["ratios"] == [0.25, 0.5, 0.5] and s["ratio_median"] == 0.5
    assert s["a_median"] == 2.0 and s["b_median"] == 4.0 and s["pairs"] == 3
    text = bench_cold.table([s], 20)
    assert "one-test world-4 session: ours 2.00 s, MultiProcContinuousTest 4.00 s, ratio 0.50 (target <= 0.25)" in text


def test_run_once_reports_a_failure(tmp_path):
    cmd = whole_process.Command("fails", [sys.executable, "-c", "print('no luck')"], "1 passed")
    with pytest.raises(whole_process.RunFailed, match="no luck"):
        whole_process.run_once(cmd, str(tmp_path), str(tmp_path / "log"))


def test_nothing_a_run_starts_outlives_it(tmp_path, monkeypatch):
    """A process the run leaves behind in a session of its own (as the plugin's ranks are) is found by
    its environment tag, killed and counted."""
    monkeypatch.setattr(bench_cold, "LEFTOVER_GRACE", 0.2)
    pidfile = tmp_path / "pid"
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            f"start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid)); print('done')")
    run = whole_process.run_once(whole_process.Command("leaks", [sys.executable, "-c", code], "done"),
                              str(tmp_path), str(tmp_path / "log"))
    assert run.leftovers == 1 and run.wall > 0
    pid = int(pidfile.read_text())

    def state() -> str:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"

    # a killed process can still show R for a moment while the kernel tears it down (its environ is
    # already unreadable then, so the tag search no longer sees it)
    deadline = time.monotonic() + 5
    while state() not in ("gone", "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state() in ("gone", "Z", "X")
    assert whole_process.processes_with_tag(uuid.uuid4().hex) == []


def test_bench_explain_runs_measures_and_caps(tmp_path):
    """benchmarks/bench_explain.py: a whole process timed with its peak RSS, a run past the cap killed and
    shown as such, a failing command not run again, the Markdown table."""
    import bench_explain

    log = str(tmp_path / "log")
    grow = bench_explain.Command("grow", [sys.executable, "-c", "b = bytearray(200 << 20); print(len(b))"])
    run = bench_explain.run_once(grow, log, cap=60)
    assert run.rc == 0 and run.wall > 0 and run.rss_mb > 190
    slow = bench_explain.Command("slow", [sys.executable, "-c", "import time; time.sleep(30)"])
    fails = bench_explain.Command("fails", [sys.executable, "-c", "raise SystemExit(5)"], ok=(0, 3))
    sides = [bench_explain.Side(slow), bench_explain.Side(fails)]
    start = time.monotonic()
    bench_explain.measure(sides, pairs=2, cap=0.5, log_path=log, out=open(os.devnull, "w"))
    assert time.monotonic() - start < 20
    assert len(sides[0].runs) == 1 and sides[0].runs[0].wall is None and sides[0].cell() == ("> 0", "-")
    assert len(sides[1].runs) == 1 and sides[1].cell() == ("failed (exit 5)", "-")
    cmds = bench_explain.commands("/d", "nccl_trace_rank_")
    assert cmds["explain"].argv[1:] == ["-m", "pytest_nccl", "explain", "/d"] and cmds["explain"].ok == (0, 3)
    assert cmds["fr_trace"].argv[-3:] == ["/d", "--prefix", "nccl_trace_rank_"]
    text = bench_explain.table([{"ranks": 128, "files_mb": 45.2, "explain": ("1.0", "80"),
                                 "fr_trace": ("> 600", "-")}])
    assert text.splitlines()[0] == "| ranks | files MB | explain s | explain MB | fr_trace s | fr_trace MB |"
    assert text.splitlines()[-1] == "| 128 | 45 | 1.0 | 80 | > 600 | - |"
