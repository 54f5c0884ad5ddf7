"""GPU leases for NCCL groups: two groups (xdist workers, or two pytest sessions) never share a
device. A lease is an exclusive ``flock`` on one file per device; the kernel drops it when the
holder dies, so a crashed session never leaves a device locked.

Devices are named as the controller sees them: with ``CUDA_VISIBLE_DEVICES=2,3`` lease index 0 is
device "2". Lock files and the ids given to ranks use those names, so two sessions with different
visible sets still never share a physical device."""

from __future__ import annotations

import os
import tempfile
import time

from .timing import TIMING


def visible_devices(device_count: int, environ=os.environ) -> list[str]:
    """The names of this process's CUDA devices 0..count-1 for a child's CUDA_VISIBLE_DEVICES."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return [str(i) for i in range(device_count)]
    names = [v.strip() for v in visible.split(",") if v.strip()]
    return (names + [str(i) for i in range(len(names), device_count)])[:device_count]


class Lease:
    def __init__(self, ids: list[str], files: list):
        self.ids, self._files = ids, files

    def release(self) -> None:
        import fcntl  # here, not at import: the plugin must load on platforms without it
        for f in self._files:
            try:
                fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()
        self._files = []


class GpuLeaser:
    def __init__(self, device_count: int, lock_dir: str | None = None, names: list[str] | None = None):
        self.device_count = device_count
        self.names = names or visible_devices(device_count)
        self.lock_dir = lock_dir or os.path.join(tempfile.gettempdir(), f"pytest-nccl-gpus-{os.getuid()}")
        os.makedirs(self.lock_dir, exist_ok=True)

    def try_acquire(self, n: int) -> Lease | None:
        import fcntl  # here, not at import: the plugin must load on platforms without it
        taken = []
        for i in range(self.device_count):
            name = self.names[i]
            f = open(os.path.join(self.lock_dir, f"gpu{name.replace(os.sep, '_')}.lock"), "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            taken.append((name, f))
            if len(taken) == n:
                return Lease([i for i, _ in taken], [f for _, f in taken])
        Lease([], [f for _, f in taken]).release()
        return None

    def acquire(self, n: int, deadline: float) -> Lease:
        if n > self.device_count:
            raise ValueError(f"{n} GPUs requested, {self.device_count} present")
        while True:
            lease = self.try_acquire(n)
            if lease is not None:
                return lease
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no {n} free GPUs of {self.device_count} before the bound "
                                   "(other pytest-nccl groups hold them)")
            time.sleep(TIMING.gpu_lease_poll)
