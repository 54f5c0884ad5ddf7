"""``pytest-nccl explain`` on dumps written here in NCCL's schema (what gloo cannot produce: states
scheduled, started and completed with durations, point-to-point entries, coalesced ops, a TP x DP
cascade), and on input it cannot read. Pure: no torch, no process."""

from __future__ import annotations

import io
import json
import pickle

import pytest

from pytest_nccl.core.frdump import FrGroup, Numbering, RankDump, records_of, summarize, window
from pytest_nccl.core.states import RecordState
from pytest_nccl.explain.cli import main
from pytest_nccl.explain.consistency import Refused
from pytest_nccl.explain.verdict import explain

TORCH = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def frames(line: int, file: str = "/job/train.py") -> list[dict]:
    return [{"name": "all_reduce", "filename": TORCH, "line": 2800},
            {"name": "step", "filename": file, "line": line},
            {"name": "<module>", "filename": "/job/main.py", "line": 3}]


class Rank:
    """One rank's Flight Recorder, as NCCL fills it: record ids count up, the buffer keeps the last
    ``size`` entries."""

    def __init__(self, rank: int, groups: dict[str, tuple[str, tuple[int, ...]]], size: int = 2000):
        self.rank, self.groups, self.size = rank, groups, size
        self.entries: list[dict] = []
        self.seq: dict[str, int] = {}
        self.p2p: dict[str, int] = {}
        self.next_id = 0

    def op(self, name: str, op: str, state: str = "completed", sizes=((4, 8),), line: int = 10,
           p2p: str = "", same_seq: bool = False, dtype: str = "Float") -> None:
        counter = self.p2p if p2p else self.seq
        if not same_seq:
            counter[name] = counter.get(name, 0) + 1
        entry = {
            "record_id": self.next_id, "pg_id": list(self.groups).index(name),
            "process_group": (name, self.groups[name][0]),
            "collective_seq_id": self.seq.get(name, 0), "p2p_seq_id": self.p2p.get(name, 0), "op_id": self.next_id,
            "profiling_name": f"nccl:{op}{' ' + p2p if p2p else ''}", "time_created_ns": 10**18 + self.next_id * 1000,
            "duration_ms": 1.5 if state == "completed" else None,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
            "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype] * len(sizes),
            "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": bool(p2p),
            "frames": frames(line), "thread_id": "1", "thread_name": "pt_main_thread"}
        self.next_id += 1
        self.entries = (self.entries + [entry])[-self.size:]

    def dump(self, version: str = "2.10") -> dict:
        return {"version": version, "comm_lib_version": "2.28.3",
                "pg_config": {name: {"name": name, "desc": desc, "ranks": str(list(ranks))}
                              for name, (desc, ranks) in self.groups.items()},
                "pg_status": {str(i): {"last_enqueued_collective": self.seq.get(n, 0),
                                       "last_started_collective": -1, "last_completed_collective": -1}
                              for i, n in enumerate(self.groups)},
                "entries": list(self.entries)}


def summaries(ranks: list[Rank], **kw) -> list[RankDump]:
    return [summarize(r.dump(**kw), r.rank, f"/dumps/nccl_trace_rank_{r.rank}") for r in ranks]


