"""The tracer's wrappers are transparent (issue 23): a generated c10d wrapper has the real
function's parameters and defaults and passes every argument through; a functional op's stand-in
keeps the op's hash, so torch's tables keyed by the op (torch.fx's side-effecting ops: a compiled
graph must keep wait_tensor) still find it. Each check runs in a fresh interpreter: installing the
tracer patches torch.distributed for the whole process."""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_fresh


def test_generated_c10d_wrappers_keep_signature_defaults_and_arguments():
    out = run_fresh("""
        import inspect
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        real = {name: getattr(c10d, name) for name in ("all_reduce", "broadcast", "send", "batch_isend_irecv")}
        from pytest_nccl.rank import tracer
        tracer.install()
        for name, fn in real.items():
            traced = getattr(dist, name)
            assert traced is not fn and traced.__wrapped__ is fn, name
            assert inspect.signature(traced) == inspect.signature(fn), name
        seen = []
        def all_reduce(tensor, op="sum-default", group=None, async_op=False):
            seen.append((tensor, op, group, async_op))
            return "result"
        wrapped = tracer._wrap("all_reduce", all_reduce)
        assert wrapped(1) == "result" and wrapped(2, "max", async_op=True) == "result"
        assert seen == [(1, "sum-default", None, False), (2, "max", None, True)], seen
        print("ok")
    """)
    assert out.strip() == "ok"


def test_functional_ops_keep_their_hash_and_graphs_keep_wait_tensor():
    out = run_fresh("""
        import torch, torch.fx
        import torch.distributed._functional_collectives  # registers the ops
        ops = torch.ops._c10d_functional
        before = {name: hash(getattr(ops, name).default) for name in ("all_reduce", "wait_tensor")}
        from pytest_nccl.rank import trace_functional, tracer
        tracer.install()
        for name, h in before.items():
            overload = getattr(ops, name).default
            assert isinstance(overload._op, trace_functional.TracedOp), name
            assert hash(overload) == h, name
        assert torch.fx.node.has_side_effect  # the set torch.fx consults when it eliminates dead code
        assert ops.wait_tensor.default in torch.fx.node._side_effectful_functions
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_stopped_trace_holds_none_of_the_jobs_tensors(tmp_path):
    """The trace keeps the last call site's frame (its locals: the job's tensors) and the Work of async
    collectives. Once stopped it must hold none: the journal's flusher thread would otherwise drop
    them last, at interpreter exit, and a tensor freed by a daemon thread of a finalizing interpreter
    aborts the process ("terminate called without an active exception": a healthy watched job
    failed). The job is a file: the tracer keeps no call site in ``-c`` code."""
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import gc, tempfile, weakref
        import torch, torch.distributed as dist
        from pytest_nccl.rank import tracer
        tracer.install()
        dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
        tracer.start(tempfile.mktemp())
        def step():
            t = torch.ones(4)
            dist.all_reduce(t)
            dist.all_reduce(torch.ones(2), async_op=True)
            return weakref.ref(t)
        ref = step()
        gc.collect()
        held = ref() is not None  # by the trace: the call site's frame
        from pytest_nccl.rank import trace_core
        trace = trace_core.active
        tracer.stop()
        gc.collect()
        print(held, ref() is None)
        # nor its process groups: freed by whichever thread drops the trace last (the flusher, at exit)
        groups = [g for g in (*trace.by_id.values(), *trace.by_name.values(), *trace.by_label.values())
                  if g.pg is not None or g.fr_seq is not None]
        print(trace.default_pg is None and not groups)
        dist.destroy_process_group()
    """))
    out = run_fresh(f"import runpy; runpy.run_path({str(job)!r})")
    assert out.split() == ["True", "True", "True"], out


