"""How a record's call site and a rank's stack read in a headline, and which frames are ours.

Call sites and stacks arrive as text (from a journal, a rank's stack dump, another node's report):
everything here reads text, so it works on what any rank of any installation wrote.
"""

from __future__ import annotations

import os
import re

_OURS = os.sep + "pytest_nccl" + os.sep
_USERS = _OURS + "testing" + os.sep   # helpers for the user's own tests: their frames are the user's


def is_ours(path: str) -> bool:
    """A file of this package's machinery (the rank loop, the tracer's wrappers, the watch's hook): no
    call site, stack or traceback shows its frames. The one place that decides it (the tracer, the
    stack formatter and the headline's stack reader ask here), by the path's text, so that it holds
    for a stack any installation wrote."""
    return _OURS in path and _USERS not in path


def short_path(path: str) -> str:
    """'…/site-packages/trl/trainer/x.py:12' -> 'trl/trainer/x.py:12'; test files relative to cwd."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    except ValueError:
        pass
    return path


def short_site(site: str, depth: int = 3) -> str:
    return " <- ".join(short_path(s) for s in site.split(" <- ")[:depth] if s)


# Libraries whose frames only relay a collective for the code that asked for it: the headline names
# the caller (trl/trainer/sft_trainer.py:448, "via accelerate"); the trace keeps every frame.
# transformers' model code relays FSDP's parameter all-gathers, which its modules' forward hooks
# issue for whoever called the model (verl's dp_actor.py, "via transformers").
RELAY_PACKAGES = ("accelerate", "transformers")


def relay_package(path: str) -> str:
    """The relaying library a file belongs to ('' for none), by the path's text."""
    for package in RELAY_PACKAGES:
        for marker in ("site-packages", "dist-packages"):
            if f"{os.sep}{marker}{os.sep}{package}{os.sep}" in path:
                return package
    return ""


def headline_site(site: str) -> str:
    """The call site for a headline: the first frame outside the relaying libraries, then the
    frame after it."""
    frames = [short_path(s) for s in site.split(" <- ") if s]
    relays = []
    while len(frames) > 1 and frames[0].split("/", 1)[0] in RELAY_PACKAGES:
        package = frames.pop(0).split("/", 1)[0]
        if package not in relays:
            relays.append(package)
    text = " <- ".join(frames[:2])
    return f"{text}, via {', '.join(relays)}" if relays and text else text


# Where a rank waits for the members of a new group to join: a TCPStore server waiting for its
# clients (``wait_for_workers``), torch's rendezvous handlers, process group creation.
RENDEZVOUS_FUNCTIONS = frozenset({
    "rendezvous", "_create_c10d_store", "_tcp_rendezvous_handler", "_env_rendezvous_handler",
    "_file_rendezvous_handler", "init_process_group", "new_group", "new_subgroups",
    "_new_process_group_helper", "_store_based_barrier", "init_device_mesh",
})


def _main_frames(stack: str) -> list[tuple[str, str, str, str]]:
    """(path, line, function, source) of the main thread's frames, outermost first, from our
    format or faulthandler's (most recent call first)."""
    lines = stack.splitlines()
    start = next((i for i, text in enumerate(lines) if "MainThread" in text or "Current thread" in text), 0)
    frames: list[tuple[str, str, str, str]] = []
    for i in range(start + 1, len(lines)):
        text = lines[i].strip()
        if text.startswith("Thread ") or (text.startswith("Current thread") and frames):
            break
        if not text.startswith("File "):
            continue
        try:
            path, rest = text.split('"')[1], text.split('"', 2)[2]
            line = rest.split("line ", 1)[1].split(",")[0].split()[0]
            func = rest.rsplit("in ", 1)[1].strip()
        except IndexError:
            continue
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        frames.append((path, line, func, "" if nxt.startswith("File ") else nxt))
    if lines and "most recent call first" in lines[start]:
        frames.reverse()
    return frames


def stack_frames(stack: str) -> list[tuple[str, int]]:
    """(path, line) of the main thread's frames, innermost first (``_main_frames``' reading)."""
    return [(path, int(line)) for path, line, _, _ in reversed(_main_frames(stack or "")) if line.isdigit()]


def _user_frames(stack: str) -> list[tuple[str, str, str, str]]:
    return [f for f in _main_frames(stack or "") if not is_ours(f[0])]


_TORCH_DIR = os.sep + "torch" + os.sep
_STDLIB = os.sep + "lib" + os.sep + "python3"
# Frames below the user's line: torch, the NCCL model (a backend, as torch's), the standard library
# (threading's Event.wait under a sync point, queue's get).
_BELOW_USER = (_TORCH_DIR, _OURS + "testing" + os.sep + "nccl_model.py")


def _below_user(path: str) -> bool:
    return any(part in path for part in _BELOW_USER) or (_STDLIB in path and "-packages" + os.sep not in path)


def _place_frame(stack: str) -> tuple[str, str, str, str] | None:
    """The frame that says where a rank is: the innermost of the main thread outside pytest_nccl,
    torch and the standard library (the user's ``torch.cuda.synchronize()`` or ``q.get()``, not
    the line inside it), else the innermost outside pytest_nccl."""
    frames = _user_frames(stack)
    return next((f for f in reversed(frames) if not _below_user(f[0])), frames[-1] if frames else None)


def stack_top(stack: str) -> str:
    """Where a rank is, 'file:line (in f)' (``_place_frame``), the call-site form of every headline."""
    frame = _place_frame(stack)
    if frame is None:
        return ""
    path, line, func, _ = frame
    return f"{short_path(path)}:{line} (in {func})"


def stack_source(stack: str) -> str:
    """The source line of ``stack_top``'s frame ("time.sleep(60)"): what a rank outside any
    collective is doing there."""
    frame = _place_frame(stack)
    source = frame[3] if frame is not None else ""
    return re.sub(r"\s+#[^'\"]*$", "", source)  # without a trailing comment


def rendezvous_at(stack: str) -> str:
    """'file:line (in f)' of the code that entered a rendezvous, when the main thread waits in one
    (its innermost frame creates a TCPStore or is one of torch's rendezvous / group creation
    functions); else ''."""
    frames = _user_frames(stack)
    if not frames:
        return ""
    path, _, func, source = frames[-1]
    torch_dir = os.sep + "torch" + os.sep + "distributed" + os.sep
    if not ("TCPStore(" in source or (torch_dir in path and func in RENDEZVOUS_FUNCTIONS)):
        return ""
    user = next((f for f in reversed(frames) if torch_dir not in f[0]), frames[-1])
    return f"{short_path(user[0])}:{user[1]} (in {user[2]})"
