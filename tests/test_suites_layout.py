"""The suites' layout: no folder that pytest puts on ``sys.path`` for them holds a folder named after
a module they import. pytest's default import mode prepends the folder of each conftest.py and test
module (the first one up without ``__init__.py``); a ``suites/verl`` beside such a path is imported
as the namespace package ``verl`` where verl is not installed, and ``importorskip("verl")`` passes."""

from __future__ import annotations

import ast
from pathlib import Path

SUITES = Path(__file__).resolve().parents[1] / "suites"


def imported_top_names(path: Path) -> set[str]:
    """Top-level module names a file imports or ``importorskip``s (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value).partition(".")[0])
    return names


def sys_path_entry(path: Path) -> Path:
    """The folder pytest's prepend mode puts on ``sys.path`` for a conftest.py or test module."""
    folder = path.parent
    while (folder / "__init__.py").exists():
        folder = folder.parent
    return folder


def test_no_folder_on_the_suites_path_shadows_a_module_they_import():
    files = sorted(SUITES.rglob("*.py"))
    imported = set().union(*(imported_top_names(f) for f in files))
    entries = {sys_path_entry(f) for f in files if f.name == "conftest.py" or f.name.startswith("test_")}
    shadows = sorted(str(child.relative_to(SUITES.parent)) for entry in entries for child in entry.iterdir()
                     if child.is_dir() and child.name in imported)
    assert "verl" in imported and "trl" in imported  # the rule reads the suites' imports
    assert not shadows, f"on sys.path under pytest, these folders shadow the modules they are named after: {shadows}"
