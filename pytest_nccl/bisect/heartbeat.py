"""A line at least every minute while a long step of bisect or matrix runs (an env build, a pytest run
of up to ``--run-timeout``): a log that stays silent for half an hour looks hung to a person, and
CI services end jobs that print nothing for some minutes."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, TextIO

#: seconds between two heartbeat lines
EVERY = 60.0


def elapsed_text(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Heartbeat:
    """``with heartbeat.step("building the env of trl 0.15.0"):`` writes
    ``  ... building the env of trl 0.15.0: still running after 1m00s`` every ``every`` seconds until
    the step ends. ``wait(timeout)`` -> True when the step ended (an Event's wait; tests pass a fake)."""

    def __init__(self, out: TextIO, every: float = EVERY, clock: Callable[[], float] = time.monotonic,
                 event: Callable[[], threading.Event] = threading.Event):
        self.out, self.every, self.clock, self.event = out, every, clock, event

    def beat(self, what: str, seconds: float) -> None:
        # a line of its own: the progress line it interrupts goes on below it
        self.out.write(f"\n  ... {what}: still running after {elapsed_text(seconds)}\n")
        self.out.flush()

    def _loop(self, what: str, start: float, done: threading.Event) -> None:
        while not done.wait(self.every):
            self.beat(what, self.clock() - start)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        done = self.event()
        thread = threading.Thread(target=self._loop, args=(what, self.clock(), done), daemon=True,
                                  name="pytest-nccl-heartbeat")
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

