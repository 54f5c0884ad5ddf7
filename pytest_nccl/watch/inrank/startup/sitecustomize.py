"""Start-up hook of ``pytest-nccl watch``, run by every Python process of the watched job: the
watch puts this file's directory first on the job's ``PYTHONPATH`` (as coverage's subprocess support
and APM agents' ``*-run`` wrappers do).

1. In every process of the job (``PYTEST_NCCL_WATCH_DIR`` set) it puts a meta path finder first on
   ``sys.meta_path`` that waits for torch's module to *run*: it answers ``find_spec("torch")`` with
   torch's own spec whose loader calls back once torch has executed, and stays armed until then, so
   a probe (``importlib.util.find_spec("torch")``, as transformers, datasets and trl do before they
   import it) does not disarm it, and every way of importing torch (``import``,
   ``importlib.import_module``, lazy loaders, ``-m``, ``-c``, another ``sitecustomize``) is seen.
   Only then does the process load ``pytest_nccl`` (``inject.after_torch``). A process that never
   imports torch pays one string comparison per import, and imports nothing.
2. Then it runs the ``sitecustomize`` this one shadows, if there is one (the distribution's, the
   user's, another tool's), under the same module name, as if it had been found first.

Nothing here may stop the process: failures are reported in one line.
"""

import os
import sys


def _warn(what, exc):
    sys.stderr.write(f"pytest-nccl watch (pid {os.getpid()}): {what}: {type(exc).__name__}: {exc}\n")


def _arrived():
    """torch's module has run in this process: hand over to the watch's own ``pytest_nccl``."""
    try:
        for finder in [f for f in sys.meta_path if _is_torch_finder(f)]:
            sys.meta_path.remove(finder)
        # the watch's copy (the ranks and the watch must agree on the files), loaded from where the
        # watch has it without putting that directory on sys.path
        where = os.environ.get("PYTEST_NCCL_WATCH_PKG")
        if where and "pytest_nccl" not in sys.modules:
            import importlib.machinery
            import importlib.util

            spec = importlib.machinery.PathFinder.find_spec("pytest_nccl", [where])
            if spec is not None and spec.loader is not None:
                package = importlib.util.module_from_spec(spec)
                sys.modules["pytest_nccl"] = package
                try:
                    spec.loader.exec_module(package)
                except BaseException:
                    del sys.modules["pytest_nccl"]
                    raise
        from pytest_nccl.watch.inrank import inject

        inject.after_torch()
    except Exception as exc:  # never stop the user's process
        _warn("collectives are not traced in this process", exc)


def _is_torch_finder(finder) -> bool:
    """Whether ``finder`` is a ``_TorchFinder`` of any copy of this file: a host with two installs of
    pytest-nccl (a ``pip install --target`` beside a checkout) has two classes of that name, and two
    finders that each asked the other for torch would recurse without end."""
    return getattr(type(finder), "_pytest_nccl_torch_finder", False) is True


class _TorchFinder:
    """Finds nothing itself: for ``torch`` it asks the finders after it and returns their spec with a
    loader that calls ``_arrived`` once torch's module has executed."""

    _pytest_nccl_torch_finder = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = None if _is_torch_finder(finder) else getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if loader is None or run is None or getattr(run, "_pytest_nccl_watch", False):
            return spec

        def exec_module(module):
            run(module)
            _arrived()

        vars(exec_module)["_pytest_nccl_watch"] = True
        try:
            loader.exec_module = exec_module
        except Exception:  # a loader that takes no attributes: torch goes untraced here
            pass
        return spec


def _hook():
    if not os.environ.get("PYTEST_NCCL_WATCH_DIR"):
        return
    if "torch" in sys.modules:  # imported before us (a .pth file)
        _arrived()
    elif not any(_is_torch_finder(f) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())


_STARTUP = os.sep + os.path.join("pytest_nccl", "watch", "inrank", "startup")


def _is_startup_dir(path, here):
    """This directory, or another copy's: each copy's ``sitecustomize`` would run the other's as the
    one it shadows, and that one this one's, without end (RecursionError at every start-up)."""
    return path == here or path.endswith(_STARTUP)


def _chain():
    """Load the next ``sitecustomize`` on sys.path after this directory, as ``sitecustomize``."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if not _is_startup_dir(os.path.abspath(p or os.curdir), here)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise


try:
    _hook()
except Exception as _exc:  # never stop the user's process
    _warn("start-up hook failed", _exc)
_chain()
