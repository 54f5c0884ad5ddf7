"""What the diagnosis finds: the first place the ranks' sequences part (``Divergence``) and the
verdict on a call (``Diagnosis``: kind, headline, the ranks at fault)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..records import CollectiveRecord
from ..states import Kind


@dataclass
class Divergence:
    """The first place where the ranks' collective sequences part."""
    pg: str
    seq: int                                  # 1-based position in the group where they part
    records: dict[int, CollectiveRecord]      # member rank -> its record at seq (if it has one)
    absent: list[int]                         # members with no record at seq
    kind: Kind                                # one of MISMATCH_KINDS, or Kind.RANK_LEFT (members absent)


@dataclass
class Diagnosis:
    kind: Kind
    headline: str
    ranks: list[int] = field(default_factory=list)   # the rank(s) at fault
    pg: str | None = None
    seq: int | None = None
    divergence: Divergence | None = None

    def __post_init__(self):
        self.kind = Kind(self.kind)  # a kind that travelled by name (SPMD's verdict) is a Kind again

    @property
    def exception_name(self) -> str:
        return self.kind.exception_name