def test_pytest_nccl_s_own_store_reads_are_not_the_test_s_waits(tmp_path):
    """SPMD mode's decider and watchdog read the launcher's store beside the test: those reads showed
    in the failure's table as the test's 'group outside: store.get' on rank 0. A read from the user's
    code is journaled, from its main thread or a thread of its own; one from pytest-nccl's threads is not."""
    journal = tmp_path / "journal.txt"
    out = run_fresh(f"""
        import datetime, threading
        import torch.distributed as dist
        from pytest_nccl.rank import tracer
        from pytest_nccl.rank.stacks import THREAD_PREFIX
        tracer.install()
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
        store.set("k", "v")
        tracer.start({str(journal)!r})
        for name in (THREAD_PREFIX + "decider", "weight-sync"):
            t = threading.Thread(target=store.get, args=("k",), name=name)
            t.start()
            t.join()
        store.get("k")
        tracer.stop()
        print(sum("store.get" in line for line in open({str(journal)!r})))
    """)
    assert out.split() == ["2"], out


def test_the_watch_rotates_only_its_own_journal(tmp_path):
    """In a watched process the session's own per-test trace (SPMD mode, the rank loop) replaces the
    watch's while a test runs; the watch's agent bounds its journal by ``dup2`` onto the active
    trace's descriptor, which then was the test's journal."""
    ours, theirs = tmp_path / "journal-0.txt", tmp_path / "test.txt"
    out = run_fresh(f"""
        from pytest_nccl.rank import tracer
        tracer.start({str(ours)!r})
        print(tracer.journal_fd({str(ours)!r}) >= 0)
        tracer.start({str(theirs)!r})
        print(tracer.journal_fd({str(ours)!r}))
    """)
    assert out.split() == ["True", "-1"], out


@pytest.mark.parametrize("wait", ["store-get", "transfer"])
def test_a_wait_that_outlives_its_trace_returns_normally(tmp_path, wait):
    """A thread of the job waits when the test's trace ends: in ``store.get`` (SPMD mode's decider on
    rank 0, a user's weight-sync thread) or on an async transfer (``Work.wait``). Its journal line
    came after the trace closed its descriptor: written to descriptor -1, it raised ``OSError:
    [Errno 9] Bad file descriptor`` in that thread (a soak's round failed a passing test with it).
    It goes to /dev/null now, and the journal's own descriptor is closed at the next trace's end."""
    job = tmp_path / "job.py"
    journal = tmp_path / "journal.txt"
    job.write_text(textwrap.dedent(f"""
        import datetime, os, subprocess, sys, threading
        import torch
        import torch.distributed as dist
        timeout = datetime.timedelta(seconds=60)
        if len(sys.argv) > 1:  # rank 1 of the transfer: sends once rank 0's trace has ended
            store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False, timeout=timeout)
            dist.init_process_group("gloo", store=store, rank=1, world_size=2)
            store.get("go")
            dist.send(torch.ones(1), dst=0)
            dist.destroy_process_group()
            sys.exit()
        from pytest_nccl.rank import tracer
        tracer.install()
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
        transfer = {wait == "transfer"}
        if transfer:
            rank1 = subprocess.Popen([sys.executable, __file__, str(store.port)])
            dist.init_process_group("gloo", store=store, rank=0, world_size=2)
        tracer.start({str(journal)!r})
        received, raised = torch.zeros(1), []
        def wait():
            try:
                if transfer:
                    dist.irecv(received, src=1).wait()
                else:
                    received.fill_(float(store.get("go")))
            except Exception as exc:
                raised.append(repr(exc))
        t = threading.Thread(target=wait)
        t.start()
        while ("\\nW\\t" if transfer else "store.get") not in open({str(journal)!r}).read():
            pass
        tracer.stop()
        dist.TCPStore("127.0.0.1", store.port, 2, False, timeout=timeout).set("go", "1")  # a client of its own
        t.join(60)
        tracer.start({str(tmp_path / "next.txt")!r})  # the next test's trace
        tracer.stop()
        fds = os.listdir("/proc/self/fd")
        open_journals = [fd for fd in fds if os.path.realpath(f"/proc/self/fd/{{fd}}").endswith("journal.txt")]
        if transfer:
            rank1.wait(60)
            dist.destroy_process_group()
        print(raised or "fine", received.item(), len(open_journals))
    """))
    out = run_fresh(f"import runpy; runpy.run_path({str(job)!r}, run_name='__main__')")
    assert out.split() == ["fine", "1.0", "0"], out
