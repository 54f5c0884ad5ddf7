"""Smoke tests of the watch's benchmarks (benchmarks/bench_watch_*.py): their environments, the
commands they run, their A/B bookkeeping and their parsing. No timing is asserted."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_watch_startup  # noqa: E402
import bench_watch_trl  # noqa: E402


def test_startup_environments_differ_only_by_the_hook(tmp_path):
    base = {"PATH": "/bin", "PYTHONPATH": "/x", "PYTEST_NCCL_WATCH_DIR": "/stale"}
    plain, hooked = bench_watch_startup.environments(str(tmp_path), base)
    assert plain == {"PATH": "/bin", "PYTHONPATH": "/x"}
    assert hooked["PYTHONPATH"] == os.pathsep.join([bench_watch_startup.STARTUP_DIR, "/x"])
    assert hooked["PYTEST_NCCL_WATCH_DIR"] == str(tmp_path) and os.path.isdir(hooked["PYTEST_NCCL_WATCH_PKG"])
    assert os.path.exists(os.path.join(bench_watch_startup.STARTUP_DIR, "sitecustomize.py"))


def test_startup_order_and_summary():
    assert bench_watch_startup.order(3) == ["A", "B", "B", "A", "A", "B"]
    s = bench_watch_startup.summarize([0.010, 0.012, 0.011], [0.0105, 0.0121, 0.0118])
    assert s["pairs"] == 3 and s["cost_ms"] == 0.5 and s["without_ms"] == 11.0


def test_startup_runs_a_process(tmp_path):
    plain, hooked = bench_watch_startup.environments(str(tmp_path))
    wall, cpu = bench_watch_startup.run([sys.executable, "-c", "pass"], hooked)
    assert wall > 0 and cpu > 0
    assert bench_watch_startup.hook_import_us(hooked, 1) > 0


def test_trl_command_and_parsing(tmp_path):
    cmd = bench_watch_trl.sft_command(str(tmp_path), "py", 300)
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"] and "trl.scripts.sft" in cmd
    assert cmd[cmd.index("--max_steps") + 1] == "300" and "--use_cpu" in cmd
    watched = bench_watch_trl.watched(cmd, "py")
    assert watched[:4] == ["py", "-m", "pytest_nccl", "watch"] and watched[watched.index("--") + 1:] == cmd
    out = "{'train_runtime': '6.0', 'train_samples_per_second': '1'}\n{\"train_runtime\": 3.0}"
    assert bench_watch_trl.step_time(out, 300) == 0.01
    assert bench_watch_trl.order(2) == ["A", "B", "A", "B"]
    s = bench_watch_trl.summary([0.020, 0.022], [0.0202, 0.0225])
    assert s["overhead_pct"] == 1.67 and s["pair_ratios"] == [1.01, 1.0227]
