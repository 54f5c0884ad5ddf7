"""Settings, parsed on one path (as pytest-timeout does): command-line options and ini keys declared
together, the ``nccl`` marker, where a group's ranks run (backend and GPUs), and the bound of one
test under pytest-timeout's budget.

Controller side, no torch import at module level: every parser turns bad input into one
``NcclUsageError`` line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from .errors import NcclUsageError

BACKENDS = ("auto", "nccl", "gloo")
SPMD_MODES = ("auto", "on", "off")
RANK_STARTS = ("auto", "fork", "spawn")
MARKER_ARGS = ("world", "timeout", "backend")
MARKER = ("nccl(world=None, timeout=None, backend=None): run the test body on every rank of a "
          "torch.distributed group of `world` processes (NCCL on GPUs, else gloo), bounded in time")
# Under pytest-timeout, our bound ends this long before pytest-timeout's deadline: what it takes
# to collect every stuck rank's stack (DUMP_WAIT), tear the group down and write the report.
PYTEST_TIMEOUT_RESERVE = 3.0
MIN_BOUND = 0.5


@dataclass(frozen=True)
class Setting:
    """One setting: a command-line option, and an ini key of the same name when ``ini`` is set."""
    name: str
    flag: str
    metavar: str
    help: str
    default: str | None = None   # ini default; None: the setting has no ini key
    ini_type: str | None = None


SETTINGS = (
    Setting("nccl_world", "--nccl-world", "N", "world size of distributed tests that do not set one (default 2)",
            "2"),
    Setting("nccl_backend", "--nccl-backend", "NAME",
            "auto (NCCL when CUDA has at least WORLD devices, else gloo with CUDA hidden from the ranks), "
            "nccl, or gloo", "auto"),
    Setting("nccl_timeout", "--nccl-timeout", "SECONDS", "bound in seconds for each distributed test (default 120)",
            "120"),
    Setting("nccl_trace", "--nccl-trace", "on|off", "record every collective on every rank (on, the default) or not",
            "on"),
    Setting("nccl_spmd", "--nccl-spmd", "auto|on|off",
            "auto (the default: SPMD when a launcher such as torchrun set RANK, WORLD_SIZE, MASTER_ADDR and "
            "MASTER_PORT), on or off. In SPMD mode each launched pytest process is one rank", "auto"),
    Setting("nccl_rank_start", "--nccl-rank-start", "auto|fork|spawn",
            "how ranks start: fork from the fork server (fast), spawn a fresh interpreter per rank, or auto "
            "(fork, unless a test module initialized CUDA in the fork server)", "auto"),
    Setting("nccl_trace_dir", "--nccl-trace-dir", "DIR",
            "write each failed distributed test's collective trace (JSON, Flight Recorder dumps) here"),
    Setting("nccl_report", "--nccl-report", "FILE", "write a validation-gate report (markdown) to this file"),
)
PRELOAD_HELP = "modules the fork server imports once, so that every rank has them"
INFRA_HELP = ("exit with 125 (git bisect's 'skip') when every failure is an infrastructure failure: ranks "
              "could not start, the library does not import, nothing collected")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("nccl", "distributed tests on torch.distributed groups (pytest-nccl)")
    for s in SETTINGS:
        group.addoption(s.flag, dest=s.name, metavar=s.metavar, help=s.help)
        if s.default is not None:
            parser.addini(s.name, s.help, default=s.default)
    group.addoption("--nccl-exitcode-infra", dest="nccl_exitcode_infra", action="store_const", const=125,
                    default=None, help=INFRA_HELP)
    parser.addini("nccl_preload", PRELOAD_HELP, type="linelist", default=[])


# -- parsers: one clear line for anything wrong ----------------------------------------------------

def parse_world(value, where: str) -> int:
    try:
        world = int(str(value).strip())
    except (TypeError, ValueError):
        raise NcclUsageError(f"{where} must be a whole number of ranks >= 1, got {value!r}") from None
    if world < 1:
        raise NcclUsageError(f"{where} must be a whole number of ranks >= 1, got {value!r}")
    return world


def parse_timeout(value, where: str) -> float:
    try:
        timeout = float(str(value).strip())
    except (TypeError, ValueError):
        raise NcclUsageError(f"{where} must be a number of seconds > 0, got {value!r}") from None
    if not timeout > 0:
        raise NcclUsageError(f"{where} must be a number of seconds > 0, got {value!r}")
    return timeout


def parse_choice(value, where: str, choices: tuple) -> str:
    choice = str(value).strip().lower()
    if choice not in choices:
        raise NcclUsageError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
    return choice


def parse_backend(value, where: str) -> str:
    return parse_choice(value, where, BACKENDS)


def parse_switch(value, where: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("on", "off", "1", "0", "true", "false"):
        raise NcclUsageError(f"{where} must be on or off, got {text!r}")
    return text in ("on", "1", "true")


@dataclass(frozen=True)
class Settings:
    """The session's settings, after parsing."""
    world: int = 2
    backend: str = "auto"
    timeout: float = 120.0
    trace: bool = True
    spmd: str = "auto"
    rank_start: str = "auto"
    trace_dir: str | None = None
    report: str | None = None
    exitcode_infra: int | None = None
    preload: tuple = ()


