"""Where a group's ranks run: the backend, and what CUDA its ranks see. Pure: the GPU count comes in
as a number (``session.cuda_device_count`` asks torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .core.states import Backend
from .errors import NcclUsageError


@dataclass(frozen=True)
class Placement:
    """The backend of a group and what CUDA its ranks see.

    ``gpus``: each rank gets a GPU of its own (leased, ``CUDA_VISIBLE_DEVICES`` = the lease), so
    ``cuda:LOCAL_RANK`` is valid. ``shared_gpus`` (gloo asked for by name on a host with fewer GPUs
    than ranks): the ranks share that many GPUs as they would under plain torch, every GPU visible
    and rank r's current device ``cuda:r % shared_gpus`` (``device_of``). Otherwise CUDA is hidden from
    the ranks (``CUDA_VISIBLE_DEVICES`` empty): gloo fallback means the CPU path, and libraries that see
    a GPU would put rank N on ``cuda:N``, which does not exist on a host with fewer GPUs than ranks
    ("invalid device ordinal").
    """
    backend: Backend
    why: str
    gpus: bool = False
    shared_gpus: int = 0

    def device_of(self, rank: int) -> int | None:
        """The CUDA device that is rank ``rank``'s current one, when the ranks share GPUs."""
        return rank % self.shared_gpus if self.shared_gpus else None

    def describe(self) -> str:
        return f"backend {self.backend} ({self.why})"

    @property
    def on_cpu(self) -> bool:
        """Whether the ranks take the CPU path: no GPU of their own and none shared."""
        return not self.gpus and not self.shared_gpus

    def library_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What the ranks get so libraries see the group they run in, less what ``environ`` (the
        user's, the test's) sets already: on the CPU path, accelerate's CPU launch (``CPU_RANK_ENV``);
        on GPUs nothing."""
        if not self.on_cpu:
            return {}
        return {key: value for key, value in CPU_RANK_ENV.items() if key not in environ}


# What accelerate's own CPU launcher (``debug_launcher``) sets for its ranks. Since accelerate 1.13.0
# a job without an accelerator is distributed only when accelerate is told it runs on the CPU
# (``cpu=True``, or ACCELERATE_USE_CPU, which ``Accelerator()`` and accelerate's own test programs
# read; a bare ``PartialState()`` does not, under accelerate's launcher either, so the ranks build it:
# rank/libraries.py): else one process (docs/support.md). Not taken from the launcher: WORLD_SIZE,
# MASTER_ADDR/PORT, GLOO_SOCKET_IFNAME=lo (each transport sets its own), ACCELERATE_DEBUG_RDV_FILE
# (the store of the group the launcher makes; the ranks are in one already).
CPU_RANK_ENV = {
    "ACCELERATE_USE_CPU": "yes",
    "ACCELERATE_MIXED_PRECISION": "no",
}


def _devices(n: int) -> str:
    return f"{n} CUDA device{'s' if n != 1 else ''}"


def place(requested: str, world: int, cuda_devices: int) -> Placement:
    """Where a group of ``world`` ranks runs on a host with ``cuda_devices`` GPUs.

    auto: NCCL with a GPU per rank when there are enough, else gloo with CUDA hidden.
    nccl: NCCL, or one clear error when there are too few GPUs.
    gloo: gloo; with a GPU per rank when there are enough (gloo tests of code that keeps its model on
    ``cuda:LOCAL_RANK``), else the ranks share the GPUs there are (gloo reduces CUDA tensors; a test
    that asks for gloo by name and puts tensors on ``cuda`` works as under plain torch). Only the
    automatic fallback hides CUDA: there gloo stands in for NCCL and means the CPU path.
    """
    if requested == Backend.NCCL:
        if cuda_devices < world:
            raise NcclUsageError(f"--nccl-backend=nccl needs {world} CUDA devices for world {world}; "
                                 f"this machine has {cuda_devices}")
        return Placement(Backend.NCCL, "requested", gpus=True)
    if requested == Backend.GLOO:
        if cuda_devices == 0:
            return Placement(Backend.GLOO, "requested")
        if cuda_devices >= world:
            return Placement(Backend.GLOO, f"requested; a GPU per rank: {_devices(cuda_devices)} >= world {world}",
                             gpus=True)
        return Placement(Backend.GLOO, f"requested; {_devices(cuda_devices)} < world {world}, shared: "
                                       f"rank r on cuda:r % {cuda_devices}", shared_gpus=cuda_devices)
    if cuda_devices == 0:
        return Placement(Backend.GLOO, "auto: no CUDA device")
    if cuda_devices < world:
        return Placement(Backend.GLOO, f"auto: {_devices(cuda_devices)} < world {world}; CUDA hidden from the ranks")
    return Placement(Backend.NCCL, f"auto: {_devices(cuda_devices)} >= world {world}", gpus=True)


