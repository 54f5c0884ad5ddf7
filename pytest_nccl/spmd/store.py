"""SPMD mode's use of the launcher's store: the key schema, and the one polling helper.

Every key lives under ``pytest-nccl/<run id>/<restart>/`` (a PrefixStore):

    proc/<rank>               the rank's process (``liveness.RankProcess``), from its start
    collect/<rank>            the rank's collected test ids (JSON), or {"gone": true}
    end/done/<rank>           unmarked tests that failed on that rank (JSON), at the end
    end/bye                   rank 0 has written its report
    end/left/<rank>           the rank has left
    pg<gen>/...               the default process group of generation <gen>
    t/<nodeid hash>/<n>/...   one run of a marked test: ``TestKeys``
"""

from __future__ import annotations

import time

from .timing import TIMING

PROC = "proc/{}"
COLLECT = "collect/{}"
DONE = "end/done/{}"
BYE = "end/bye"
LEFT = "end/left/{}"


class TestKeys:
    """The keys of one run of a marked test, under ``t/<hash>/<n>/``."""

    __test__ = False  # not a pytest test class

    def __init__(self, prefix: str):
        self.prefix = prefix

    def _k(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def start(self, rank: int) -> str:       # the rank entered the test (its wall-clock start)
        return self._k(f"start/{rank}")

    def journal(self, rank: int) -> str:     # the rank's journal lines so far (appended)
        return self._k(f"journal/{rank}")

    def journal_length(self, rank: int) -> str:
        return self._k(f"jlen/{rank}")

    def outcome(self, rank: int) -> str:     # how the test ended on the rank (pickled dict)
        return self._k(f"out/{rank}")

    def snapshot(self, rank: int) -> str:    # stacks and journal of a rank still in the test
        return self._k(f"snap/{rank}")

    @property
    def decision(self) -> str:               # rank 0 decided: every rank still in the test snapshots
        return self._k("decision")

    @property
    def abort(self) -> str:                  # every rank releases itself from the test
        return self._k("abort")

    @property
    def verdict(self) -> str:                # rank 0's verdict (pickled Verdict)
        return self._k("verdict")

    @property
    def interrupted(self) -> str:            # a rank got an ending signal (its name): rank 0 concludes
        return self._k("interrupted")


def naps(limit: float = TIMING.store_poll_max):
    """Polling intervals: 2 ms, doubling up to ``limit``."""
    interval = 0.002
    while True:
        yield interval
        interval = min(limit, interval * 2)


STORE_TRIES = 3   # store errors in a row that end a wait: one is a hiccup of a loaded host, not a verdict


def poll(ready, until: float) -> bool:
    """Call ``ready()`` at growing intervals until it is true (True) or ``until`` passes (False). A
    store error is retried (a client's socket timed out or was reset on a loaded host); ``STORE_TRIES``
    in a row (its host left) end the wait as False."""
    errors = 0
    for nap in naps():
        try:
            if ready():
                return True
            errors = 0
        except Exception:  # a store's error differs by torch version and store type: retried
            errors += 1
            if errors >= STORE_TRIES:
                return False
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(nap, left))
    return False


def safe_set(store, key: str, value, on_error=None) -> None:
    try:
        store.set(key, value)
    except Exception as exc:  # a store's error differs by torch version and store type: said
        if on_error is not None:
            on_error(f"store set {key}: {type(exc).__name__}: {exc}")