def _value(config, name: str):
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def parse_settings(config) -> Settings:
    """Every option and ini key of the plugin; NcclUsageError names the first bad one."""
    return Settings(
        world=parse_world(_value(config, "nccl_world"), "--nccl-world"),
        backend=parse_backend(_value(config, "nccl_backend"), "--nccl-backend"),
        timeout=parse_timeout(_value(config, "nccl_timeout"), "--nccl-timeout"),
        trace=parse_switch(_value(config, "nccl_trace"), "--nccl-trace"),
        spmd=parse_choice(_value(config, "nccl_spmd"), "--nccl-spmd", SPMD_MODES),
        rank_start=parse_choice(_value(config, "nccl_rank_start"), "--nccl-rank-start", RANK_STARTS),
        trace_dir=config.getoption("nccl_trace_dir"),
        report=config.getoption("nccl_report"),
        exitcode_infra=config.getoption("nccl_exitcode_infra"),
        preload=tuple(config.getini("nccl_preload")),
    )


@dataclass(frozen=True)
class MarkerArgs:
    """What ``@pytest.mark.nccl(...)`` asks for; None: the session's setting."""
    world: int | None = None
    timeout: float | None = None
    backend: str | None = None


def parse_marker(item) -> MarkerArgs | None:
    """The item's nccl marker, parsed; None for an unmarked item."""
    marker = item.get_closest_marker("nccl")
    if marker is None:
        return None
    kw = dict(marker.kwargs)
    if marker.args:
        kw.setdefault("world", marker.args[0])
    unknown = set(kw) - set(MARKER_ARGS)
    if unknown:
        raise NcclUsageError(f"@pytest.mark.nccl got unknown argument(s) {', '.join(sorted(unknown))}; "
                             f"it takes {', '.join(MARKER_ARGS)}")
    world = kw.get("world")
    timeout = kw.get("timeout")
    backend = kw.get("backend")
    return MarkerArgs(
        world=parse_world(world, "@pytest.mark.nccl(world=...)") if world is not None else None,
        timeout=parse_timeout(timeout, "@pytest.mark.nccl(timeout=...)") if timeout is not None else None,
        backend=parse_backend(backend, "@pytest.mark.nccl(backend=...)") if backend is not None else None)


