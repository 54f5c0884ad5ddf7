"""SPMD mode: pytest itself runs under a launcher (``torchrun --nproc-per-node=4 -m pytest suites/``,
two torchrun launchers with a c10d rendezvous, or srun with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
exported): every launched process runs the same session and IS one rank. Nothing is forked.

The launcher's store (TCPStore at MASTER_ADDR:MASTER_PORT: the agent's under torchrun, else rank 0
hosts it, as ``env://`` would) carries what the plugin-mode controller learns over its sockets:

- after collection every rank publishes its test ids; a difference stops the session on every rank
  with the ranks and the first differing test named;
- the plugin creates the default process group over that store (prefix ``pg<gen>/``) in the set-up
  of the first marked test, on every rank, and creates it again under a new prefix after a failed
  test or a test that destroyed it;
- per marked test (keys ``t/<hash of nodeid>/<n>/``), from the start of its set-up (fixtures run on
  the ranks here, so the bound and the trace cover them) to the end of its body: the tracer records
  the rank's collectives; a watchdog thread appends the journal to the store; rank 0's decider thread
  applies the controller's rules (the bound; a rank failed, or finished while others wait in a
  collective it never completed; every rank stuck on a mismatch). When it decides, every rank still
  in the test publishes a snapshot (stacks of all threads, journal) taken while it is stuck; then
  every rank aborts: it shuts down its established TCP connections except those to the launcher's
  store (on gloo this releases a rank inside a collective or a TCPStore rendezvous at once; gloo's own
  ``abort()`` does not, measured on torch 2.13), calls ``_abort_process_group`` on NCCL, and
  interrupts its main thread with a signal when it runs a fixture or the body (a slow rank in
  ``time.sleep`` or a Python loop). Rank 0 diagnoses with ``diagnose()`` and publishes the verdict;
  every rank raises the same exception, rank 0 with the combined report, the others quietly;
- a rank that no abort releases (a C++ wait without a socket or a timeout) is reported as stuck,
  with its stack; the session stops after that test on every rank with rank 0's summary, and the
  stuck rank exits once rank 0 is done;
- a rank whose process dies (``os._exit``, a signal, gloo's SIGABRT on a size mismatch) ends the
  session: rank 0 sees it gone (on its host: ``liveness``) and reports it as DEAD at once; the launcher
  stops every other rank, and a rank outside a marked test says in one line which test it was in;
- an ending signal (a terminal's Ctrl-C, Slurm's SIGTERM, torchrun's forward of either) during a marked
  test is published by the rank that got it; rank 0 concludes the test as interrupted (where each rank
  was) and every rank stops after it (``signals``);
- ranks other than 0 are quiet (no terminal reporter, JUnit XML, gate report or trace dir). At the
  end rank 0 names tests that failed only on other ranks (tests without the marker run on each rank
  independently), and ranks leave together, rank 0 last, so that the launcher, which stops every rank
  when one exits with an error, never cuts rank 0's report short.

Fixtures of any kind work (they run in-process); ``rank``, ``world_size``, ``device`` and
``backend`` hold the real values.

Modules: ``launch`` (detection), ``store`` (key schema, polling), ``group`` (store clients, the
process group, release), ``release`` (TCP connections), ``testrun`` (one test: watchdog, rank 0's
decider feeding the referee), ``session`` (the pytest hooks), ``collection`` (same tests everywhere),
``signals`` (ending signals, the decider's interrupt), ``liveness`` (which rank processes ended).
"""

from __future__ import annotations

import pytest

from ..errors import NcclUsageError
from .launch import Launch, detect
from .session import SpmdSession

__all__ = ["Launch", "SpmdSession", "configure", "detect"]


def configure(config: pytest.Config, nccl) -> "SpmdSession | None":
    """Called from the plugin's pytest_configure: SPMD mode or not; set this rank up."""
    mode = nccl.settings.spmd
    if hasattr(config, "workerinput"):
        return None  # an xdist worker of a plain session
    try:
        launch = detect(mode)
    except NcclUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    if launch is None:
        return None
    if getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") not in ("no", None):
        raise pytest.UsageError("pytest-nccl SPMD mode (launched by torchrun/srun: RANK and WORLD_SIZE are "
                                "set) does not combine with pytest-xdist's -n/--dist; drop one of them")
    sp = SpmdSession(config, nccl, launch)
    config.pluginmanager.register(sp, "nccl-spmd")
    return sp
