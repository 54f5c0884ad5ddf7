"""Rank side: the one formatter of stacks and exceptions, and how a test body ended.

Standard library only (every rank imports it). Used by forked ranks (``rank/loop.py``) and SPMD ranks
(``spmd/``): both show the user's frames, not ours (the tracer's wrappers, the rank loop, pytest and
pluggy around the body in SPMD mode).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

from ..core.sites import is_ours
from ..core.states import RankState

THREAD_PREFIX = "pytest-nccl-"      # our own threads (reader, watchdog, decider): never shown
# tracer.py and the trace_*.py modules beside this one: their wrappers are never shown
_TRACER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace")


def _is_tracer(path: str) -> bool:
    return path.startswith(_TRACER) and os.sep not in path[len(_TRACER):]


def _harness_dirs() -> tuple:
    """pytest's and pluggy's code: the generic folder names, and the pytest package's own folder."""
    dirs = [os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep]
    path = getattr(sys.modules.get("pytest"), "__file__", None)
    if path:
        dirs.append(os.path.dirname(path) + os.sep)
    return tuple(dirs)


def is_harness(path: str) -> bool:
    """pytest's, pluggy's, the interpreter's start-up or ours (pytest_nccl.testing is the user's)."""
    return (any(d in path for d in _harness_dirs()) or path.startswith("<") or path.endswith(os.sep + "runpy.py")
            or is_ours(path))


def harness_sites_stripped(records: list) -> list:
    """Call sites end at the test body: drop pytest's and pluggy's frames above it (SPMD mode, where
    pytest runs on the rank)."""
    dirs = _harness_dirs()
    for rec in records:
        if rec.site:
            rec.site = " <- ".join(s for s in rec.site.split(" <- ") if not any(d in s for d in dirs))
    return records


def user_frames(frames: list) -> list:
    """From the first frame that is not the launcher's, pytest's, pluggy's or ours: the test body,
    or the fixture being set up."""
    for i, f in enumerate(frames):
        if not is_harness(f.filename):
            return frames[i:]
    return frames


def format_stacks(cut_main_to_user: bool = False) -> str:
    """Python stacks of every thread but ours, innermost frame last (like a traceback), without the
    tracer's wrappers; the main thread first. ``cut_main_to_user``: the main thread from the test
    body on (SPMD mode, where pytest itself runs on the rank)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] != main):
        name = names.get(ident, str(ident))
        if ident == threading.get_ident() or name.startswith(THREAD_PREFIX):
            continue
        frames: list = list(traceback.extract_stack(frame))
        if ident == main and cut_main_to_user:
            frames = user_frames(frames)
        frames = [f for f in frames if not _is_tracer(f.filename)]
        parts.append(f"Thread {name}:\n" + "".join(traceback.format_list(frames)))
    return "\n".join(parts)


def format_exception(exc: BaseException, drop: tuple = (), cut_to_user: bool = False) -> str:
    """The traceback without the tracer's wrappers and the files in ``drop`` (the rank loop);
    ``cut_to_user``: from the first frame that is not the harness's."""
    frames: list = list(traceback.extract_tb(exc.__traceback__))
    if cut_to_user:
        frames = user_frames(frames)
    frames = [f for f in frames if not _is_tracer(f.filename) and f.filename not in drop]
    return "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames),
                    *traceback.format_exception_only(type(exc), exc)])


# -- how a test body that raised ends, the same in a forked rank and in SPMD mode -------------------

def _classify(exc: BaseException) -> RankState:
    # pytest's outcome exceptions, recognized by name so that a rank never needs pytest imported
    name = type(exc).__name__
    if name == "Skipped":
        return RankState.SKIPPED
    if name == "XFailed":
        return RankState.XFAILED
    return RankState.FAILED


def exit_like_os_exit(exc: SystemExit):
    """sys.exit() in a test body ends the rank as os._exit would: it is reported as an exit."""
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def describe_exception(exc: BaseException, format_exc) -> tuple[RankState, str, str, str]:
    """(status, exception type, traceback text, one-line message) of a test body that raised."""
    status, exc_type = _classify(exc), type(exc).__name__
    exc_text = format_exc(exc) if status == RankState.FAILED else ""
    message = (str(getattr(exc, "msg", "")) or str(exc)).strip().split("\n")[0][:300]
    if status == RankState.FAILED:
        message = f"{exc_type}: {message}" if message else exc_type
    return status, exc_type, exc_text, message