# -- where a group's ranks run -----------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """The backend of a group and what CUDA its ranks see.

    ``gpus``: each rank gets a GPU of its own (leased, ``CUDA_VISIBLE_DEVICES`` = the lease), so
    ``cuda:LOCAL_RANK`` is valid. Otherwise CUDA is hidden from the ranks (``CUDA_VISIBLE_DEVICES``
    empty): gloo fallback means the CPU path, and libraries that see a GPU would put rank N on
    ``cuda:N``, which does not exist on a host with fewer GPUs than ranks ("invalid device ordinal").
    """
    backend: str
    why: str
    gpus: bool = False

    def describe(self) -> str:
        return f"backend {self.backend} ({self.why})"


def _devices(n: int) -> str:
    return f"{n} CUDA device{'s' if n != 1 else ''}"


def place(requested: str, world: int, cuda_devices: int) -> Placement:
    """Where a group of ``world`` ranks runs on a host with ``cuda_devices`` GPUs.

    auto: NCCL with a GPU per rank when there are enough, else gloo with CUDA hidden.
    nccl: NCCL, or one clear error when there are too few GPUs.
    gloo: gloo; with a GPU per rank when there are enough (gloo tests of code that keeps its model on
    ``cuda:LOCAL_RANK``), else with CUDA hidden, as under the automatic fallback.
    """
    if requested == "nccl":
        if cuda_devices < world:
            raise NcclUsageError(f"--nccl-backend=nccl needs {world} CUDA devices for world {world}; "
                                 f"this machine has {cuda_devices}")
        return Placement("nccl", "requested", gpus=True)
    if requested == "gloo":
        if cuda_devices == 0:
            return Placement("gloo", "requested")
        if cuda_devices >= world:
            return Placement("gloo", f"requested; a GPU per rank: {_devices(cuda_devices)} >= world {world}",
                             gpus=True)
        return Placement("gloo", f"requested; CUDA hidden from the ranks: {_devices(cuda_devices)} < world {world}")
    if cuda_devices == 0:
        return Placement("gloo", "auto: no CUDA device")
    if cuda_devices < world:
        return Placement("gloo", f"auto: {_devices(cuda_devices)} < world {world}; CUDA hidden from the ranks")
    return Placement("nccl", f"auto: {_devices(cuda_devices)} >= world {world}", gpus=True)


# -- the bound of one test -----------------------------------------------------------------------------

def _number(value) -> float:
    try:
        return float(value) if value not in (None, "") else 0.0
    except (TypeError, ValueError):
        return 0.0


def pytest_timeout_of(item) -> tuple[float, bool]:
    """(seconds, func_only) of pytest-timeout for this item; 0 when it sets none."""
    seconds, func_only = None, None
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        seconds = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        func_only = marker.kwargs.get("func_only")
    config = item.config
    if seconds is None:
        for get in (config.getoption, config.getini):
            try:
                seconds = get("timeout")
            except (ValueError, KeyError, AttributeError):
                seconds = None
            if seconds not in (None, ""):
                break
    if func_only is None:
        try:
            func_only = config.getini("timeout_func_only")
        except (ValueError, KeyError):
            func_only = False
    return _number(seconds), bool(func_only) and str(func_only).lower() not in ("false", "0")


@dataclass
class Budget:
    """The time a test may take: our bound, and pytest-timeout's deadline when it has one.

    pytest-timeout's clock starts with the item's set-up (or with the call, ``func_only``), and
    group start (fork server, imports, rendezvous) happens inside the call: so the bound is what is
    left of pytest-timeout's budget once the group is up, minus what our report needs.
    """
    timeout: float
    deadline: float | None = None    # time.monotonic() at which pytest-timeout fires

    def setup_deadline(self, now: float | None = None, minimum: float = 30.0) -> float:
        now = time.monotonic() if now is None else now
        own = now + max(self.timeout, minimum)
        return own if self.deadline is None else min(own, self.deadline - PYTEST_TIMEOUT_RESERVE)

    def bound(self, now: float | None = None) -> float:
        """The bound of a call that starts now."""
        if self.deadline is None:
            return self.timeout
        now = time.monotonic() if now is None else now
        return max(MIN_BOUND, min(self.timeout, self.deadline - now - PYTEST_TIMEOUT_RESERVE))


def budget_for(item, timeout: float, started: float | None) -> Budget:
    """``started``: when pytest-timeout's clock started for this item (set-up, or the call)."""
    seconds, func_only = pytest_timeout_of(item)
    if seconds <= 0:
        return Budget(timeout)
    start = started if (started is not None and not func_only) else time.monotonic()
    return Budget(timeout, start + seconds)
