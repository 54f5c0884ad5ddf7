"""Rank side: the call site of a collective, "file:line <- file:line", read off the Python stack.

The first frames outside torch, pytest_nccl, the standard library and thin communication shims,
one per distinct file, innermost first; in a compiled graph (torch.fx's generated forward), the
lines its node kept from the code that was compiled. Shared by every tracer (trace_core.py).
"""

from __future__ import annotations

import os
import sysconfig
import threading

import torch

from ..core.journal import THREAD_MARK
from ..core.sites import is_ours, relay_package

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep  # threading.py, contextlib.py: not who issued it
# Thin communication shims whose frames say nothing about who issued the collective.
_SHIM_MARKERS = (os.sep + "deepspeed" + os.sep + "comm" + os.sep,
                 os.sep + os.path.join("deepspeed", "utils", "nvtx.py"),  # instrument_w_nvtx
                 os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep,  # SPMD mode: above the test body
                 os.sep + "torchinductor_")  # inductor's generated code: the graph, not the user's line
SITE_DEPTH = 4  # distinct files in a call site chain, not counting a relaying library's
RELAY_DEPTH = 12  # a relaying library's distinct files kept in a chain on top (transformers' model code)
GRAPH_CODE = "<eval_with_key>"  # the file name torch.fx gives a GraphModule's generated forward


def _run_node_code():
    """The code of torch.fx's Interpreter.run_node: a compiled graph that torch runs node by node
    (torch 2.6's aot_eager backend) issues each node's op from there, with the node in ``n``."""
    try:
        from torch.fx.interpreter import Interpreter
        return Interpreter.run_node.__code__
    except Exception:  # no torch.fx in this build, whatever it raises: no graph run node by node
        return None


_RUN_NODE = _run_node_code()


# A collective issued by a thread other than the process's main one: "<site><THREAD_MARK><thread
# name>" (core/journal.py). Two threads issuing on one group race, in an order that differs per
# rank; the headline names them.
def thread_mark() -> str:
    """"" on the main thread (asked each time: a forked rank's is the thread that forked it); else the
    mark and the current thread's name (tabs and line ends go)."""
    if threading.get_ident() == threading.main_thread().ident:
        return ""
    name = threading.current_thread().name
    return THREAD_MARK + name.replace("\t", " ").replace("\n", " ").replace(THREAD_MARK, " ")


_USER, _INTERNAL, _GRAPH, _BOUNDARY, _RELAY = 0, 1, 2, 3, 4
_kind_of: dict[int, int] = {}   # id(code) -> kind; ids stay valid: _codes keeps each code alive
_codes: list = []
_site_text: dict = {}           # (id(code), instruction offset, ...) of the chain -> "file:line <- file:line"


# torch's own distributed test suites (distributed_test.py, common_fsdp.py, common_dtensor.py) are
# test code, the user's for a call site; the harness that runs them (common_distributed.py) and
# unittest's TestCase (common_utils.py) are not
_TORCH_TESTS_DIR = os.path.join(_TORCH_DIR, "testing", "_internal") + os.sep
_TORCH_TEST_HARNESS = tuple(_TORCH_TESTS_DIR + name for name in ("common_distributed.py", "common_utils.py"))


def is_internal_file(filename: str) -> bool:
    if filename.startswith(_TORCH_TESTS_DIR) and not filename.startswith(_TORCH_TEST_HARNESS):
        return False
    return (filename.startswith(_TORCH_DIR) or is_ours(filename) or filename.startswith("<")
            or any(m in filename for m in _SHIM_MARKERS)
            or (filename.startswith(_STDLIB_DIR) and "-packages" + os.sep not in filename))


def _classify(code) -> int:
    filename = code.co_filename
    kind = _GRAPH if filename.startswith(GRAPH_CODE) or code is _RUN_NODE else \
        _INTERNAL if is_internal_file(filename) else _RELAY if relay_package(filename) else _USER
    _kind_of[id(code)] = kind
    _codes.append(code)
    return kind


def mark_boundary(code) -> None:
    """Frames from this code down are the harness (the rank loop that runs the test): a call site
    walk stops there instead of reading every frame below the test body. Only harness code is
    marked (a script that starts a trace itself keeps its frames)."""
    if code is None or not is_internal_file(code.co_filename):
        return
    if _kind_of.get(id(code)) is None:
        _codes.append(code)
    _kind_of[id(code)] = _BOUNDARY


