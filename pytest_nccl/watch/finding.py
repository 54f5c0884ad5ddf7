"""What the watch concluded of a job (or of one of the launcher's attempts): the views and the
diagnosis the judge gave, with what the report needs to print the ranks' own numbers."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.diagnosis import Diagnosis
from ..core.states import Reason


@dataclass
class Finding:
    """What the watch concluded."""
    reason: Reason
    views: list
    diagnosis: Diagnosis | None
    elapsed: float
    backend: str
    bases: dict                      # group -> collectives before the window (renumbering)
    counts: dict                     # rank -> {group: collectives entered}
    fr_pickles: dict = field(default_factory=dict)

    @property
    def verdict(self) -> Diagnosis:
        """The diagnosis of a finding that has one (every finding the watch reports)."""
        if self.diagnosis is None:
            raise ValueError("pytest-nccl watch: a clean finding has no verdict")
        return self.diagnosis
