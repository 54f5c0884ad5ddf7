"""When a collective on a CUDA tensor is complete (issue 41, measured on an H200 with torch 2.11):
a synchronous NCCL call's group method returns no Work there, so the tracer marks the current
stream instead (an event recorded once the call, or its Work.wait, returned), which c10d orders
after the collective whatever the release returns. CPU-only here: a fake event stands in for
CUDA's, and a fake tensor for a CUDA one (the tracer reads only its device)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_fresh

from pytest_nccl.rank import trace_completion as completion
from pytest_nccl.rank.trace_core import GroupTrace


class FakeEvent:
    """torch.cuda.Event as the tracer uses it: recorded on the current stream, then queried."""

    done = False
    recorded = 0
    streams: list = []

    def record(self, stream=None):
        FakeEvent.recorded += 1
        FakeEvent.streams.append(stream)

    def query(self):
        return FakeEvent.done


class OnCuda:
    device = torch.device("cuda", 1)


class Work:
    def __init__(self, done: bool):
        self.done = done

    def is_completed(self):
        return self.done


def group(early: int) -> GroupTrace:
    g = GroupTrace("default", "", None)
    g.early = early
    return g


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeEvent.done, FakeEvent.recorded, FakeEvent.streams = False, 0, []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("current stream of", device))


def test_a_cuda_tensors_collective_completes_when_the_current_stream_got_past_it(fake_cuda):
    g = group(completion.ON_STREAM)
    assert completion.watched(g, OnCuda()) == completion.BY_STREAM
    held = completion.incomplete(g, OnCuda(), None)  # torch 2.11: the sync call gave no Work
    assert isinstance(held, completion.StreamMark) and FakeEvent.recorded == 1
    # the tensor's device's stream, whatever device is current (c10d orders that one after the call)
    assert FakeEvent.streams == [("current stream of", torch.device("cuda", 1))]
    assert not held.is_completed() and not completion.completed_work(held)
    FakeEvent.done = True
    assert held.is_completed() and completion.completed_work(held)
    # a stream that ran it by the time the call returned: complete at once, nothing to poll
    assert completion.incomplete(g, OnCuda(), Work(False)) is None


def test_after_a_wait_the_stream_is_marked_whatever_the_work_says(fake_cuda):
    held = completion.pending_after(completion.BY_STREAM, Work(True))
    assert isinstance(held, completion.StreamMark)  # the Work's own word is not asked
    FakeEvent.done = True
    assert completion.pending_after(completion.BY_STREAM, Work(False)) is None


def test_other_tensors_keep_their_works_word(fake_cuda):
    for early, value, mode in [(completion.ON_STREAM, torch.ones(1), completion.BY_WORK),  # a Python backend
                               (completion.BY_DEVICE, torch.ones(1), completion.ON_ITS_RETURN),  # cpu:gloo
                               (completion.BY_DEVICE, OnCuda(), completion.BY_STREAM),  # cuda:nccl
                               (completion.ON_RETURN, OnCuda(), completion.ON_ITS_RETURN)]:  # gloo
        assert completion.watched(group(early), value) == mode, (early, value)
    g = group(completion.ON_STREAM)
    pending = Work(False)
    assert completion.incomplete(g, torch.ones(1), pending) is pending
    assert completion.incomplete(g, torch.ones(1), Work(True)) is None
    assert completion.incomplete(g, torch.ones(1), None) is None
    assert completion.incomplete(group(completion.ON_RETURN), OnCuda(), pending) is None
    assert FakeEvent.recorded == 0


def test_nothing_is_recorded_on_a_stream_that_captures_a_cuda_graph(fake_cuda, monkeypatch):
    """A collective captured into a CUDA graph runs at the graph's replay; an event recorded and
    queried during the capture would end it (healthy code failed)."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert completion.pending_after(completion.BY_STREAM, Work(False)) is None
    assert FakeEvent.recorded == 0


def test_the_flusher_thread_queries_in_thread_local_capture_mode(monkeypatch):
    """NCCL's watchdog does the same: in the default (global) capture mode, an event query from any
    thread while another captures a CUDA graph invalidates that capture (pytorch/pytorch#148594)."""
    asked = []

    class Runtime:
        def cudaThreadExchangeStreamCaptureMode(self, mode):  # noqa: N802 (the runtime's name)
            asked.append(mode._obj.value)
            return 0  # cudaSuccess

    monkeypatch.setattr(completion, "_loaded_cudart", Runtime)
    assert completion.lenient_capture_mode() and asked == [1]  # cudaStreamCaptureModeThreadLocal
    monkeypatch.setattr(completion, "_loaded_cudart", lambda: None)  # a runtime linked statically
    assert not completion.lenient_capture_mode()


def test_a_group_method_that_returns_no_work_is_complete_when_it_returns(tmp_path):
    """A group's own method called directly whose options make it synchronous returns no Work on
    NCCL (torch 2.11): its record is closed when it returns (held on the stream for a CUDA tensor),
    never left open as if its Work were still to be waited for."""
    out = run_fresh(f"""
        import torch, torch.distributed as dist
        from pytest_nccl.rank import trace_groups, tracer
        from pytest_nccl.core.journal import read_journal

        class Synchronous(dist.ProcessGroup):
            def __init__(self):
                super().__init__(0, 1)

            def getBackendName(self):
                return "synchronous"

            def allreduce(self, tensors, opts=None):
                return None

        tracer.install()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = Synchronous()
        trace_groups.adopt_group(group)
        path = {str(tmp_path / "journal")!r}
        tracer.start(path)
        group.allreduce([torch.ones(2)])
        _, dangling = tracer.stop()
        print([(r.op, str(r.state)) for r in read_journal(path, 0)], dangling)
    """)
    assert out.strip() == "[('all_reduce', 'completed')] 0", out
