"""Settings, declared once and parsed on one path (as pytest-timeout does): each setting is one row
of :data:`SETTINGS` that says its command-line option, its ini key (with the ini type pytest checks
TOML values against), whether ``@pytest.mark.nccl`` takes it, its parser and its default. Where a
group's ranks run is ``placement.py``; the bound of one test under pytest-timeout, ``budget.py``.

Controller side, no torch import at module level: every parser turns bad input into one
``NcclUsageError`` line that names where the value came from (the option, the ini key, the marker).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Any, Callable, Literal

import pytest

from .core.messages import RankStart
from .core.states import Backend, Word
from .errors import NcclUsageError
from .views.github import GithubMode

BACKENDS = tuple(Backend)
RANK_STARTS = tuple(RankStart)
#: the fixtures a marked test gets from its rank; a user's own fixture or parameter of one of these
#: names cannot reach a marked test (see :func:`rank_fixture_conflict`)
RANK_FIXTURES = ("rank", "world_size", "device", "backend")
#: exit status of --nccl-exitcode-infra: git bisect's "cannot test this commit"
EXITCODE_INFRA = 125


class SpmdMode(Word):
    """``--nccl-spmd``: SPMD mode under a launcher."""
    AUTO = "auto"    # when a launcher set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    ON = "on"
    OFF = "off"


SPMD_MODES = tuple(SpmdMode)
GITHUB_MODES = tuple(GithubMode)


# -- parsers: one clear line for anything wrong; ``where`` names the source -------------------------

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


def parse_choice(value, where: str, choices: tuple) -> Any:
    """The member of ``choices`` (an enum's members) that ``value`` names."""
    choice = str(value).strip().lower()
    if choice not in choices:
        raise NcclUsageError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
    return type(choices[0])(choice)


def parse_backend(value, where: str) -> str:
    return parse_choice(value, where, BACKENDS)


def parse_switch(value, where: str) -> bool:
    text = str(value).strip().lower()  # TOML's true/false arrive as bool: "true"/"false" here
    if text not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
        raise NcclUsageError(f"{where} must be on or off, got {value!r}")
    return text in ("on", "1", "true", "yes")


def _text(value, where: str) -> str:
    return str(value)


def _lines(value, where: str) -> tuple:
    return tuple(value.split()) if isinstance(value, str) else tuple(str(v) for v in value)


def _infra_code(value, where: str) -> int | None:
    return EXITCODE_INFRA if value else None


# -- the table --------------------------------------------------------------------------------------

IniType = Literal["string", "paths", "pathlist", "args", "linelist", "bool", "int", "float"]  # addini's


@dataclass(frozen=True)
class Setting:
    """One setting. Its ini key and option dest are ``nccl_<name>``, its option ``--nccl-<name>``."""
    name: str                               # the attribute of :class:`Settings`
    help: str
    parse: Callable[[Any, str], Any]        # (value, where it came from) -> the value, or NcclUsageError
    default: Any                            # the parsed default
    metavar: str | None = None              # the option takes a value; None and not switch: no option
    switch: bool = False                    # the option is a switch without a value
    ini: IniType | None = None              # the ini type; None: no ini key
    marker: bool = False                    # @pytest.mark.nccl(name=...) overrides it per test

    @property
    def key(self) -> str:
        return "nccl_" + self.name

    @property
    def option(self) -> str | None:
        return "--nccl-" + self.name.replace("_", "-") if (self.metavar or self.switch) else None


SETTINGS = (
    Setting("world", "world size of distributed tests that do not set one (default 2)", parse_world, 2,
            metavar="N", ini="int", marker=True),
    Setting("backend", "auto (NCCL when CUDA has at least WORLD devices, else gloo with CUDA hidden from the "
            "ranks), nccl, or gloo", parse_backend, "auto", metavar="auto|nccl|gloo", ini="string", marker=True),
    Setting("timeout", "bound in seconds for each distributed test (default 120)", parse_timeout, 120.0,
            metavar="SECONDS", ini="float", marker=True),
    Setting("trace", "record every collective on every rank (on, the default) or not", parse_switch, True,
            metavar="on|off", ini="bool"),
    Setting("spmd", "auto (the default: SPMD when a launcher such as torchrun set RANK, WORLD_SIZE, MASTER_ADDR "
            "and MASTER_PORT), on or off. In SPMD mode each launched pytest process is one rank",
            lambda v, where: parse_choice(v, where, SPMD_MODES), "auto", metavar="auto|on|off", ini="string"),
    Setting("rank_start", "how ranks start: fork from the fork server (fast), spawn a fresh interpreter per "
            "rank, or auto (fork, unless a test module initialized CUDA in the fork server)",
            lambda v, where: parse_choice(v, where, RANK_STARTS), "auto", metavar="auto|fork|spawn",
            ini="string"),
    Setting("trace_dir", "write each failed distributed test's collective trace (JSON, Flight Recorder dumps, "
            "swimlane page) here", _text, None, metavar="DIR"),
    Setting("report", "write a validation-gate report (markdown) to this file", _text, None, metavar="FILE"),
    Setting("exitcode_infra", f"exit with {EXITCODE_INFRA} (git bisect's 'skip') when the commit cannot be "
            "tested: every failure is an infrastructure failure (ranks could not start, the library does "
            "not import), nothing was collected, a node id was not found, or a usage error",
            _infra_code, None, switch=True),
    Setting("preload", "modules the fork server imports once, so that every rank has them", _lines, (),
            ini="linelist"),
    Setting("adopt", "run the distributed tests a test suite already has under this plugin's bound, trace and "
            "diagnosis (on, the default: torch's MultiProcessTestCase and MultiProcContinuousTest classes get "
            "their ranks from the fork server) or not (off: they run under their own harness)",
            parse_switch, True, metavar="on|off", ini="bool"),
    Setting("github", "GitHub Actions: each failed distributed test as an error annotation at its call site, "
            "and a table in the job summary: auto (the default: annotations when GITHUB_ACTIONS=true, the "
            "table when GITHUB_STEP_SUMMARY is set), on, or off",
            lambda v, where: parse_choice(v, where, GITHUB_MODES), "auto", metavar="auto|on|off", ini="string"),
)
BY_NAME = {s.name: s for s in SETTINGS}
MARKER_ARGS = tuple(s.name for s in SETTINGS if s.marker)
MARKER = (f"nccl({', '.join(f'{name}=None' for name in MARKER_ARGS)}): run the test body on every rank of a "
          "torch.distributed group of `world` processes (NCCL on GPUs, else gloo), bounded in time")
# pytest-timeout's marker, whose bound budget.py reads with or without pytest-timeout: declared here
# where pytest-timeout is absent (so --strict-markers takes it), else by pytest-timeout itself
TIMEOUT_MARKER = "timeout(seconds): bound for a test (pytest-timeout's marker; pytest-nccl reads it)"


def ini_type(declared: IniType, pytest_version: tuple[int, int] | None = None) -> IniType:
    """The ini type to declare: ``int`` and ``float`` exist from pytest 8.4 on (with them pytest 9's
    ``[tool.pytest]`` takes TOML numbers); older pytest reads them as strings, which we parse."""
    version = tuple(pytest.version_tuple[:2]) if pytest_version is None else pytest_version
    if declared in ("int", "float") and version < (8, 4):
        return "string"
    return declared


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("nccl", "distributed tests on torch.distributed groups (pytest-nccl)")
    for s in SETTINGS:
        option = s.option  # None: no command-line option (an ini key only)
        if option is not None and s.switch:
            group.addoption(option, dest=s.key, action="store_true", default=None, help=s.help)
        elif option is not None:
            group.addoption(option, dest=s.key, metavar=s.metavar, help=s.help)
        if s.ini:
            # no default here: "not set" must be told apart from a value, to fall back on s.default
            parser.addini(s.key, s.help, type=ini_type(s.ini), default=None)


# -- reading them ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """The session's settings, after parsing."""
    world: int = BY_NAME["world"].default
    backend: str = BY_NAME["backend"].default
    timeout: float = BY_NAME["timeout"].default
    trace: bool = BY_NAME["trace"].default
    spmd: str = BY_NAME["spmd"].default
    rank_start: str = BY_NAME["rank_start"].default
    trace_dir: str | None = None
    report: str | None = None
    exitcode_infra: int | None = None
    preload: tuple = ()
    adopt: bool = BY_NAME["adopt"].default
    github: str = BY_NAME["github"].default


assert {f.name for f in fields(Settings)} == set(BY_NAME), "every setting is one field of Settings"


def _unset(value) -> bool:
    return value is None or value == "" or value == []   # pytest < 9 gives "" or [] for an unset key


def ini_source(config, key: str) -> str:
    """How a message names an ini key's value: set with ``-o`` or in the config file."""
    overrides = getattr(config.option, "override_ini", None) or []
    if any(str(o).split("=", 1)[0].strip() == key for o in overrides):
        return f"-o {key}"
    inipath = getattr(config, "inipath", None)
    return f"ini key {key}" + (f" ({inipath.name})" if inipath is not None else "")


def setting_value(config, s: Setting) -> tuple[Any, str] | None:
    """(raw value, where it came from) of one setting: the option wins over the ini key; None: unset."""
    if s.option is not None:
        value = config.getoption(s.key, None)
        if value is not None:
            return value, s.option
    if s.ini is not None:
        where = ini_source(config, s.key)
        try:
            value = config.getini(s.key)
        except (pytest.UsageError, ValueError, TypeError) as exc:  # pytest's own type check of the value
            detail = str(exc).split(": config option", 1)[-1].strip()
            raise NcclUsageError(f"{where}: {detail}") from None
        if not _unset(value):
            return value, where
    return None


def parse_settings(config) -> Settings:
    """Every option and ini key of the plugin; NcclUsageError names the first bad one and its source."""
    values = {}
    for s in SETTINGS:
        found = setting_value(config, s)
        values[s.name] = s.default if found is None else s.parse(*found)
    return Settings(**values)


def exitcode_infra_of(config) -> int | None:
    """--nccl-exitcode-infra alone (it cannot be wrong): read even when another setting is."""
    return _infra_code(config.getoption(BY_NAME["exitcode_infra"].key, None), "")


@dataclass(frozen=True)
class MarkerArgs:
    """What ``@pytest.mark.nccl(...)`` asks for; None: the session's setting."""
    world: int | None = None
    timeout: float | None = None
    backend: str | None = None


def parse_marker(item) -> MarkerArgs | None:
    """The item's nccl marker, parsed by the same parsers as the options; None for an unmarked item."""
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
    return MarkerArgs(**{name: BY_NAME[name].parse(value, f"@pytest.mark.nccl({name}=...)")
                         for name, value in kw.items() if value is not None})


def rank_fixture_conflict(argnames, from_plugin, parametrized) -> str | None:
    """The one-line error for a marked test that takes a rank fixture (``rank``, ``device``, ...)
    whose value is not the plugin's: the user's own fixture of that name, or a parametrize argument.
    In a marked test those names mean the rank's values, so ours would silently replace theirs."""
    clashes = [n for n in argnames if n in RANK_FIXTURES and n not in from_plugin]
    if not clashes:
        return None
    name = clashes[0]
    what = "a parametrize argument" if name in parametrized else "a fixture of your own"
    return (f"'{name}' is {what}, and in a test marked nccl it is also pytest-nccl's rank fixture; rename "
            f"yours ({', '.join(RANK_FIXTURES)} are the rank's in marked tests)")


def argnames_of(item) -> tuple[str, ...]:
    """The names the test function takes (fixtures and parameters). pytest keeps them in a private
    attribute (``_fixtureinfo.argnames``, unchanged since pytest 3); should it go, the function's
    signature, less what has a default or was not supplied."""
    names = getattr(getattr(item, "_fixtureinfo", None), "argnames", None)
    if names is not None:
        return tuple(names)
    import inspect
    try:
        params = inspect.signature(item.obj).parameters.values()
    except (TypeError, ValueError):
        return tuple(item.funcargs)
    return tuple(p.name for p in params if p.default is p.empty and p.name in item.funcargs)


def unsupported_platform(platform: str | None = None) -> str | None:
    """Why distributed tests cannot run here, or None: the fork server, PR_SET_PDEATHSIG, pidfds and
    /proc are Linux's."""
    platform = sys.platform if platform is None else platform
    if platform.startswith("linux"):
        return None
    return f"pytest-nccl runs distributed tests on Linux only (this is {platform})"
