"""Finding and reading a job's Flight Recorder dumps: a folder of them, a file prefix as NCCL writes
them (``/tmp/nccl_trace_rank_``), or single files; pickle or JSON, sniffed from the first byte.

Each file is read, cut to its window (``core.frdump.summarize``) and dropped before the next one, so
memory follows one file and the windows, not the job; many files are read by a pool of processes
(unpickling is CPU-bound). A dump is data: the unpickler refuses any class, so no code in a file
runs. What cannot be read is an ``InputError``: one line naming the file and why.
"""

from __future__ import annotations

import gc
import io
import json
import os
import pickle
import re
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator

from ..core.frdump import KEEP_COMPLETED, FrGroup, RankDump, summarize

_RANK = re.compile(r"^(.*?)(\d+)(\.json)?$")  # "<prefix><rank>", as torch names them (JSON: ours to add)
PARALLEL_FROM = 32  # files; fewer are read in this process (a pool's start costs more than it saves)


class InputError(Exception):
    """Input that cannot be read: the message is one line naming the path and why."""


class _DataOnly(pickle.Unpickler):
    """An unpickler for torch's dumps, which hold only dicts, lists, tuples, strings and numbers."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names a class ({module}.{name}), which no Flight Recorder dump does")


def rank_files(paths: list[str]) -> dict[int, str]:
    """rank -> file, from folders, prefixes and files; raises ``InputError``."""
    found: dict[int, str] = {}
    for path in paths:
        for rank, file in _files_of(path):
            if rank in found and found[rank] != file:
                raise InputError(f"two dumps of rank {rank}: {found[rank]} and {file}")
            found[rank] = file
    if not found:
        raise InputError(f"no Flight Recorder dump in {' '.join(paths)}")
    return dict(sorted(found.items()))


def _files_of(path: str) -> list[tuple[int, str]]:
    if os.path.isdir(path):
        by_prefix: dict[str, list[tuple[int, str]]] = {}
        for name in sorted(os.listdir(path)):
            m = _RANK.match(name)
            full = os.path.join(path, name)
            if m and os.path.isfile(full):
                by_prefix.setdefault(m.group(1), []).append((int(m.group(2)), full))
        if not by_prefix:
            raise InputError(f"{path}: no file named as torch names dumps (<prefix><rank>, e.g. nccl_trace_rank_0)")
        if len(by_prefix) > 1:
            shown, first = ", ".join(sorted(by_prefix)[:4]), os.path.join(path, sorted(by_prefix)[0])
            raise InputError(f"{path} holds dumps of several prefixes ({shown}): give one, as {first}")
        return next(iter(by_prefix.values()))
    if os.path.isfile(path):
        m = _RANK.match(os.path.basename(path))
        if not m:
            raise InputError(f"{path}: its name does not end with a rank, as torch names dumps (nccl_trace_rank_3)")
        return [(int(m.group(2)), path)]
    folder, prefix = os.path.split(path)
    folder = folder or "."
    if not os.path.isdir(folder):
        raise InputError(f"{path}: no such file, folder or prefix of files")
    out = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix):
            m = _RANK.match(name[len(prefix):])
            if m and not m.group(1):
                out.append((int(m.group(2)), os.path.join(folder, name)))
    if not out:
        raise InputError(f"{path}: no such file, folder or prefix of files")
    return out


def read_bytes(path: str) -> bytes:
    """A dump file's bytes; raises ``InputError``."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_dump(path: str) -> dict:
    """One file's dump as torch wrote it; raises ``InputError``."""
    return parse_dump(read_bytes(path), path)


def parse_dump(data: bytes, path: str) -> dict:
    """A dump from its bytes (``path``: what the error line names); raises ``InputError``."""
    if not data:
        raise InputError(f"{path}: empty (the rank may have been killed while writing it)")
    try:
        if data[:1] in (b"{", b"["):
            dump = json.loads(data)
        else:
            # buffered: the C unpickler then reads ahead instead of calling read() per opcode (6x faster)
            dump = _DataOnly(io.BufferedReader(io.BytesIO(data), len(data))).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a Flight Recorder dump torch can have written ({why})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", None), list):
        raise InputError(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    return dump


def load_one(rank: int, path: str, keep: int = KEEP_COMPLETED, known: dict | None = None) -> RankDump:
    """One rank's dump, read and cut to its window (``known``: the groups of the dumps read before,
    shared rather than held once per rank)."""
    enabled = gc.isenabled()
    gc.disable()  # a dump is a tree of small objects: the collector would walk it again and again
    try:
        return summarize(read_dump(path), rank, path, keep, known)
    finally:
        if enabled:
            gc.enable()


def _load_chunk(chunk: list[tuple[int, str]], keep: int) -> list[RankDump | str]:
    out: list[RankDump | str] = []
    known: dict = {}  # the chunk's ranks share their groups' objects: pickled back once, not once a rank
    for rank, path in chunk:
        try:
            out.append(load_one(rank, path, keep, known))
        except InputError as exc:
            out.append(str(exc))
    return out


def load(files: dict[int, str], keep: int = KEEP_COMPLETED, jobs: int | None = None) -> Iterator[RankDump]:
    """Every rank's dump, in rank order; raises ``InputError`` at the first that cannot be read.
    ``jobs``: processes to read with (None: one per core, for many files)."""
    items = list(files.items())
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    known: dict = {}
    if jobs <= 1 or len(items) < PARALLEL_FROM:
        for rank, path in items:
            yield load_one(rank, path, keep, known)
        return
    size = max(8, len(items) // (jobs * 4))
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    import multiprocessing

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        shared: dict[int, FrGroup] = {}  # a chunk's group object -> the one every chunk's ranks share
        arrived: list = []              # ... kept alive, so that no id is taken again by another object
        for results in pool.map(_load_chunk, chunks, [keep] * len(chunks)):
            for result in results:
                if isinstance(result, str):
                    raise InputError(result)
                for name, group in result.groups.items():
                    if id(group) not in shared:
                        arrived.append(group)
                        shared[id(group)] = known.setdefault(group, group)
                    result.groups[name] = shared[id(group)]
                yield result
