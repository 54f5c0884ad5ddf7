"""Merging the Flight Recorder's entries with the Python journal, on hand-written data."""

import json

from pytest_nccl.core.flight import group_name_of, merge, records_from_dump
from pytest_nccl.core.records import CollectiveRecord
from pytest_nccl.core.states import RecordState


def entry(seq, op="all_reduce", pg="0", sizes=((20,),), created=2_000, retired=True, p2p=False):
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "process_group": [pg, "default_pg"],
            "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"], "time_created_ns": created,
            "retired": retired, "is_p2p": p2p}


def test_cpp_entries_fill_the_gaps_numbered_by_the_groups_own_sequence():
    python = [CollectiveRecord(0, "default", 1, "all_reduce", "[4]", "float32", fr_seq=11, t_start=0.1),
              CollectiveRecord(0, "default", 2, "all_gather_object", fr_seq=13, fr_seq_end=14, t_start=0.3)]
    dump = json.dumps({"entries": [entry(10, created=500),            # before the call: dropped
                                   entry(11), entry(12, "broadcast", created=2_500),
                                   entry(13, "all_gather"), entry(14, "all_gather"),  # inside the object op
                                   entry(15, retired=False, created=3_000),
                                   entry(1, p2p=True)]})
    recorded = records_from_dump(dump, rank=0, since_ns=1_000)
    assert [r.fr_seq for r in recorded] == [11, 12, 13, 14, 15]
    merged = merge({0: python}, {0: recorded})[0]
    assert [(r.seq, r.op, r.source) for r in merged] == [
        (1, "all_reduce", "python"), (2, "broadcast", "flight-recorder"),
        (3, "all_gather_object", "python"), (4, "all_reduce", "flight-recorder")]  # 14 ran inside #3
    assert merged[1].shapes == "[20]" and merged[1].dtype == "float32"
    assert merged[3].pending and not merged[1].pending


def test_positions_after_a_composite_op_follow_on_without_a_gap():
    """all_gather_object is one record that used two sequence ids: the next collective is the next
    position on every rank, as the referee and the diagnosis count positions (records_in)."""
    python = {r: [CollectiveRecord(r, "default", 1, "all_gather_object", fr_seq=5, fr_seq_end=6),
                  CollectiveRecord(r, "default", 2, "all_reduce", fr_seq=7)] for r in (0, 1)}
    python[1].append(CollectiveRecord(1, "default", 3, "barrier", fr_seq=8))
    merged = merge(python, {})
    assert [[r.seq for r in merged[rank]] for rank in (0, 1)] == [[1, 2], [1, 2, 3]]


def test_group_names_line_up_with_journal_labels():
    assert group_name_of("default") == "0" and group_name_of("pg3[0,1]") == "3"
    python = [CollectiveRecord(1, "pg3[0,1]", 1, "all_reduce", fr_seq=1)]
    merged = merge({1: python}, {1: records_from_dump(json.dumps({"entries": [entry(2, pg="3")]}), 1)})[1]
    assert [(r.pg, r.seq) for r in merged] == [("pg3[0,1]", 1), ("pg3[0,1]", 2)]
    assert records_from_dump("not json", 0) == []


def test_numbering_stays_aligned_when_one_ring_buffer_dropped_entries():
    """Rank 1's Flight Recorder kept only its last entries: numbers still match across ranks."""
    full = [entry(seq, created=2_000 + seq) for seq in range(100, 106)]
    dumps = {0: records_from_dump(json.dumps({"entries": full}), 0, 1_000),
             1: records_from_dump(json.dumps({"entries": full[3:]}), 1, 1_000)}
    merged = merge({0: [], 1: []}, dumps)
    assert [r.seq for r in merged[0]] == [1, 2, 3, 4, 5, 6]
    assert [r.seq for r in merged[1]] == [4, 5, 6]


def test_an_nccl_entry_whose_work_did_not_complete_puts_the_covered_record_in_flight():
    """NCCL's wait_tensor returns before the work completed: the journal says completed, the Flight
    Recorder's entry does not; merged, the record is in flight. gloo's entries never do that."""
    def python():
        return [CollectiveRecord(0, "default", 1, "all_reduce", "[4]", "float32", fr_seq=11, t_start=0.1,
                                 state=RecordState.COMPLETED)]

    def dump(backend, state, retired=False):
        e = dict(entry(11, retired=retired), profiling_name=f"{backend}:all_reduce", state=state)
        return records_from_dump(json.dumps({"entries": [e]}), rank=0, since_ns=1_000)

    assert merge({0: python()}, {0: dump("nccl", "scheduled")})[0][0].state == "in-flight"
    assert merge({0: python()}, {0: dump("nccl", "started")})[0][0].state == "in-flight"
    assert merge({0: python()}, {0: dump("nccl", "completed")})[0][0].state == "completed"
    assert merge({0: python()}, {0: dump("nccl", "scheduled", retired=True)})[0][0].state == "completed"
    assert merge({0: python()}, {0: dump("gloo", "scheduled")})[0][0].state == "completed"