def world_groups(world: int, tp: int) -> tuple[dict, dict, dict]:
    """c10d groups of a TP x DP job: name -> (desc, ranks); and each rank's TP and DP group names."""
    groups = {"0": ("default_pg", tuple(range(world)))}
    tp_of, dp_of = {}, {}
    for g in range(world // tp):
        groups[str(1 + g)] = (f"tp_{g}", tuple(range(g * tp, (g + 1) * tp)))
        for r in range(g * tp, (g + 1) * tp):
            tp_of[r] = str(1 + g)
    base = 1 + world // tp
    for j in range(tp):
        groups[str(base + j)] = (f"dp_{j}", tuple(range(j, world, tp)))
        for r in range(j, world, tp):
            dp_of[r] = str(base + j)
    return groups, tp_of, dp_of


def tp_dp_job(world: int, tp: int, steps: int, culprit: int, size: int = 2000) -> list[Rank]:
    """Every rank runs ``steps`` of (TP all_reduce, DP reduce_scatter); at the last step ``culprit``
    never enters its TP all_reduce, its TP peers wait there, and every other rank waits in its DP
    reduce_scatter for the members of the stuck TP group."""
    groups, tp_of, dp_of = world_groups(world, tp)
    out = []
    stuck = set(range(culprit - culprit % tp, culprit - culprit % tp + tp))
    for r in range(world):
        rank = Rank(r, {n: groups[n] for n in groups if n == "0" or r in groups[n][1]}, size)
        for _ in range(steps - 1):
            rank.op(tp_of[r], "all_reduce", line=40)
            rank.op(dp_of[r], "reduce_scatter", line=52)
        if r == culprit:
            pass  # busy elsewhere: it never enters the TP all_reduce of the last step
        elif r in stuck:
            rank.op(tp_of[r], "all_reduce", state="started", line=40)
        else:
            rank.op(tp_of[r], "all_reduce", line=40)
            rank.op(dp_of[r], "reduce_scatter", state="started", line=52)
        out.append(rank)
    return out


def test_the_window_keeps_each_groups_last_completed_entries_and_all_after():
    rank = Rank(0, {"0": ("default_pg", (0, 1)), "1": ("tp_0", (0, 1))})
    for _ in range(10):
        rank.op("0", "all_reduce")
    rank.op("1", "broadcast")
    rank.op("0", "all_reduce", state="started")
    rank.op("0", "all_reduce", state="scheduled")
    kept, oldest = window(rank.entries, keep=3)
    assert [(e["process_group"][0], e["collective_seq_id"]) for e in kept] == [
        ("0", 8), ("0", 9), ("0", 10), ("1", 1), ("0", 11), ("0", 12)]
    assert oldest == {("0", False): 1, ("1", False): 1}


def test_nccl_states_become_in_flight_records_with_durations_and_the_users_line():
    rank = Rank(0, {"0": ("default_pg", (0, 1))})
    rank.op("0", "all_reduce", line=7)
    rank.op("0", "all_gather", state="started", line=8)
    rank.op("0", "broadcast", state="scheduled", line=9)
    dump = summarize(rank.dump(), 0, "x")
    recs = records_of(dump, {"0": Numbering("default", 1, (0, 1))})
    assert [(r.op, r.number, r.state) for r in recs] == [
        ("all_reduce", 1, RecordState.COMPLETED), ("all_gather", 2, RecordState.IN_FLIGHT),
        ("broadcast", 3, RecordState.IN_FLIGHT)]
    assert recs[0].duration == pytest.approx(0.0015) and recs[1].duration is None
    assert recs[1].site == "/job/train.py:8 <- /job/main.py:3"  # torch's own frame left out
    assert recs[0].shapes == "[4, 8]" and recs[0].dtype == "float32"


def test_p2p_entries_pair_by_their_own_sequence_with_global_peers():
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "5": ("pp", (1, 3))}
    rank = Rank(3, groups)
    rank.op("5", "send", p2p="1->0")   # group rank 1 (global 3) to group rank 0 (global 1)
    rank.op("5", "recv", state="started", p2p="1<-0")
    recs = records_of(summarize(rank.dump(), 3, "x"), {"0": Numbering("default", 1, (0, 1, 2, 3)),
                                                         "5": Numbering("pp[1,3]", 1, (1, 3))})
    assert [(r.pg, r.op, r.seq, r.p2p[0].peer, r.p2p[0].send, r.state) for r in recs] == [
        ("pp[1,3]:p2p", "send", 1, 1, True, RecordState.COMPLETED),
        ("pp[1,3]:p2p", "recv", 2, 1, False, RecordState.IN_FLIGHT)]


