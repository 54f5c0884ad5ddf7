"""benchmarks/fr_synth.py: the synthesized Flight Recorder dumps hold what each scenario says, in the form
torch writes (its own loader reads them, its analyzer finds what it should)."""

from __future__ import annotations

import ast
import json
import logging
import os
import pickle
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import fr_synth  # noqa: E402

PREFIX = "nccl_trace_rank_"


def make(tmp_path, **kw):
    kw.setdefault("ranks", 16)
    kw.setdefault("tp", 4)
    kw.setdefault("entries", 60)
    out = tmp_path / kw["scenario"]
    truth = fr_synth.generate(str(out), jobs=1, **kw)
    return out, truth


def load(out, rank):
    with open(out / f"{PREFIX}{rank}", "rb") as f:
        return pickle.load(f)


def entries_of(dump, desc):
    return [e for e in dump["entries"] if e["process_group"][1] == desc]


def tp_peers(rank, tp):
    first = rank - rank % tp
    return range(first, first + tp)


def test_tp_skip_only_the_culprit_lacks_the_all_reduce(tmp_path):
    out, truth = make(tmp_path, scenario="tp_skip")
    culprit, tp = truth["culprit"], 4
    assert culprit == 9  # the middle TP group (2 of 4), index 1 in it
    group = f"tp_{culprit // tp}"
    k = truth["waits"][str(culprit - 1)]["seq"]
    assert truth["waits"][str(culprit)] is None
    for r in tp_peers(culprit, tp):
        ar = [e for e in entries_of(load(out, r), group)
              if e["collective_seq_id"] == k and e["profiling_name"] == "nccl:all_reduce"]
        if r == culprit:
            assert ar == []
            last = load(out, r)["entries"][-1]
            assert last["state"] == "completed" and last["retired"]
        else:
            assert len(ar) == 1 and ar[0]["state"] == "started" and not ar[0]["retired"]
            assert ar[0] == load(out, r)["entries"][-1]
            assert ar[0]["time_discovered_started_ns"] and ar[0]["time_discovered_completed_ns"] is None
            assert truth["waits"][str(r)] == {"group": group, "op": "nccl:all_reduce",
                                              "seq_kind": "collective_seq_id", "seq": k}
    # everyone else completed its own TP all_reduce #k and waits in the next DP reduce_scatter
    rs_seqs = set()
    for r in range(16):
        if r // tp == culprit // tp:
            continue
        dump = load(out, r)
        ar = [e for e in entries_of(dump, f"tp_{r // tp}") if e["collective_seq_id"] == k]
        assert [e["state"] for e in ar] == ["completed"]
        last = dump["entries"][-1]
        assert last["profiling_name"] == "nccl:_reduce_scatter_base" and last["state"] == "started"
        assert last["process_group"][1] == f"dp_{r % tp}"
        rs_seqs.add(last["collective_seq_id"])
    assert len(rs_seqs) == 1


def test_files_are_what_torch_writes_and_its_loader_reads(tmp_path):
    loader = pytest.importorskip("torch.distributed.flight_recorder.components.loader")
    out, truth = make(tmp_path, scenario="tp_skip", entries=50)
    for r in range(16):
        d = loader.read_dump(PREFIX, str(out / f"{PREFIX}{r}"))
        assert d["rank"] == r and d["version"] == "2.10" and len(d["entries"]) == 50
    dump = load(out, 5)
    assert list(dump) == ["version", "pg_config", "comm_lib_version", "pg_status", "entries"]
    assert dump["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(16)))},
        "2": {"name": "2", "desc": "tp_1", "ranks": "[4, 5, 6, 7]"},
        "6": {"name": "6", "desc": "dp_1", "ranks": "[1, 5, 9, 13]"},
    }
    assert set(dump["pg_status"]) == {"0", "1", "2"}
    e = dump["entries"][-1]
    assert list(e) == ["frames", "record_id", "pg_id", "process_group", "thread_name", "thread_id",
                       "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "time_created_ns",
                       "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state",
                       "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "timeout_ms",
                       "is_p2p"]
    assert isinstance(e["process_group"], tuple) and isinstance(e["thread_id"], str)
    done = dump["entries"][0]
    assert done["state"] == "completed" and done["duration_ms"] > 0
    assert done["time_discovered_started_ns"] < done["time_discovered_completed_ns"]
    # the first frame outside torch is the user's call site
    user = [f for f in e["frames"] if "/torch/" not in f["filename"]]
    assert user[0]["filename"] == "/workspace/train.py" and user[-1]["name"] == "<module>"
    assert "/torch/distributed/" in e["frames"][0]["filename"]


