"""The watch's JSON files (``rank-R.json``, ``joining-PID.json``) as dataclasses with one decoder: what a
rank writes reads back the same, and a file that lacks keys, has numbers as text or keys it does not
know still reads (a rank of another version, a test's file)."""

import json

from pytest_nccl.core import jobdir
from pytest_nccl.core.jobdir import JoiningNote, RankInfo


def test_a_rank_info_reads_back_as_written(tmp_path):
    info = RankInfo(rank=3, world=8, local_rank="3", pid=1234, start=99, host="node0", backend="gloo", t0=1.5,
                    argv=["train.py"], attempt=1, max_restarts=2, local_world="4", node="0",
                    master_addr="10.0.0.1", master_port="29500", run_id="job7", self_judged=True)
    path = jobdir.rank_info(str(tmp_path), 3)
    jobdir.write_json(path, info.to_dict())
    assert jobdir.read_rank_info(path) == info
    # the file keeps the keys and the order the watch and other nodes always read
    assert list(json.loads(open(path).read())) == [
        "rank", "world", "local_rank", "pid", "start", "host", "backend", "t0", "argv", "attempt", "max_restarts",
        "local_world", "node", "master_addr", "master_port", "run_id", "self_judged"]
    assert info.local_ranks == 4 and RankInfo().local_ranks is None


def test_the_decoder_is_lenient():
    info = RankInfo.decode({"rank": "2", "world": 4, "pid": "77", "start": None, "host": None, "extra": 1})
    assert info == RankInfo(rank=2, world=4, pid=77, start=None, host="")
    assert RankInfo.decode({"world": "x"}) == RankInfo(world=0)
    for not_an_object in (None, [], "rank", 3):
        assert RankInfo.decode(not_an_object) is None and JoiningNote.decode(not_an_object) is None


def test_a_joining_note(tmp_path):
    note = JoiningNote(pid=10, start=5, host="h", t=2.0, rank=0, world=4, site="train.py:7",
                       what="init_process_group", local_world=2)
    path = jobdir.joining(str(tmp_path), 10)
    jobdir.write_json(path, note.to_dict())
    assert jobdir.read_joining(path) == note
    assert JoiningNote.decode({"pid": 10, "rank": "1", "world": None, "site": None}) == JoiningNote(pid=10, rank=1)
    assert jobdir.read_joining(str(tmp_path / "gone.json")) is None
    with open(path, "w") as f:
        f.write('{"pid": 1')  # half a file
    assert jobdir.read_joining(path) is None


def test_a_process_waiting_again_elsewhere_is_a_new_wait(tmp_path):
    """OpenRLHF's trainer joins its default group and, right after, the weight-sync group: if the
    watch reads its ``init_process_group`` note and then (one read later) its side group's, the side
    group's wait starts at that read, as a member of that group, not as the old wait."""
    import os
    import socket

    from pytest_nccl.watch.engine.joining import JoiningProcesses
    from pytest_nccl.watch.engine.outcome import Waits

    pid, path = os.getpid(), jobdir.joining(str(tmp_path), os.getpid())

    def note(**fields):
        jobdir.write_json(path, JoiningNote(pid=pid, start=jobdir.process_start(pid), host=socket.gethostname(),
                                            site="train.py:7", **fields).to_dict())

    processes = JoiningProcesses(str(tmp_path))
    note(rank=0, world=2, what="init_process_group")
    assert [(j.waits, j.since) for j in processes.read(now=100.0)] == [(Waits.INIT, 100.0)]
    assert [(j.waits, j.since) for j in processes.read(now=105.0)] == [(Waits.INIT, 100.0)]  # the same wait
    note(rank=0, world=4, what="group", group="weight-sync", store="127.0.0.1:29500")
    [waiting] = processes.read(now=106.0)
    assert (waiting.waits, waiting.since, waiting.group, waiting.world) == (Waits.GROUP, 106.0, "weight-sync", 4)
    assert processes.read(now=110.0) == [waiting]
    os.unlink(path)
    assert processes.read(now=111.0) == []
