"""Nothing of a watched job outlives the watch, SIGKILL of the watch included (a CI step's hard
timeout): not its ranks, not a process of the job that never became a rank (a ``multiprocessing``
helper that never imported torch, and multiprocessing's resource tracker), not the /dev/shm files
the job had open. Real launchers: torchrun and torch.multiprocessing.spawn (issue 30)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from conftest import assert_no_leftovers
from watch_support import free_port, job_env

from pytest_nccl.watch.engine.leftovers import ShmFiles, remove, shm_files

JOB = """
import multiprocessing, os, sys, time


def helper(path):  # never imports torch: the start-up hook never makes it a rank
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=1 << 16)  # starts the resource tracker
    with open(path, "w") as f:
        f.write(shm.name)
    time.sleep(600)


def rank_main(rank, world, port):
    import torch
    import torch.distributed as dist
    if port:  # mp.spawn: the arguments say; torchrun: the environment
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    print(f"rank {rank} in", flush=True)
    if rank == 1:
        time.sleep(600)            # rank 0 waits in the next all_reduce; --timeout 300: no verdict yet
    dist.all_reduce(torch.ones(1))


if __name__ == "__main__":
    how, marker = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        multiprocessing.get_context("spawn").Process(target=helper, args=(marker,), daemon=False).start()
    if how == "torchrun":
        rank_main(rank, int(os.environ["WORLD_SIZE"]), 0)
    else:
        import torch.multiprocessing as mp
        mp.spawn(rank_main, args=(2, int(sys.argv[3])), nprocs=2)
"""


def _launch(how: str, tmp_path) -> list:
    port = free_port()
    if how == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                f"--master-port={port}", "job.py", how, str(tmp_path / "helper")]
    return [sys.executable, "job.py", how, str(tmp_path / "helper"), str(port)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["torchrun", "spawn"])
def test_sigkill_of_the_watch_leaves_no_process_and_no_shm_file(tmp_path, how):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB).lstrip("\n"))
    tag = uuid.uuid4().hex
    command = [sys.executable, "-m", "pytest_nccl", "watch", "--timeout", "300", "--", *_launch(how, tmp_path)]
    proc = subprocess.Popen(command, cwd=tmp_path, env=job_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        seen, deadline = b"", time.monotonic() + 90
        while not (b"rank 0 in" in seen and b"rank 1 in" in seen and (tmp_path / "helper").exists()) \
                and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen += os.read(proc.stdout.fileno(), 4096)
        assert b"rank 1 in" in seen and (tmp_path / "helper").exists(), seen
        time.sleep(2.5)  # the watch notes the job's /dev/shm files once a second
        shm = "/dev/shm/" + (tmp_path / "helper").read_text()
        assert os.path.exists(shm)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert_no_leftovers(tag, wait=20.0)  # the ranks, the launcher, the helper, its resource tracker
    deadline = time.monotonic() + 10
    while os.path.exists(shm) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(shm), f"{shm} outlived the watch"


def test_shm_files_are_found_open_and_mapped_and_only_those_are_removed(tmp_path):
    """On this process: a /dev/shm file mapped (its descriptor closed, as DeepSpeed's buffers are) is
    found; after ``remove`` it is gone, and a file it never noted stays."""
    import mmap
    from multiprocessing import shared_memory
    mapped = shared_memory.SharedMemory(create=True, size=4096)
    other = shared_memory.SharedMemory(create=True, size=4096)
    try:
        path = f"/dev/shm/{mapped.name}"
        view = mmap.mmap(os.open(path, os.O_RDWR), 4096)  # mapped, its own descriptor left open too
        assert path in shm_files([os.getpid()])
        files = ShmFiles(str(tmp_path))
        files.note([os.getpid()])
        assert path in (tmp_path / "shm-files").read_text().split()
        view.close()
        noted_only = {path}
        assert remove(noted_only) == [path] and not os.path.exists(path)
        assert os.path.exists(f"/dev/shm/{other.name}")
    finally:
        other.close()
        other.unlink()
        mapped.close()
        try:
            mapped.unlink()
        except FileNotFoundError:
            pass


def test_the_loops_note_is_due_every_note_every_seconds_on_the_watchs_clock(tmp_path):
    from pytest_nccl.watch.engine.leftovers import NOTE_EVERY, ShmFiles
    shm = ShmFiles(str(tmp_path))
    assert shm.due(100.0)                                   # the first tick notes
    assert not shm.due(100.0 + NOTE_EVERY / 2)
    assert shm.due(100.0 + NOTE_EVERY) and not shm.due(100.0 + NOTE_EVERY * 1.5)