def test_coalesced_entries_of_one_sequence_id_are_one_record():
    rank = Rank(0, {"0": ("default_pg", (0, 1)), "1": ("pp", (0, 1))})
    rank.op("1", "send", p2p="0->1")
    rank.op("1", "recv", p2p="0<-1", same_seq=True, state="started")
    rank.op("0", "all_reduce", sizes=((4,),))
    rank.op("0", "all_reduce", sizes=((2,),), same_seq=True)
    rank.op("0", "coalesced", sizes=(), same_seq=True)
    recs = records_of(summarize(rank.dump(), 0, "x"), {"0": Numbering("default", 1, (0, 1)),
                                                        "1": Numbering("pp[0,1]", 1, (0, 1))})
    assert [r.op for r in recs] == ["batch_isend_irecv", "all_reduce"]
    assert [(p.send, p.peer) for p in recs[0].p2p] == [(True, 1), (False, 1)]
    assert recs[0].state == RecordState.IN_FLIGHT and recs[1].number == 1


def test_a_tp_dp_cascade_is_one_finding_the_root_and_one_line_for_who_waits_behind_it():
    ranks = tp_dp_job(world=64, tp=8, steps=30, culprit=19)
    result = explain(summaries(ranks))
    diag = result.diagnosis
    assert diag is not None and diag.ranks == [19] and diag.pg == "tp_2[16-23]", diag
    head = diag.headline
    assert head.startswith("rank 19 is in no collective since reduce_scatter #29 of group "
                           "dp_3[3,11,19,27,35,43,51,59] from /job/train.py:52"), head
    assert "ranks 16-18,20-23 wait for all_reduce #30 of group tp_2[16-23] from /job/train.py:40" in head
    assert head.endswith("; behind it, ranks 0-15,24-63 wait in reduce_scatter #30 of dp_* for members of "
                         "tp_2[16-23]"), head


def test_a_wrapped_buffer_is_said_where_the_verdict_reads_that_group():
    ranks = tp_dp_job(world=16, tp=4, steps=40, culprit=5, size=50)
    result = explain(summaries(ranks))
    assert result.diagnosis is not None and result.diagnosis.ranks == [5]
    assert any(g.startswith("the ring buffer of ranks 0-15 wrapped") and "(group tp_1[4-7]: rank 4 from #16, "
               in g for g in result.gaps), result.gaps


def test_healthy_nccl_dumps_say_what_is_in_flight():
    groups = {"0": ("default_pg", (0, 1))}
    ranks = [Rank(r, groups) for r in range(2)]
    for rank in ranks:
        rank.op("0", "all_reduce")
        rank.op("0", "all_gather", state="started")
    result = explain(summaries(ranks))
    assert result.diagnosis is None
    assert result.progress == ["group default: last completed all_reduce #1; all_gather #2 in flight on ranks 0,1"]


def test_dumps_of_different_torch_versions_are_refused_in_one_line():
    groups = {"0": ("default_pg", (0, 1))}
    ranks = [Rank(r, groups) for r in range(2)]
    for rank in ranks:
        rank.op("0", "all_reduce")
    dumps = [summarize(ranks[0].dump("2.10"), 0, "a"), summarize(ranks[1].dump("2.7"), 1, "b")]
    with pytest.raises(Refused, match=r"different torch versions \(rank 0: schema 2.10; rank 1: schema 2.7\)"):
        explain(dumps)


def test_a_dump_older_than_what_another_member_completed_is_refused():
    groups = {"0": ("default_pg", (0, 1))}
    old, new = Rank(0, groups), Rank(1, groups)
    for _ in range(3):
        old.op("0", "all_reduce")
    for _ in range(9):
        new.op("0", "all_reduce")
    with pytest.raises(Refused, match="rank 0's dump ends at collective #3 of group default, but rank 1 completed #9"):
        explain(summaries([old, new]))


def test_a_survivor_s_last_collective_marked_completed_past_a_gone_member_is_where_it_waits():
    """A collective that failed once a member was gone is marked completed (NCCL after an abort,
    gloo when the peer closes): rank 0's last, #3, one past rank 1's dump, is read as not completed."""
    groups = {"0": ("default_pg", (0, 1))}
    survivor, gone = Rank(0, groups), Rank(1, groups)
    for rank in (survivor, gone):
        rank.op("0", "all_reduce", line=10)
        rank.op("0", "all_reduce", line=10)
    survivor.op("0", "all_reduce", line=12)
    result = explain(summaries([survivor, gone]))
    head = result.diagnosis.headline
    assert head.startswith("rank 1 is in no collective since all_reduce #2 of group default"), head
    assert "rank 0 waits for all_reduce #3 of group default from /job/train.py:12" in head, head
    assert result.gaps == ["rank 0's all_reduce #3 of group default is marked completed, but rank 1 never entered "
                           "it: it ended with an error once rank 1 was gone (a Flight Recorder marks a failed "
                           "collective completed), and is read as not completed"]


