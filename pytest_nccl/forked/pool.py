"""The fork server and the one live group of a pytest process; GPU leases for NCCL groups."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Callable

from ..core.messages import RankStart
from ..core.nccl_env import nccl_env
from ..errors import RankSetupError
from .gpus import GpuLeaser, Lease
from .group import RankGroup
from .zygote_client import Zygote


class GroupPool:
    """One fork server and at most one live group per pytest process."""

    def __init__(self, workdir_parent: str | None, preload: list, trace: bool,
                 gpu_leaser: GpuLeaser | Callable[[], GpuLeaser] | None = None, rank_start: str = "auto"):
        # journals and outputs on tmpfs where there is one: a journal line is a syscall per collective
        if workdir_parent is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            workdir_parent = "/dev/shm"
        self.workdir = tempfile.mkdtemp(prefix="pytest-nccl-", dir=workdir_parent)
        self._sweeper = _sweeper(self.workdir)
        self.preload = list(preload)
        self.trace = trace
        self.zygote: Zygote | None = None
        self.zygote_env: dict = {}
        self.group: RankGroup | None = None
        self.gpu_leaser = gpu_leaser  # a GpuLeaser, or a function that makes one when first needed
        self.lease: Lease | None = None
        self.calls = 0
        self.rank_start = rank_start
        self.spawned_group_starts: list[float] = []  # seconds, of groups started as fresh interpreters

    def ensure_zygote(self, wait: bool = True) -> Zygote:
        """The fork server, started if needed. ``wait=False`` only starts it: the plugin does so
        when the session starts, so torch is imported while pytest collects."""
        if self.zygote is None or self.zygote.proc.poll() is not None:
            env = self.zygote_env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                   "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "false"),
                   # every socket a rank opens stays on the loopback interface
                   "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                   "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo"),
                   # torch.cuda.is_available() at a test module's import asks NVML, not the CUDA
                   # driver: the fork server stays fork-safe
                   "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK", "1")}
            if self.trace:
                env.update(nccl_env(os.environ))
            if self.group is not None:
                self.group.kill()
                self.group = None
            self.zygote = Zygote(self.workdir, self.preload, env, self.trace, self.rank_start)
        return self.zygote.ready() if wait else self.zygote

    def add_modules(self, modules: list) -> None:
        """Test modules found by collection: the running fork server imports them now, without
        waiting (with the controller's environment as collection left it); a restarted one preloads
        them."""
        new = [m for m in modules if m not in self.preload]
        self.preload += new
        if new and self.zygote is not None and self.zygote.proc.poll() is None:
            self.zygote.import_modules(new, wait=False, environ={**os.environ, **self.zygote_env})

    def get(self, world: int, placement, timeout: float, deadline: float, own_group: str | None = None) -> RankGroup:
        """A healthy group of this shape: the warm one after a health check, else a fresh one.
        ``placement`` (placement.Placement): the backend, and whether each rank gets a GPU of its
        own (leased), shares the host's GPUs (no lease: gloo asked for by name) or sees no CUDA.
        ``own_group``: ranks for adopted tests of that class, which create their process group
        themselves and see the devices this process sees."""
        zygote = self.ensure_zygote()
        key = (world, placement.backend, placement.gpus, placement.shared_gpus, timeout, own_group)
        if self.group is not None:
            if self.group.key == key and self.group.healthy:
                if self.group.health_check():
                    return self.group
            self.release()
        gpu_ids = None
        rank_env: dict = {}
        if own_group is not None:
            pass  # as torch's harness starts them: the test picks its backend and devices
        elif placement.gpus:
            assert self.gpu_leaser is not None, "a pool made without a GPU leaser runs CPU groups only"
            if callable(self.gpu_leaser):
                self.gpu_leaser = self.gpu_leaser()  # made when a group first needs GPUs
            try:
                self.lease = self.gpu_leaser.acquire(world, deadline)
            except TimeoutError as exc:
                raise RankSetupError(str(exc)) from None
            gpu_ids = self.lease.ids
        elif not placement.shared_gpus:
            rank_env["CUDA_VISIBLE_DEVICES"] = ""  # gloo without a GPU per rank: the CPU path
        if own_group is None:  # (adopted tests' ranks start as torch's harness starts them)
            rank_env.update(placement.library_env(os.environ))
        self.group = RankGroup(zygote, world, placement.backend, timeout, self.workdir, gpu_ids, rank_env,
                               None if own_group is not None else placement.device_of,
                               own_group=own_group is not None)
        self.group.key = key
        started = time.monotonic()
        try:
            self.group.start(deadline)
        except BaseException:
            self.release()
            raise
        if zygote.start_mode == RankStart.SPAWN:
            self.spawned_group_starts.append(time.monotonic() - started)
        return self.group

    def release(self) -> None:
        if self.group is not None:
            self.group.kill()
            shutil.rmtree(self.group.dir, ignore_errors=True)
            self.group = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def new_call_dir(self) -> str:
        self.calls += 1
        path = os.path.join(self.workdir, f"call{self.calls}")
        os.makedirs(path, exist_ok=True)
        return path

    def close(self) -> None:
        self.release()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._sweeper is not None and self._sweeper.stdin is not None:
            self._sweeper.stdin.close()  # it removes nothing now, and exits
            self._sweeper.wait()
            self._sweeper = None


def _sweeper(workdir: str) -> subprocess.Popen | None:
    """A shell that removes ``workdir`` once this process is gone, however it ends: pytest killed by
    SIGKILL runs no cleanup, and the fork server and the ranks die with it (PR_SET_PDEATHSIG), so
    nothing else would remove the journals from /dev/shm. It waits for the end of its stdin, a pipe
    only this process holds (not inherited: Python's pipes are close-on-exec). A clean environment:
    it is no process of the session's."""
    try:
        return subprocess.Popen(["sh", "-c", 'cat >/dev/null; rm -rf -- "$0"', workdir], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except OSError:
        return None
