"""Rank side (the launcher's process): torchrun's own report of the SIGTERM the watch sent, folded.

torchrun turns SIGTERM into ``SignalException`` and lets it end the process: Python prints its ~25
lines of traceback, which say nothing about the job, right where the watch's verdict comes. When the
watch is ending the job (``jobdir.ending`` exists), this process's excepthook prints one line
instead; any other exception, or a SIGTERM from anyone else, is printed as before. The job's own
output is untouched: this is the launcher's traceback only.
"""

from __future__ import annotations

import os
import sys

from ...core import jobdir

SIGNAL_EXCEPTION = "torch.distributed.elastic.multiprocessing.api"


def install(module) -> None:
    """``module``: torch's elastic multiprocessing API, once imported (torchrun's agent imports it)."""
    exc_type = getattr(module, "SignalException", None)
    base = os.environ.get(jobdir.ENV_DIR)
    if exc_type is None or not base:
        return
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        if issubclass(kind, exc_type) and os.path.exists(jobdir.ending(base)):
            try:
                sys.stderr.write(f"{os.path.basename(sys.argv[0]) or 'launcher'} (pid {os.getpid()}): "
                                 f"{kind.__name__}: {value} (the watch ended the job; traceback folded)\n")
                return
            except Exception:  # an excepthook never raises: stderr may be anything by now
                pass
        previous(kind, value, tb)

    sys.excepthook = excepthook
