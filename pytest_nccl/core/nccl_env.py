"""What pytest-nccl sets in the environment of the ranks it starts (forked groups, a watched job, an
SPMD rank before its NCCL group) for NCCL, each only where the user has not set it; why each, and why
not the others, is in docs/diagnosis.md ("Backends: when a collective is complete"). Standard
library only."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Mapping
from importlib import metadata

# The Flight Recorder: every collective with its state (scheduled, started, completed) and a sequence
# id, C++-issued ones (DDP's reducer) included; dumped from the stuck ranks at a verdict. torch 2.8
# made its buffer vendor neutral under the first name and warns at every group for the second, which
# is the only one older releases read.
FR_BUFFER, FR_BUFFER_BEFORE_2_8 = "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_ENTRIES = "2000"
RANK_ENV = {
    # NCCL's watchdog takes the process down when a collective times out (the process group's timeout:
    # the test's bound plus a margin, so the verdict comes first) or fails: a rank whose controller is
    # gone still ends, and nothing runs on after a communicator error.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
}
# Not set: TORCH_NCCL_BLOCKING_WAIT (it makes Work.wait() block the CPU, which hides the asynchrony the
# tests are for; the tracer handles either way), TORCH_NCCL_ENABLE_TIMING (a cost on every collective
# for durations no rule reads).


# NCCL's dump on a watchdog timeout: before the watchdog ends a rank whose collective timed out, the
# rank writes its Flight Recorder to <prefix><rank>. A watched job gets it on, its files in the
# watch's directory for the job (not /tmp, shared by every job of the host): a rank that the watchdog
# ends can no longer be asked, and its file is the fresher record of what its stream completed.
DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
DUMP_FILE, DUMP_FILE_BEFORE_2_8 = "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"  # torch's, where dump-on-timeout is on and no file is named
DUMP_NAME = "fr_dump_rank_"


def dump_env(environ: Mapping[str, str], directory: str, torch_version: str | None = None) -> dict[str, str]:
    """A watched job's dump-on-timeout settings that ``environ`` does not set already: on, into
    ``directory``. A user who turned it off (``TORCH_NCCL_DUMP_ON_TIMEOUT=0``) keeps it off."""
    if DUMP_ON_TIMEOUT in environ:
        return {}
    version = torch_version if torch_version is not None else installed_torch()
    wanted = {DUMP_ON_TIMEOUT: "1"}
    if DUMP_FILE not in environ and DUMP_FILE_BEFORE_2_8 not in environ:
        wanted[DUMP_FILE_BEFORE_2_8 if _release(version) < (2, 8) else DUMP_FILE] = os.path.join(directory, DUMP_NAME)
    return wanted


def dump_prefix(environ: Mapping[str, str]) -> str | None:
    """Where the ranks of a job with ``environ`` write their dumps on a watchdog timeout (None: off)."""
    if environ.get(DUMP_ON_TIMEOUT, "0").strip().lower() in ("", "0", "false", "no", "off"):
        return None
    return environ.get(DUMP_FILE) or environ.get(DUMP_FILE_BEFORE_2_8) or DEFAULT_DUMP_PREFIX


def nccl_env(environ: Mapping[str, str], torch_version: str | None = None) -> dict[str, str]:
    """The settings ``environ`` does not set already, for ranks that run ``torch_version`` (default:
    the installed torch's; the Flight Recorder's name depends on it)."""
    version = torch_version if torch_version is not None else installed_torch()
    wanted = {**RANK_ENV}
    if FR_BUFFER not in environ and FR_BUFFER_BEFORE_2_8 not in environ:
        wanted[FR_BUFFER_BEFORE_2_8 if _release(version) < (2, 8) else FR_BUFFER] = FR_ENTRIES
    return {key: value for key, value in wanted.items() if key not in environ}


@functools.lru_cache(maxsize=1)
def installed_torch() -> str:
    """The installed torch's version, read without importing it ("" when there is none): from its
    ``version.py`` (about 1 ms; the distribution's metadata, the fallback, scans every installed
    package: about 30 ms, on the controller's start-up path)."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.origin:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
                found = re.search(r"""^__version__\s*=\s*['"]([^'"]+)""", f.read(), re.MULTILINE)
            if found:
                return found.group(1)
    except (OSError, ImportError, ValueError):
        pass
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of '2.13.0+cpu'; an unreadable or empty one counts as new."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()))
    except ValueError:
        return (99, 0)
