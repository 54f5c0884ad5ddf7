"""Rank side of ``pytest-nccl watch``: whether a default group is pytest-nccl's own (a rank of a
pytest-nccl session inside the watched job, which judges its collectives itself: ``RankInfo.self_judged``).
Standard library only; ``inject.py`` asks it once per ``init_process_group``."""

from __future__ import annotations

# the modules from which pytest-nccl's own ranks create their default group: the forked ranks' loop
# (the adopted tests of torch's harnesses run inside it) and SPMD mode's group
OWN_RANKS = ("pytest_nccl.rank.loop", "pytest_nccl.spmd.group")


def created_by_pytest_nccl(frame) -> bool:
    """``init_process_group`` called (at any depth) from pytest-nccl's own ranks: a pytest-nccl
    session inside the watched job (``pytest-nccl watch -- torchrun -m pytest``, or a test that runs
    one) judges that rank's collectives itself, test by test; judged twice, one hang would get two
    verdicts, the outer one ending a session whose inner one goes on to the next test."""
    while frame is not None:
        if frame.f_globals.get("__name__") in OWN_RANKS:
            return True
        frame = frame.f_back
    return False
