"""The mode on a platform where ranks cannot run (anything but Linux: the fork server, PR_SET_PDEATHSIG,
pidfds and /proc are Linux's). Importing the plugin there must not break a session: tests marked nccl
and the ``nccl_world`` fixture skip with one line saying why, and every other test runs.

Controller side; imports nothing that only exists on Linux.
"""

from __future__ import annotations

import pytest


class UnsupportedPlatform:
    """A ``session.Mode`` that runs nothing: every distributed test skips with ``reason``."""

    def __init__(self, reason: str):
        self.reason = reason

    def header(self) -> str:
        return f"nccl: {self.reason}; distributed tests are skipped"

    def session_started(self, session: pytest.Session) -> None:
        pass

    def collection_finished(self, session: pytest.Session) -> None:
        pass

    def fixture_value(self, name: str, request) -> object:
        pytest.skip(self.reason)

    def controller_world(self, request) -> object:
        pytest.skip(self.reason)

    def run_item(self, item: pytest.Function) -> bool:
        pytest.skip(self.reason)

    def close(self) -> None:
        pass