def call_site(frame) -> str:
    """First frames outside torch and pytest_nccl, one per distinct file, innermost first; in a
    compiled graph, the lines its node kept from the code that was compiled.

    The walk reads only code ids and instruction offsets; the text (which needs line numbers, and
    for a graph its node's stack trace) is built once per distinct chain and cached: a training loop
    issues the same few call sites thousands of times."""
    key: list[object] = []
    frames = []
    last = None
    files = relays = 0
    while frame is not None:
        code = frame.f_code
        kind = _kind_of.get(id(code))
        if kind is None:
            kind = _classify(code)
        if kind == _USER or (kind == _RELAY and relays < RELAY_DEPTH):
            filename = code.co_filename
            if filename != last:
                last = filename
                key.append(id(code))
                key.append(frame.f_lasti)
                frames.append(frame)
                # a relaying library's frames ride on top: the chain still reaches the code that
                # asked (the model's caller under transformers' dozen frames)
                if kind == _RELAY:
                    relays += 1
                else:
                    files += 1
                    if files == SITE_DEPTH:
                        break
        elif kind == _GRAPH:
            key.append(id(code))
            key.append(frame.f_lasti if code is not _RUN_NODE else _node_stack(frame))
            frames.append(frame)
        elif kind == _BOUNDARY:
            break
        frame = frame.f_back
    cache_key = tuple(key)
    text = _site_text.get(cache_key)
    if text is None:
        text = _chain_text(frames)
        if len(_site_text) < 100_000:
            _site_text[cache_key] = text
    return text


def site_of(trace, frame) -> bytes:
    """``call_site(frame)`` as the journal's bytes, remembered for the frame the last one came from:
    while a frame is live its callers are fixed (for a generator's frame, its resumer is compared
    too), so a loop that issues collectives from one line walks the stack once."""
    # torch's frames between (an op's __call__, a functional collective's Python function) are new
    # objects on every call and say nothing: remember from the first frame that is the user's
    kind = _kind_of.get(id(frame.f_code))
    while kind not in (_USER, _RELAY) and frame is not None:
        if kind is None:
            kind = _classify(frame.f_code)
            continue
        if kind != _INTERNAL:  # a compiled graph's frame: its line is the node's; the harness: no site
            break
        frame = frame.f_back
        kind = _kind_of.get(id(frame.f_code)) if frame is not None else None
    if frame is None:
        return b""
    if frame.f_code is _RUN_NODE:  # one frame per node, all from the same line: nothing to remember
        chain = call_site(frame)
        mark = thread_mark()
        return (chain + mark).encode() if mark else _site_bytes.get(chain) or chain.encode()
    back = frame.f_back
    if frame is trace.site_frame and frame.f_lasti == trace.site_lasti and back is trace.site_back:
        return trace.site_text
    # a function called once per step issues from a fresh frame whose caller is the same live frame,
    # at the same instruction (that caller's own callers are then fixed, unless it is a generator's)
    key = (id(frame.f_code), frame.f_lasti)
    found = trace.sites.get(key)
    if found is not None and found[0] is back and back is not None and found[1] == back.f_lasti \
            and found[2] is back.f_back:
        text = found[3]
    else:
        chain = call_site(frame)
        text = _site_bytes.get(chain)
        if text is None:
            text = chain.encode()
            if len(_site_bytes) < 100_000:
                _site_bytes[chain] = text
        mark = thread_mark()  # remembered with the frame below: a live frame runs in one thread
        if mark:
            text += mark.encode()
        if back is not None and (key in trace.sites or len(trace.sites) < SITES_KEPT):  # keeps a frame alive
            trace.sites[key] = (back, back.f_lasti, back.f_back, text)
    trace.site_frame, trace.site_back, trace.site_lasti, trace.site_text = frame, back, frame.f_lasti, text
    return text


_site_bytes: dict = {}
SITES_KEPT = 64


def _chain_text(frames: list) -> str:
    parts: list[str] = []
    last = None
    files = 0
    for frame in frames:
        code = frame.f_code
        found = graph_lines(frame) if code.co_filename.startswith(GRAPH_CODE) else \
            _stack_lines(_node_stack(frame)) if code is _RUN_NODE else [(code.co_filename, frame.f_lineno)]
        for filename, line in found:
            if filename != last and files < SITE_DEPTH:
                last = filename
                parts.append(f"{filename}:{line}")
                files += 0 if relay_package(filename) else 1
    return " <- ".join(parts)


def graph_lines(frame) -> list[tuple[str, int]]:
    """(file, line) of the user's frames that issued the node a compiled graph's frame is running,
    innermost first, from the stack trace torch.fx keeps in the node's meta; [] where the graph
    kept none (the call of the compiled function then stands for it)."""
    try:
        gm = frame.f_locals.get("self")
        index = gm._lineno_map.get(frame.f_lineno - frame.f_code.co_firstlineno)
        node = list(gm.graph.nodes)[index]
        stack = node.meta.get("stack_trace") or ""
    except Exception:  # torch.fx's private attributes, any version: no stack then
        return []
    return _stack_lines(stack)


def _node_stack(frame) -> str:
    """The stack trace torch.fx kept for the node an Interpreter's run_node frame is running."""
    try:
        return frame.f_locals["n"].meta.get("stack_trace") or ""
    except Exception:
        return ""


def _stack_lines(stack: str) -> list[tuple[str, int]]:
    """(file, line) of the user's frames in a node's kept stack trace, innermost first."""
    found = []
    for line in stack.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            try:
                filename, rest = line[6:].split('", line ', 1)
                found.append((filename, int(rest.split(",", 1)[0])))
            except ValueError:
                continue
    return [f for f in reversed(found) if not is_internal_file(f[0])]