def test_a_completed_collective_a_member_never_entered_with_more_after_it_is_refused():
    """Past the one collective it failed in, a rank entered another: not an error once a member was
    gone, the member's dump is older."""
    groups = {"0": ("default_pg", (0, 1))}
    ahead, behind = Rank(0, groups), Rank(1, groups)
    for _ in range(2):
        ahead.op("0", "all_reduce")
        behind.op("0", "all_reduce")
    ahead.op("0", "all_reduce")
    ahead.op("0", "all_reduce", state="started")
    with pytest.raises(Refused, match="rank 1's dump ends at collective #2 of group default, but rank 0 completed #3"):
        explain(summaries([ahead, behind]))


def test_a_group_the_dump_gives_ranks_for_is_labelled_as_the_tracer_labels_it():
    assert FrGroup("3", "tp_1", (8, 9, 10, 11)).label == "tp_1[8-11]"
    assert FrGroup("7", "undefined", (0, 2)).label == "pg7[0,2]"
    assert FrGroup("0", "default_pg", (0, 1)).label == "default"


# -- the command on input it cannot read: one line, exit 2 ------------------------------------

def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(args), out=out, err=err), out.getvalue(), err.getvalue()


class Evil:
    def __reduce__(self):
        return (eval, ("print('ran')",))


@pytest.mark.parametrize("content, why", [
    (b"", "empty"),
    (b"\x80\x04garbage", "not a Flight Recorder dump torch can have written"),
    (pickle.dumps({"version": "2.10"}), "no 'entries' list"),
    (pickle.dumps([1, 2]), "no 'entries' list"),
    (pickle.dumps(Evil()), "it names a class (builtins.eval"),
    (b"{not json", "not a Flight Recorder dump torch can have written"),
])
def test_a_file_that_is_no_dump_is_one_line_naming_it(tmp_path, content, why):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(content)
    code, out, err = run(str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(path) in err and why in err, err


@pytest.mark.parametrize("layout, why", [
    ({}, "no such file, folder or prefix of files"),
    ({"a_0": 1, "b_0": 1}, "holds dumps of several prefixes (a_, b_)"),
    ({"notes.txt": 1}, "no file named as torch names dumps"),
])
def test_paths_that_hold_no_dumps_are_one_line(tmp_path, layout, why):
    for name in layout:
        (tmp_path / name).write_bytes(pickle.dumps({"entries": []}))
    target = tmp_path if layout else tmp_path / "nothing_here_"
    code, _, err = run(str(target))
    assert code == 2 and why in err and err.count("\n") == 1, err


def test_a_file_without_a_rank_in_its_name_and_a_bad_world_are_usage_errors(tmp_path):
    path = tmp_path / "dump.pkl"
    path.write_bytes(pickle.dumps({"entries": []}))
    code, _, err = run(str(path))
    assert code == 2 and "its name does not end with a rank" in err
    assert run("--world", "0", str(path))[0] == 2
    assert run()[0] == 2


def test_json_dumps_are_read_as_pickles_are(tmp_path):
    groups = {"0": ("default_pg", (0, 1))}
    ranks = [Rank(r, groups) for r in range(2)]
    ranks[0].op("0", "all_reduce", state="started")
    for rank in ranks:
        dump = rank.dump()
        for entry in dump["entries"]:
            entry.pop("frames")  # the JSON form has none
        (tmp_path / f"nccl_trace_rank_{rank.rank}.json").write_text(json.dumps(dump))
    code, out, _ = run(str(tmp_path))
    assert code == 3, out
    assert "rank 1 is in no collective" in out and "rank 0 waits for all_reduce #1 of group default" in out
