"""The launched group as this rank sees it: the launcher's store (one client per thread that waits
on it), the default process group created over it (again after a failed test), and releasing this
rank from a test (connections, NCCL communicators, the main thread), or leaving when nothing can.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from ..core.nccl_env import nccl_env
from ..core.referee import TIMING as RULES
from ..core.states import Backend
from ..errors import RankSetupError
from .liveness import RankProcess
from .release import abort_connections
from .store import BYE, DONE, LEFT, PROC, poll, safe_set
from .timing import TIMING

if TYPE_CHECKING:  # torch is imported when a rank connects, not when pytest loads the plugin
    from torch.distributed import Store, TCPStore

Client = TypeVar("Client")
INTERRUPT_SIGNAL = signal.SIGUSR2   # the decider aborted the test: interrupt a body outside collectives
STUCK_EXIT_CODE = 1


class LaunchedGroup:
    """The store clients and the process group of this rank."""

    def __init__(self, launch, backend: str, debug, say):
        self.launch, self.backend = launch, backend
        self.rank, self.world = launch.rank, launch.world
        self.debug, self.say = debug, say
        # main thread's, watchdog's, decider's (rank 0); None until connect() (or when it failed)
        self.store: Store | None = None
        self.wstore: Store | None = None
        self.dstore: Store | None = None
        self._base: TCPStore | None = None     # the main thread's TCPStore client (under self.store)
        self.gen = 0                           # process group generation: its store prefix pg<gen>/
        self._processes: dict[int, RankProcess] = {}  # the ranks' processes, as they published them
        self.need_group = True                 # (re)create the default group at the next marked test
        self.pg_timeout = 0.0

    def connect(self) -> None:
        """The launcher's store: torchrun's agent hosts it (every rank is a client); without an agent
        rank 0 hosts it, as ``env://`` would. One client per thread that waits on it."""
        import torch.distributed as dist
        launch = self.launch
        timeout = datetime.timedelta(seconds=TIMING.collect_wait)
        host = launch.rank == 0 and not launch.agent_store

        def client(master: bool = False):
            return dist.TCPStore(launch.master_addr, launch.master_port, launch.world, master, timeout=timeout,
                                 wait_for_workers=False)

        try:
            self._base = client(host)
            prefix = f"pytest-nccl/{launch.run_id}/{launch.attempt}/"
            self.store = dist.PrefixStore(prefix, self._base)
            self.wstore = dist.PrefixStore(prefix, client())
            self.dstore = dist.PrefixStore(prefix, client()) if launch.rank == 0 else None
            self.store.set(PROC.format(launch.rank), RankProcess.mine().to_text())
        except Exception as exc:  # the launcher's store, any torch: one usage line
            self.store = self.wstore = self.dstore = None
            raise pytest.UsageError(
                f"pytest-nccl SPMD mode: rank {launch.rank} cannot reach the launcher's store at "
                f"{launch.master_addr}:{launch.master_port}: {type(exc).__name__}: {exc}") from None

    def ended(self, rank: int, client: Any) -> bool:
        """That rank's process is known to have ended (its pids are this process's: ``liveness``);
        read with ``client``, the calling thread's store client."""
        process = self._processes.get(rank)
        if process is None:
            key = PROC.format(rank)
            if not client.check([key]):
                return False
            process = self._processes[rank] = RankProcess.from_text(client.get(key).decode("utf-8", "replace"))
        return process.ended()

    def set(self, key: str, value) -> None:
        safe_set(self.store, key, value, self.debug)

    def _connected(self, client: Client | None) -> Client:
        """A store client of ``connect``, which every test and the session's end come after."""
        if client is None:
            raise RankSetupError(f"pytest-nccl: rank {self.rank} is not connected to the launcher's store")
        return client

    def ensure(self, bound: float) -> None:
        """The default process group, over the launcher's store (prefix ``pg<gen>/``), with the bound
        plus a margin as its timeout (so our bound fires first); created again after a failed test,
        after a test that destroyed it, or when a test needs a longer timeout. Every rank decides alike
        (the verdicts and bounds are the same everywhere), so they meet under the same prefix."""
        import torch
        import torch.distributed as dist
        want = bound + RULES.pg_timeout_margin
        initialized = dist.is_initialized()
        if initialized and not self.need_group and self.pg_timeout >= want:
            return
        if initialized:
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a group torn down already raises by torch version: said
                self.debug(f"destroy_process_group: {type(exc).__name__}: {exc}")
        self.gen += 1
        base = self._connected(self._base)
        store = dist.PrefixStore(f"pg{self.gen}/", self._connected(self.store))
        kwargs: dict[str, Any] = {}
        if self.backend == Backend.NCCL:
            torch.cuda.set_device(self.launch.local_rank)
            kwargs["device_id"] = torch.device("cuda", self.launch.local_rank)
            # this process is the rank: NCCL reads them when the group is made (core/nccl_env.py)
            os.environ.update(nccl_env(os.environ, torch.__version__))
        t0 = time.monotonic()
        try:
            base.set_timeout(datetime.timedelta(seconds=max(TIMING.group_wait_min, bound)))
            dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world,
                                    timeout=datetime.timedelta(seconds=want), **kwargs)
        except Exception as exc:  # init_process_group's error differs by backend and torch: one line
            self.need_group = True
            raise RankSetupError(f"pytest-nccl: rank {self.rank} could not create the {self.backend} process group "
                                 f"(generation {self.gen}): {type(exc).__name__}: {exc}") from None
        finally:
            try:
                base.set_timeout(datetime.timedelta(seconds=TIMING.collect_wait))
            except Exception:  # a store gone raises by its type: nothing left to set
                pass
        self.need_group = False
        self.pg_timeout = want
        self.debug(f"process group pg{self.gen}/ ({self.backend}, timeout {want:g} s) in "
                   f"{time.monotonic() - t0:.2f} s")

    def destroy(self) -> None:
        if self.need_group:
            return
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # at exit, a group torn down already raises by torch version
            pass

    def abort(self, run) -> None:
        """Release this rank from the test: shut down its established TCP connections except those
        to the launcher's store (gloo collectives, TCPStore rendezvous), abort NCCL's communicators,
        interrupt the main thread when it runs a fixture or the body."""
        count = abort_connections({self.launch.master_port})
        self.debug(f"abort {run.nodeid}: shut down {count} connections")
        if self.backend == Backend.NCCL:
            try:
                from torch.distributed.distributed_c10d import _abort_process_group
                _abort_process_group()
            except Exception as exc:  # a private torch helper, any version: said
                self.debug(f"_abort_process_group: {type(exc).__name__}: {exc}")
        if run.running:
            run.interrupt = True
            main = threading.main_thread().ident  # set: the main thread runs
            if run.user_depth > 0 and main is not None:
                try:
                    signal.pthread_kill(main, INTERRUPT_SIGNAL)
                except (OSError, ValueError):
                    pass

    def abandon(self, run) -> None:
        """This rank's main thread could not be released (a C++ wait without a socket or a timeout):
        the session stops after this test on every rank. Leave once rank 0 is done with its report."""
        after = "the interrupt" if run.interrupted_by else "its bound"
        self.say(f"could not be released from {run.nodeid} within {TIMING.release_wait:g} s after {after}; "
                 "this rank leaves once rank 0 has written its report")
        store = self._connected(self.wstore)
        run.leaving()  # the session's end, published now: this rank will not get there
        poll(lambda: store.check([BYE]) or run.finished.is_set(),
             time.monotonic() + TIMING.finish_wait + TIMING.verdict_margin)
        if run.finished.is_set():
            return  # the main thread came back after all
        safe_set(store, LEFT.format(self.rank), "1")
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # about to _exit: a stream may be anything by now
            pass
        os._exit(STUCK_EXIT_CODE)

    def leave_together(self, limit: float) -> None:
        """Ranks leave together, rank 0 last: the others wait until rank 0 has written its report
        (the launcher stops every rank when one exits with an error), rank 0 until they have left;
        each for ``limit`` seconds at most."""
        store = self._connected(self.store)
        if self.rank == 0:
            self.set(BYE, "1")
            waiting = set(range(1, self.world))

            def everyone_left() -> bool:  # or ended: a rank that died is not waited for
                waiting.difference_update({r for r in waiting if store.check([LEFT.format(r)]) or self.ended(r, store)})
                return not waiting

            poll(everyone_left, time.monotonic() + limit)
        else:
            poll(lambda: store.check([BYE]) or self.ended(0, store), time.monotonic() + limit)
            self.set(LEFT.format(self.rank), "1")

    def wait_done(self, limit: float) -> dict:
        """rank -> the unmarked tests that failed there, for every rank that finished within ``limit``."""
        done: dict[int, list] = {}
        store = self._connected(self.store)

        def all_done() -> bool:
            for r in range(self.world):
                if r not in done and store.check([DONE.format(r)]):
                    done[r] = json.loads(store.get(DONE.format(r)))
                elif r not in done and self.ended(r, store):  # died: what failed there is unknown
                    done[r] = []
            return len(done) == self.world

        poll(all_done, time.monotonic() + limit)
        return done
