"""On a GPU host, world 1: the NCCL model's assumptions checked against real NCCL where one GPU allows
(issue 38). An all_reduce enqueued behind a long kernel on the same stream returns at once and is
journaled in flight while the rank waits at ``.item()``; the Flight Recorder's entry for it is not
completed meanwhile; its C line follows once the stream ran it; the plugin's settings reach its
ranks. Each check prints what it measured (``-s`` or the log shows it). Skipped without CUDA."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import line_of, run_inner_once

from pytest_nccl.core.nccl_env import nccl_env

pytestmark = pytest.mark.skipif(torch.cuda.device_count() == 0, reason="no CUDA device on this host")


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_NCCL_WATCH_DIR"}
    env.update(nccl_env(env))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_an_all_reduce_behind_a_long_kernel_is_in_flight_until_the_stream_ran_it(tmp_path):
    out = _run(f"""
        import json, time, torch, torch.distributed as dist
        from pytest_nccl.rank import flight_api, tracer
        from pytest_nccl.core.journal import read_journal
        from pytest_nccl.core.states import RecordState
        tracer.install()
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.FileStore({str(tmp_path / "store")!r}, 1), rank=0,
                                world_size=1, device_id=torch.device("cuda", 0))
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()  # the communicator is up
        path = {str(tmp_path / "journal")!r}
        tracer.start(path)
        torch.cuda._sleep(int(3e9))  # about 1.5-2 s of one SM on an H100/H200
        t0 = time.monotonic()
        dist.all_reduce(t)
        returned = time.monotonic() - t0
        time.sleep(0.3)
        held = [r.state for r in read_journal(path, 0)]
        entries = json.loads(flight_api.dump_json()).get("entries", [])
        fr_state = entries[-1].get("state") if entries else None
        value = t[0].item()  # the sync point: blocks until the stream ran the sleep and the all_reduce
        blocked = time.monotonic() - t0
        time.sleep(0.2)
        done = [r.state for r in read_journal(path, 0)]
        _, dangling = tracer.stop()
        print(f"returned_s={{returned:.4f}} blocked_at_item_s={{blocked:.2f}} fr_state_while_held={{fr_state}}")
        print("IN_FLIGHT_WHILE_HELD", held == [RecordState.IN_FLIGHT])
        print("COMPLETED_AFTER", done == [RecordState.COMPLETED], value == 1.0, dangling == 0)
        print("FR_NOT_COMPLETED_WHILE_HELD", fr_state in (None, "scheduled", "started"))
        dist.destroy_process_group()
    """)
    print(out)
    assert "IN_FLIGHT_WHILE_HELD True" in out and "COMPLETED_AFTER True True True" in out, out
    assert "FR_NOT_COMPLETED_WHILE_HELD True" in out, out
    assert float(out.split("returned_s=")[1].split()[0]) < 0.5, out  # enqueued, not run


SETTINGS = """
import os, pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=1, backend="nccl")
def test_settings(rank, device):
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and "TORCH_NCCL_BLOCKING_WAIT" not in os.environ
    assert os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
"""

SYNC_POINT = """
@pytest.mark.nccl(world=1, backend="nccl")
def test_stuck_at_item(rank, device):
    t = torch.ones(4, device=device)
    torch.cuda._sleep(int(1e12))  # far longer than the bound
    dist.all_reduce(t)  # enqueued behind it
    t[0].item()  # the sync point
"""

INNER_LIMIT = 90  # the inner session takes ~15 s on an H200; past this its stacks say where it waits


def _inner(tmp_path_factory, source: str):
    """The inner session, bounded: one that does not end is a failure that shows its controller's
    threads (pytest's faulthandler_timeout), not a GPU run cut off with no word of why."""
    try:
        return run_inner_once(tmp_path_factory, source, "--nccl-timeout=8", "-o", "faulthandler_timeout=45",
                              timeout=INNER_LIMIT)
    except subprocess.TimeoutExpired as exc:  # its output so far, as bytes (subprocess decodes only at the end)
        out, err = (o.decode(errors="replace") if isinstance(o, bytes) else o or "" for o in (exc.stdout, exc.stderr))
        pytest.fail(f"the inner session did not end within {INNER_LIMIT} s:\n{out}\n{err}")


@pytest.mark.parametrize("first", ["alone", "after-a-passing-test"])
def test_a_rank_at_its_sync_point_waits_for_the_all_reduce_in_flight(tmp_path_factory, first):
    """On the H200, alone: decided at the bound with this headline (14 s). After a passing test on
    the same rank it did not end within 80 s (not yet understood: this run's stacks will say)."""
    source = (SETTINGS if first != "alone" else SETTINGS.split("@pytest")[0]) + SYNC_POINT
    inner = _inner(tmp_path_factory, source)
    expected = {"passed": 1, "failed": 1} if first != "alone" else {"failed": 1}
    assert inner.result.parseoutcomes() == expected, inner.text
    line = line_of(source, "enqueued behind it")
    assert (f"every rank is waiting for all_reduce #1 of group default from test_inner.py:{line} (enqueued, not "
            "completed) and none completed within the 8 s bound") in inner.text, inner.text
    assert f"at test_inner.py:{line + 1}: t[0].item()" in inner.text, inner.text
