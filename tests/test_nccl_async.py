"""NCCL's asynchrony (issue 38): a collective is complete when its work is, and a hang on NCCL is
named as precisely as one on gloo. Proven on ``pytest_nccl.testing.nccl_model`` (NCCL's host
semantics on CPU: collectives return enqueued, complete on a stream, ranks block at a sync point),
at world 2 and 4, in one inner session; the tracer's in-flight state in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from collective_records import record, view
from conftest import line_of, run_fresh, run_scenarios

from pytest_nccl.core.diagnosis import diagnose
from pytest_nccl.core.journal import parse_journal
from pytest_nccl.core.nccl_env import RANK_ENV, nccl_env
from pytest_nccl.core.states import RecordState
from pytest_nccl.core.waits import behind, stuck_ranks

SCENARIOS = """
import pytest, torch
import torch.distributed as dist
from pytest_nccl.testing import nccl_model

nccl_model.register()


def model_group(desc="model"):
    return dist.new_group(backend=nccl_model.NAME, group_desc=desc)


def skip(rank):
    pg = model_group()
    t = torch.ones(4)
    dist.all_reduce(t, group=pg)
    if rank != 0:
        dist.all_reduce(t, group=pg)  # rank 0 skips it
    nccl_model.item(t[0])  # the sync point


def shape(rank):
    pg = model_group()
    t = torch.ones(4 if rank == 0 else 2)
    dist.all_reduce(t, group=pg)  # per-rank shapes
    nccl_model.item(t[0])


def ahead(rank):
    pg = model_group()
    t = torch.ones(4)
    for _ in range(3 if rank == 0 else 1):
        dist.all_reduce(t, group=pg)  # rank 0: two more, in flight
    dist.barrier(group=pg)


def order(rank):
    weights, grads = model_group("weights"), model_group("grads")
    t = torch.ones(4)
    first, second = (weights, grads) if rank == 0 else (grads, weights)
    dist.all_reduce(t, group=first)  # each rank's first group
    dist.all_reduce(t, group=second)
    nccl_model.item(t[0])


def overlapped(rank):
    pg = model_group()
    nccl_model.sleep(0.2)  # a long kernel first: everything below is enqueued behind it
    buckets = [torch.full((8,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(b, group=pg, async_op=True) for b in buckets]
    loss = torch.ones(1)
    dist.all_reduce(loss, group=pg)
    gathered = torch.zeros(2 * dist.get_world_size())
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)), group=pg)
    for w in works:
        w.wait()
    assert nccl_model.item(loss[0]) == dist.get_world_size()
    n = dist.get_world_size()
    assert [nccl_model.item(b[0]) for b in buckets] == [float(sum(r + i for r in range(n))) for i in range(4)]
    assert gathered.tolist() == [float(r) for r in range(n) for _ in range(2)]


@pytest.mark.nccl(world=2)
def test_00_warm_2(rank):
    model_group()


@pytest.mark.nccl(world=4)
def test_00_warm_4(rank):
    model_group()


@pytest.mark.nccl(world=2)
def test_settings_2(rank):
    import os
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    assert "TORCH_NCCL_BLOCKING_WAIT" not in os.environ  # the asynchrony under test stays


@pytest.mark.nccl(world=2)
def test_skip_2(rank):
    skip(rank)


@pytest.mark.nccl(world=4)
def test_skip_4(rank):
    skip(rank)


@pytest.mark.nccl(world=2)
def test_shape_2(rank):
    shape(rank)


@pytest.mark.nccl(world=4)
def test_shape_4(rank):
    shape(rank)


@pytest.mark.nccl(world=2)
def test_ahead_2(rank):
    ahead(rank)


@pytest.mark.nccl(world=4)
def test_ahead_4(rank):
    ahead(rank)


@pytest.mark.nccl(world=2)
def test_order_2(rank):
    order(rank)


@pytest.mark.nccl(world=4)
def test_order_4(rank):
    order(rank)


@pytest.mark.nccl(world=2)
def test_overlapped_2(rank):
    overlapped(rank)


@pytest.mark.nccl(world=4)
def test_overlapped_4(rank):
    overlapped(rank)
