"""The watch's own trace, on stderr when ``PYTEST_NCCL_WATCH_DEBUG`` is set (its store calls, ranks
joining and ending, the referee's reasons). Standard library only."""

from __future__ import annotations

import os
import sys
import time

ENV_DEBUG = "PYTEST_NCCL_WATCH_DEBUG"


def debug(text: str) -> None:
    if os.environ.get(ENV_DEBUG):
        sys.stderr.write(f"[watch {time.time():.3f}] {text}\n")
