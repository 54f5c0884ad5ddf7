"""The releases the suites are known to set up on, and what a newer release that breaks a suite's
set-up (a config, a trainer, a tiny model: before the bug the suite reproduces) gives: a skip that
says which release and what it raised. On a release the suites know, the same error fails the test:
it is a bug, of the library or of the suites' own compat code. Nothing here passes silently."""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterator, Mapping

from packaging.version import InvalidVersion, Version

#: the newest release of each library the suites set up on: CI's pin (.ci/constraints.txt; a test
#: keeps the two the same), moved with the pins, on purpose
TESTED_THROUGH: dict[str, str] = {
    "accelerate": "1.16.0",
    "datasets": "5.2.0",
    "deepspeed": "0.19.8",
    "megatron-core": "0.16.1",
    "transformers": "5.25.0",
    "trl": "1.16.0",
}


def installed_version(package: str) -> str | None:
    """The installed release of ``package``, or None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def newer_than_tested(package: str, version: str, tested: Mapping[str, str] = TESTED_THROUGH) -> bool:
    """Whether ``version`` of ``package`` is past the release the suites were seen green on; a
    version that does not parse (a local build) counts as newer, a package not in ``tested`` does not."""
    through = tested.get(package)
    if through is None:
        return False
    try:
        return Version(version).release > Version(through).release
    except InvalidVersion:
        return True


def setup_break(what: str, exc: BaseException, installed: Mapping[str, str | None],
                tested: Mapping[str, str] = TESTED_THROUGH) -> str | None:
    """The skip reason for ``exc`` raised while ``what`` was set up with the ``installed`` releases
    (package -> version, None: not installed), or None where no release is newer than tested (then it
    is a failure)."""
    newer = [f"{p} {v} (tested through {tested[p]})" for p, v in installed.items()
             if v is not None and newer_than_tested(p, v, tested)]
    if not newer:
        return None
    first = (str(exc).strip().splitlines() or [""])[0]
    said = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return (f"{what}: the set-up broke on {', '.join(newer)}, newer than the suites know: {said} "
            f"(a setup change, not the bug under test: docs/support.md)")


@contextlib.contextmanager
def library_setup(what: str, *packages: str) -> Iterator[None]:
    """Set ``what`` up with ``packages``: an exception skips the test when one of them is newer than
    tested (``setup_break``), else it is raised as it was."""
    try:
        yield
    except Exception as exc:
        reason = setup_break(what, exc, {p: installed_version(p) for p in packages})
        if reason is None:
            raise
        import pytest
        raise pytest.skip.Exception(reason) from exc