"""


def _at(snippet: str) -> str:
    return f"test_inner.py:{line_of(SCENARIOS, snippet)}"


def _skip(world: int) -> str:
    waiting = "rank 1 waits" if world == 2 else "ranks 1-3 wait"
    group = f"model[0-{world - 1}]" if world > 2 else "model[0,1]"
    return (f"rank 0 left the test (passed) after 1 collective in group {group}; {waiting} for all_reduce #2 of "
            f"group {group} from {_at('rank 0 skips it')} (enqueued, not completed) at {_at('the sync point')}: "
            "nccl_model.item(t[0])")


def _order(world: int) -> str:
    members = "0,1" if world == 2 else "0-3"
    others = "rank 1" if world == 2 else "ranks 1-3"
    line = _at("each rank's first group")
    return ("deadlock across groups, issued in an order that differs per rank: rank 0 waits for all_reduce #1 of "
            f"group weights[{members}] from {line} (enqueued, not completed), which {others} issued after "
            f"all_reduce #1 of group grads[{members}], {others} for all_reduce #1 of group grads[{members}] from "
            f"{line} (enqueued, not completed), which rank 0 issued after all_reduce #1 of group weights[{members}]")


def _group(world: int) -> str:
    return "model[0,1]" if world == 2 else "model[0-3]"


EXPECTED = {
    **{f"test_skip_{w}": _skip(w) for w in (2, 4)},
    **{f"test_shape_{w}": (f"shape mismatch in all_reduce #1 of group {_group(w)}: rank 0 [4], "
                           f"{'rank 1' if w == 2 else 'ranks 1-3'} [2] (from {_at('per-rank shapes')})")
       for w in (2, 4)},
    **{f"test_ahead_{w}": (f"op mismatch at collective #2 of group {_group(w)}: rank 0 all_reduce, "
                           f"{'rank 1' if w == 2 else 'ranks 1-3'} barrier (from {_at('two more, in flight')}; "
                           f"{'rank 1' if w == 2 else 'ranks 1-3'} from {_at('dist.barrier(group=pg)')})")
       for w in (2, 4)},
    **{f"test_order_{w}": _order(w) for w in (2, 4)},
}
# every one blocks at once: decided about 1-1.5 s after (a stall check, or the deadlock rule's quiet);
# the bound is 60 s, so 8 s leaves a loaded 2-core runner its margin
FAST = 8.0


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    return run_scenarios(tmp_path_factory, SCENARIOS, "--nccl-timeout=60")


def test_the_session_fails_each_fault_and_passes_healthy_overlap(scenarios):
    inner, _, _ = scenarios
    # the warm-ups and the overlapped jobs (several collectives in flight, waited late) pass untouched
    assert inner.result.parseoutcomes() == {"passed": 5, "failed": len(EXPECTED)}, inner.text


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_nccl_shaped_fault_headline_and_time(scenarios, scenario):
    inner, props, durations = scenarios
    assert props.get((scenario, "nccl_diagnosis")) == EXPECTED[scenario], inner.section(scenario)
    assert props.get((scenario, "nccl_exception")) == "CollectiveMismatch"
    assert durations[scenario] < FAST, (scenario, durations[scenario])


def test_the_report_says_where_a_rank_waits_for_a_collective_in_flight(scenarios):
    inner, _, _ = scenarios
    section = inner.section("test_skip_2")
    assert (f"rank 1: waits for all_reduce #2 of group model[0,1] from {_at('rank 0 skips it')} (enqueued, not "
            f"completed) at {_at('the sync point')}") in section, section
    assert "in-flight" in section  # the row of the collective trace: its state


def test_a_collective_behind_a_long_kernel_is_in_flight_until_its_work_completes(tmp_path):
    """The model's form of the GPU host's check (tests/gpu): an all_reduce enqueued behind a long
    kernel returns at once and is journaled in flight, not completed, while the stream is held; its
    C line follows once the work ran, without the rank writing anything more."""
    out = run_fresh(f"""
        import time, torch, torch.distributed as dist
        from pytest_nccl.rank import tracer
        from pytest_nccl.core.journal import read_journal
        from pytest_nccl.core.states import RecordState
        from pytest_nccl.testing import nccl_model
        tracer.install()
        nccl_model.register()
        dist.init_process_group(nccl_model.NAME, store=dist.HashStore(), rank=0, world_size=1)
        path = {str(tmp_path / "journal")!r}
        tracer.start(path)
        t = torch.ones(4)
        nccl_model.sleep(1.0)
        t0 = time.monotonic()
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        returned = time.monotonic() - t0
        time.sleep(0.3)  # several flusher rounds: the stream is still held
        held = [r.state for r in read_journal(path, 0)]
        nccl_model.synchronize()
        time.sleep(0.3)
        done = [r.state for r in read_journal(path, 0)]
        digests, dangling = tracer.stop()
        print(returned < 0.5, held == [RecordState.IN_FLIGHT] * 2, done == [RecordState.COMPLETED] * 2, dangling)
    """)
    assert out.split() == ["True", "True", "True", "0"], out


def test_gloo_collectives_stay_complete_when_they_return(tmp_path):
    """gloo's wait blocks the CPU: its calls complete on return, even the composed works that never
    say so (reduce_scatter_single's ``is_completed()`` stays False after its wait)."""
    out = run_fresh(f"""
        import torch, torch.distributed as dist
        from pytest_nccl.rank import tracer
        from pytest_nccl.core.journal import read_journal
        tracer.install()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        path = {str(tmp_path / "journal")!r}
        tracer.start(path)
        out = torch.zeros(2)
        dist.reduce_scatter_tensor(out, torch.ones(2))
        dist.reduce_scatter_tensor(out, torch.ones(2), async_op=True).wait()
        dist.all_reduce(out)
        _, dangling = tracer.stop()
        print(sorted({{str(r.state) for r in read_journal(path, 0)}}), dangling)
    """)
    assert out.split() == ["['completed']", "0"], out


# -- the records, on data ---------------------------------------------------------------------------

def test_a_q_line_puts_a_collective_in_flight_until_its_c_line():
    entered = "E\tdefault\t1\tall_reduce\t0\t0.1\t[4]\tfloat32\t1\tt.py:3\t\n"
    assert parse_journal(entered + "Q\tdefault\t1\t0.2\n", 0)[0].state == RecordState.IN_FLIGHT
    done = parse_journal(entered + "Q\tdefault\t1\t0.2\nC\tdefault\t1\t0.5\n", 0)[0]
    assert done.state == RecordState.COMPLETED and done.duration == pytest.approx(0.4)
    # lines are matched by (pg, seq), not order: a late Q never takes a completion back
    assert parse_journal(entered + "C\tdefault\t1\t0.5\nQ\tdefault\t1\t0.2\n", 0)[0].state == RecordState.COMPLETED


def test_a_rank_waits_for_its_first_collective_in_flight_unless_it_sits_in_a_call():
    first, second = record(0, 1, state=RecordState.IN_FLIGHT), record(0, 2, state=RecordState.IN_FLIGHT)
    assert view(0, "running", [record(0, 0), first, second]).current is first  # NCCL runs them in order
    inside = record(0, 3, state=RecordState.ENTERED)  # a blocking call after them: the CPU is in it
    assert view(0, "running", [first, second, inside]).current is inside
    assert view(0, "running", [record(0, 1)]).current is None


def test_every_rank_waiting_for_the_same_collective_in_flight_is_held_on_the_device():
    """Every rank's CPU got past it (world 1 behind a long kernel, on a GPU): no peer is missing, so
    the headline says what can hold an enqueued collective instead of blaming a peer."""
    ranks = [view(r, "running", [record(r, 1), record(r, 2, state=RecordState.IN_FLIGHT)]) for r in (0, 1)]
    h = diagnose(ranks, "timeout", 8).headline
    assert h == ("every rank is waiting for all_reduce #2 of group default from /w/test_x.py:5 (enqueued, not "
                 "completed) and none completed within the 8 s bound (every rank enqueued it: a kernel before "
                 "it on a stream that does not finish, or a transport problem)"), h


def test_a_member_that_issued_it_behind_a_synchronous_collective_in_flight_cannot_reach_it():
    flight = RecordState.IN_FLIGHT
    w0, g0 = record(0, 1, pg="weights[0,1]", state=flight), record(0, 1, pg="grads[0,1]", state=flight)
    g1, w1 = record(1, 1, pg="grads[0,1]", state=flight), record(1, 1, pg="weights[0,1]", state=flight)
    views = {0: view(0, "running", [w0, g0]), 1: view(1, "running", [g1, w1])}
    assert behind(views[1], w0) and behind(views[0], g1)
    assert sorted(stuck_ranks(views)) == [0, 1]
    # the same order on both ranks: each waits for its first, which every member reaches
    same = {0: view(0, "running", [w0, g0]), 1: view(1, "running", [w1, g1])}
    assert not behind(same[1], w0) and stuck_ranks(same) == {}
    # an async one: its wait (which made the current stream wait) may have come after the next was
    # issued; not certain, so not counted
    loose = record(1, 1, pg="grads[0,1]", state=flight, async_op=True)
    assert not behind(view(1, "running", [loose, w1]), w0)


def test_the_ranks_nccl_settings_keep_the_users_own_and_name_the_flight_recorder_as_their_torch_does():
    assert nccl_env({}, "2.13.0+cpu") == {**RANK_ENV, "TORCH_FR_BUFFER_SIZE": "2000"}
    assert nccl_env({}, "2.6.0") == {**RANK_ENV, "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}  # 2.8 renamed it
    assert nccl_env({}, "") == {**RANK_ENV, "TORCH_FR_BUFFER_SIZE": "2000"}
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in nccl_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    assert nccl_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, "2.13.0") == RANK_ENV  # either name: the user's


def test_the_models_watchdog_takes_a_rank_down_as_nccls_does(tmp_path):
    """A collective incomplete past the group's timeout: NCCL's watchdog message, then SIGABRT."""
    code = textwrap.dedent(f"""
        import sys, time, datetime, torch, torch.distributed as dist
        from pytest_nccl.testing import nccl_model
        nccl_model.register()
        rank = int(sys.argv[1])
        store = dist.FileStore({str(tmp_path / "store")!r}, 2)
        dist.init_process_group(nccl_model.NAME, store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=1))
        if rank == 0:
            dist.all_reduce(torch.ones(2))  # rank 1 never joins it
        time.sleep(30)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        _, err = procs[0].communicate(timeout=60)
    finally:
        procs[1].kill()
        procs[1].wait()
    assert procs[0].returncode == -6, err  # SIGABRT
    assert "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE" in err, err


def test_the_models_gloo_groups_are_freed_before_the_interpreter_s_teardown(tmp_path):
    """A healthy job's rank must exit 0: freed in the teardown, a gloo group underneath now and then
    aborted it. By the time the first atexit handler registered runs (atexit runs them last in,
    first out), the model holds none and the group it made holds no gloo group."""
    code = textwrap.dedent(f"""
        import atexit, torch, torch.distributed as dist
        def check():
            print("held", len(nccl_model._groups), "inner", group.inner is None, flush=True)
        atexit.register(check)
        from pytest_nccl.testing import nccl_model
        nccl_model.register()
        dist.init_process_group(nccl_model.NAME, store=dist.FileStore({str(tmp_path / "store")!r}, 1),
                                rank=0, world_size=1)
        group = nccl_model._groups[0]
        t = torch.ones(2)
        dist.all_reduce(t)
        print("sum", nccl_model.item(t[0]), flush=True)
        dist.destroy_process_group()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["sum", "1.0", "held", "0", "inner", "True"], proc.stdout + proc.stderr


def test_a_python_work_that_cannot_say_it_completed_is_taken_as_completed():
    """A backend's Work written in Python without ``is_completed`` (torch's default never turns true
    for it): its collectives must not read in flight for ever."""
    out = run_fresh("""
        import torch.distributed as dist
        from pytest_nccl.rank.trace_completion import completed_work

        class Silent(dist.distributed_c10d.Work):
            pass

        class Says(dist.distributed_c10d.Work):
            def is_completed(self):
                return False

        print(completed_work(Silent()), completed_work(Says()))
    """)
    assert out.split() == ["True", "False"], out
