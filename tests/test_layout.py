"""The package's layout rules (docs/architecture.md, "Rules"), checked on the source: no import cycle,
the rank side imports nothing of the controller side, the pure modules import neither torch nor
processes, nothing imports the plugin's hooks, no file over about 400 lines (MAX_LINES)."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pytest_nccl"
PURE_FORBIDDEN = {"torch", "subprocess", "socket", "multiprocessing", "threading", "signal"}
# core.exits names signal numbers (signal.Signals); it installs no handler and sends no signal
PURE_EXEMPT = {"core.exits": {"signal"}}
MAX_LINES = 420  # "about 400": a module past it is cut by concern


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> tuple[set, set]:
    """(modules of this package it imports, anywhere in the file; external top-level names)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    candidate = f"{target}.{alias.name}" if target else alias.name
                    ours.add(candidate if (PKG / (candidate.replace(".", "/") + ".py")).exists()
                             or (PKG / candidate.replace(".", "/")).is_dir() else target)
            elif node.module and node.module.startswith("pytest_nccl"):
                ours.add(node.module.removeprefix("pytest_nccl").lstrip("."))
            elif node.module:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pytest_nccl"):
                    ours.add(alias.name.removeprefix("pytest_nccl").lstrip("."))
                else:
                    external.add(alias.name.split(".")[0])
    ours.discard("")
    return ours, external


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def in_folder(*folders: str) -> set:
    return {name for name in MODULES if name.split(".")[0] in folders}


# What every rank imports (forked, spawned, SPMD, a watched job's): small, fast to load, nothing of
# the controller side. The pure analysis (core/) is part of it: ranks write the journal format and
# the messages it defines.
RANK_SIDE = in_folder("core", "rank") | {
    "errors",
    # pytest-nccl watch: the start-up hook every process of a watched job runs
    "watch", "watch.timing", "watch.debug",
    *(name for name in MODULES if name.startswith("watch.inrank"))}
# Pure: tested on data with a fake clock; no torch, no processes, no sockets.
PURE = in_folder("core") | {"settings", "views.timeline", "views.swimlane", "views.github", "bisect.tomlcompat",
                            "bisect.matrix", "bisect.matrix.results", "bisect.matrix.cells",
                            "bisect.matrix.findings", "bisect.matrix.render", "bisect.matrix.shards",
                            "explain", "explain.verdict", "explain.consistency", "explain.testtrace"}
GRAPH = {name: imports_of(path)[0] & set(MODULES) for name, path in MODULES.items()}


def test_no_import_cycle():
    state: dict = {}

    def visit(node, trail):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "import cycle: " + " -> ".join(trail + [node])
        state[node] = "open"
        for dep in sorted(GRAPH[node]):
            if dep != node and not node.startswith(dep + "."):  # a package's own __init__ is not a cycle
                visit(dep, trail + [node])
        state[node] = "done"

    for name in sorted(GRAPH):
        visit(name, [])


@pytest.mark.parametrize("name", sorted(RANK_SIDE))
def test_rank_side_imports_only_the_rank_side(name):
    assert GRAPH[name] <= RANK_SIDE, f"{name} imports {sorted(GRAPH[name] - RANK_SIDE)}"


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_import_no_torch_and_start_nothing(name):
    external = imports_of(MODULES[name])[1]
    forbidden = external & PURE_FORBIDDEN - PURE_EXEMPT.get(name, set())
    assert not forbidden, f"{name} imports {sorted(forbidden)}"
    assert GRAPH[name] <= PURE | {"errors"}, f"{name} imports {sorted(GRAPH[name] - PURE)}"


def test_nothing_imports_the_plugin():
    importers = sorted(n for n, deps in GRAPH.items() if "plugin" in deps)
    assert not importers, importers


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_file_far_over_400_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines"


def test_the_watch_s_sides_import_as_drawn():
    """watch/: the rank side imports none of the controller; the engine none of the front-ends."""
    for name, deps in GRAPH.items():
        if name.startswith("watch.inrank"):
            assert not {d for d in deps if d.startswith(("watch.engine", "watch.frontends"))}, (name, deps)
        if name.startswith("watch.engine"):
            assert not {d for d in deps if d.startswith("watch.frontends")}, (name, deps)
