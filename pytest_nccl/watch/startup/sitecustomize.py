"""Start-up hook of ``pytest-nccl watch``, run by every Python process of the watched job: the
watch puts this file's directory first on the job's ``PYTHONPATH`` (as coverage's subprocess support
and APM agents' ``*-run`` wrappers do).

1. In a rank of the watched job (``PYTEST_NCCL_WATCH_DIR`` and RANK or SLURM_PROCID set) it hands
   over to ``pytest_nccl.watch.inject.bootstrap``, which waits for ``import torch``. In any other
   process it reads two environment variables and imports nothing.
2. Then it runs the ``sitecustomize`` this one shadows, if there is one (the distribution's, the
   user's, another tool's), under the same module name, as if it had been found first.

Nothing here may stop the process: failures are reported in one line.
"""

import os
import sys


def _hook():
    if not os.environ.get("PYTEST_NCCL_WATCH_DIR"):
        return
    if "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        return
    # the watch's own copy of pytest_nccl (the ranks and the watch must agree on the files), loaded
    # from where the watch has it without putting that directory on sys.path
    where = os.environ.get("PYTEST_NCCL_WATCH_PKG")
    if where and "pytest_nccl" not in sys.modules:
        import importlib.machinery
        import importlib.util

        spec = importlib.machinery.PathFinder.find_spec("pytest_nccl", [where])
        if spec is not None:
            package = importlib.util.module_from_spec(spec)
            sys.modules["pytest_nccl"] = package
            try:
                spec.loader.exec_module(package)
            except BaseException:
                del sys.modules["pytest_nccl"]
                raise
    try:
        from pytest_nccl.watch import inject
    except ImportError as exc:
        sys.stderr.write(f"pytest-nccl watch: cannot import pytest_nccl in this process: {exc}\n")
        return
    inject.bootstrap()


def _chain():
    """Load the next ``sitecustomize`` on sys.path after this directory, as ``sitecustomize``."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
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
    sys.stderr.write(f"pytest-nccl watch: start-up hook failed: {type(_exc).__name__}: {_exc}\n")
_chain()
