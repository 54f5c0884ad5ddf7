"""Library state a rank of the plugin's group holds before a test, built as the library's own launcher
has it built on a GPU, so that the library counts the group it runs in.

accelerate: since 1.13 a bare ``PartialState()`` on a CPU rank counts one process, whatever the
environment says (it reads only its ``cpu`` argument; docs/support.md). Where the rank runs accelerate
on the CPU (``ACCELERATE_USE_CPU``, which the plugin's CPU ranks get), its ``PartialState`` is built
with ``cpu=True`` before each test, or as soon as a test first imports accelerate: the state a GPU
rank's bare ``PartialState()`` gets, there from the start. A test that resets accelerate's state gets
accelerate's own default; ``ACCELERATE_USE_CPU=false`` leaves it all to accelerate.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Mapping
from types import ModuleType

ACCELERATE_STATE = "accelerate.state"

# the words accelerate's own flag reading (``str_to_bool``) takes for yes
_YES = frozenset({"y", "yes", "t", "true", "on", "1"})


def accelerate_on_cpu(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this rank runs accelerate on the CPU, as ``ACCELERATE_USE_CPU`` says."""
    return environ.get("ACCELERATE_USE_CPU", "").strip().lower() in _YES


def prepare() -> None:
    """Before a test in a rank of the plugin's group: accelerate's state, where accelerate is loaded
    (a no-op where the state exists). An error is raised: the test would meet it in accelerate."""
    module = sys.modules.get(ACCELERATE_STATE)
    if module is not None:
        _build_accelerate_state(module)


def install() -> None:
    """From now on in this rank, build accelerate's state as soon as ``accelerate.state`` is first
    imported (a test that imports accelerate in its body). Once per process."""
    if accelerate_on_cpu() and not any(isinstance(f, _AfterAccelerateImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterAccelerateImport())


def _build_accelerate_state(module: ModuleType) -> None:
    import torch.distributed as dist
    if accelerate_on_cpu() and dist.is_initialized():
        module.PartialState(cpu=True)  # accelerate's Borg: once built, later calls change nothing


class _AfterAccelerateImport(importlib.abc.MetaPathFinder):
    """Finds ``accelerate.state`` as the other finders do, with a loader that builds the state once
    the module has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != ACCELERATE_STATE:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenBuild(spec.loader)
                return spec
        return None


class _ThenBuild(importlib.abc.Loader):
    """A module's own loader, then accelerate's state built. A failure there leaves the import as it
    was and says so on the rank's stderr: the test's own ``PartialState()`` meets it or counts 1."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            _build_accelerate_state(module)
        except Exception as exc:  # accelerate's own error, any version: said, the import kept
            print(f"pytest-nccl: accelerate's PartialState(cpu=True) failed on import: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the module's own loader's
        if name == "loader":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