def test_ring_buffer_keeps_the_last_entries(tmp_path):
    out, truth = make(tmp_path, scenario="tp_skip", entries=37)
    firsts = set()
    for r in range(16):
        ids = [e["record_id"] for e in load(out, r)["entries"]]
        assert len(ids) == 37 and ids == list(range(ids[0], ids[0] + 37)) and ids[0] > 0
        firsts.add(ids[0])
    assert len(firsts) > 1  # the culprit recorded fewer: its window starts earlier
    # per group, seq ids count up without gaps inside the window
    dump = load(out, 0)
    seqs = [e["collective_seq_id"] for e in entries_of(dump, "tp_0")]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_healthy_every_rank_in_step(tmp_path):
    out, truth = make(tmp_path, scenario="healthy")
    lasts = set()
    for r in range(16):
        dump = load(out, r)
        states = [e["state"] for e in dump["entries"]]
        assert states[-1] == "started" and set(states[:-1]) == {"completed"}
        last = dump["entries"][-1]
        lasts.add((last["profiling_name"], last["collective_seq_id"], last["record_id"]))
    assert len(lasts) == 1
    assert truth["culprit"] is None and None not in truth["waits"].values()


def test_states_and_no_timing(tmp_path):
    out, _ = make(tmp_path, scenario="states")
    e = load(out, 3)["entries"]
    assert [x["state"] for x in e[-3:]] == ["started", "scheduled", "scheduled"]
    assert e[-4]["state"] == "completed" and e[-4]["retired"] is False and e[-5]["retired"] is True
    assert e[-1]["time_discovered_started_ns"] is None and "duration_ms" not in e[-1]
    fr_synth.generate(str(tmp_path / "nt"), jobs=1, ranks=16, tp=4, entries=30, scenario="tp_skip", timing=False)
    for x in load(tmp_path / "nt", 8)["entries"]:
        assert x["state"] in ("completed", "scheduled") and "duration_ms" not in x
        assert x["time_discovered_started_ns"] is None


