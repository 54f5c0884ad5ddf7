"""The one builder of hand-written records and views for the tests of the pure analysis (the judge,
the referee, the diagnosis, the views): a float32 all_reduce of the default group, completed,
unless a test says otherwise. Each test module fixes what its headlines show (the call site, the
times) once, with ``functools.partial``."""

from __future__ import annotations

from pytest_nccl.core.records import CollectiveRecord, RankView
from pytest_nccl.core.states import RankState, RecordState

SITE = "/w/test_x.py:5"


def record(rank: int, seq: int, op: str = "all_reduce", shapes: str = "[4]",
           state: RecordState | str = RecordState.COMPLETED, pg: str = "default", *, dtype: str = "float32",
           site: str = SITE, t: float = 0.0, **fields) -> CollectiveRecord:
    """Collective #``seq`` of group ``pg`` as rank ``rank`` issued it, entered at ``t`` seconds."""
    return CollectiveRecord(rank=rank, pg=pg, seq=seq, op=op, shapes=shapes, dtype=dtype, state=RecordState(state),
                            site=site, t_start=t, **fields)


def view(rank: int, status: RankState | str, records: list, **fields) -> RankView:
    """What the controller knows of ``rank`` after a call."""
    return RankView(rank=rank, status=RankState(status), records=records, **fields)