def test_p2p_the_culprit_never_posts_its_recv(tmp_path):
    out, truth = make(tmp_path, scenario="p2p", pp=4)
    culprit = truth["culprit"]
    stage, first = culprit % 4, culprit - culprit % 4
    assert 0 < stage < 3
    up = load(out, culprit - 1)["entries"][-1]
    assert up["profiling_name"] == f"nccl:send {stage - 1}->{stage}" and up["state"] == "started"
    assert up["is_p2p"] and up["p2p_seq_id"] > 0 and up["collective_seq_id"] == 0
    recvs = [e for e in load(out, culprit)["entries"] if e["profiling_name"] == f"nccl:recv {stage}<-{stage - 1}"]
    sends = [e for e in load(out, culprit - 1)["entries"] if e["profiling_name"] == f"nccl:send {stage - 1}->{stage}"]
    assert len(sends) == len(recvs) + 1  # the one send nobody receives
    down = load(out, first + 3)["entries"][-1]
    assert down["profiling_name"] == "nccl:recv 3<-2" and down["state"] == "started"
    other = load(out, (first + 4) % 16)["entries"][-1]
    assert other["profiling_name"] == "nccl:all_reduce" and other["process_group"][1].startswith("dp_")
    assert load(out, culprit)["pg_config"][str(1 + culprit // 4)]["desc"] == f"pp_{culprit // 4}"


def test_coalesced_blocks(tmp_path):
    out, truth = make(tmp_path, scenario="coalesced", entries=80)
    e = load(out, 0)["entries"]
    names = [x["profiling_name"] for x in e]
    i = names.index("nccl:REDUCE_SCATTER_coalesced")
    block = e[i - 3:i + 1]
    assert [x["profiling_name"] for x in block[:3]] == ["nccl:_reduce_scatter_base"] * 3
    assert len({x["collective_seq_id"] for x in block}) == 1
    assert [x["op_id"] for x in block] == [block[0]["op_id"], block[0]["op_id"] + 1, block[0]["op_id"] + 2,
                                           block[0]["op_id"] + 2]
    j = names.index("nccl:coalesced")
    batch = e[j - 2:j + 1]
    assert [x["profiling_name"] for x in batch] == ["nccl:send 0->1", "nccl:recv 0<-3", "nccl:coalesced"]
    assert all(x["is_p2p"] for x in batch) and len({x["p2p_seq_id"] for x in batch}) == 1
    assert "nccl:allreduce_coalesced" in names and "nccl:all_gather_into_tensor_coalesced" in names
    # the culprit never entered the DP block: its DP peers sit in it, all entries of the block started
    culprit = truth["culprit"]
    for r in range(culprit % 4, 16, 4):
        if r != culprit:
            tail = load(out, r)["entries"][-4:]
            assert [x["state"] for x in tail] == ["started"] * 4
    old = fr_synth.generate(str(tmp_path / "old"), jobs=1, ranks=16, tp=4, entries=40, scenario="coalesced",
                            version="2.3")
    assert old["version"] == "2.3"
    names = [x["profiling_name"] for x in load(tmp_path / "old", 0)["entries"]]
    assert "nccl:REDUCE_SCATTER_coalesced" not in names and "nccl:_reduce_scatter_base" not in names


def test_behind(tmp_path):
    out, truth = make(tmp_path, scenario="behind", behind=3)
    culprit = truth["culprit"]
    last = load(out, culprit)["entries"][-1]
    for r in (0, 15):
        tail = load(out, r)["entries"][-3:]
        assert [x["state"] for x in tail] == ["started", "scheduled", "scheduled"]
        assert tail[-1]["collective_seq_id"] == last["collective_seq_id"] + 3
        assert tail[0]["process_group"] == ("0", "default_pg")


def test_missing(tmp_path):
    out, truth = make(tmp_path, scenario="missing")
    assert truth["missing"] == truth["culprit"] and truth["files"] == 15
    assert not (out / f"{PREFIX}{truth['culprit']}").exists()


@pytest.mark.parametrize("version,key", [("2.10", "comm_lib_version"), ("2.7", "nccl_version"), ("2.3", None)])
def test_versions(tmp_path, version, key):
    fr_synth.generate(str(tmp_path), jobs=1, ranks=8, tp=2, entries=10, scenario="healthy", version=version)
    dump = load(tmp_path, 0)
    assert dump["version"] == version
    assert {"comm_lib_version", "nccl_version"} & set(dump) == ({key} if key else set())
    assert ("thread_id" in dump["entries"][0]) == (version == "2.10")


def test_json_format(tmp_path):
    fr_synth.generate(str(tmp_path), jobs=1, ranks=8, tp=2, entries=10, scenario="tp_skip", fmt="json")
    d = json.loads((tmp_path / f"{PREFIX}0").read_text())
    assert d["nccl_comm_state"] == {} and all(isinstance(v, str) for v in d["pg_status"]["1"].values())
    e = d["entries"][-1]
    assert "frames" not in e and e["time_discovered_completed_ns"] == 0 and isinstance(e["process_group"], list)


def test_pool_writes_the_same_files(tmp_path):
    fr_synth.generate(str(tmp_path / "a"), jobs=1, ranks=32, tp=4, entries=20, scenario="tp_skip")
    fr_synth.generate(str(tmp_path / "b"), jobs=2, ranks=32, tp=4, entries=20, scenario="tp_skip")
    for r in (0, 17, 31):
        assert (tmp_path / "a" / f"{PREFIX}{r}").read_bytes() == (tmp_path / "b" / f"{PREFIX}{r}").read_bytes()


def test_bad_arguments(capsys):
    with pytest.raises(ValueError, match="multiple"):
        fr_synth.plan_scenario(fr_synth.Spec(ranks=10, tp=4))
    with pytest.raises(SystemExit):
        fr_synth.main(["/nonexistent-unused", "--ranks", "10", "--tp", "4"])
    assert "multiple of --tp" in capsys.readouterr().err


def test_fr_trace_finds_the_cascade(tmp_path, caplog):
    """torch's analyzer, in-process: one 'Not all ranks joining' per DP group and one for the TP group."""
    fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    out, truth = make(tmp_path, scenario="tp_skip", entries=40)
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        fr_trace.main([str(out), "--prefix", PREFIX])
    blocks = [r.getMessage() for r in caplog.records if "Not all ranks joining" in r.getMessage()]
    assert len(blocks) == 4 + 1
    caplog.clear()
    healthy, _ = make(tmp_path, scenario="healthy", entries=40)
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        fr_trace.main([str(healthy), "--prefix", PREFIX])
    assert not [r for r in caplog.records if "Not all ranks joining" in r.getMessage()]


def test_pg_config_ranks_parse_like_torch(tmp_path):
    fr_synth.generate(str(tmp_path), jobs=1, ranks=16, tp=4, entries=10, scenario="healthy")
    for r in (0, 6):
        for name, info in load(tmp_path, r)["pg_config"].items():
            ranks = ast.literal_eval(info["ranks"])
            assert r in ranks and info["name"] == name
