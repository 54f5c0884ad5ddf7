"""TRL's GRPO weight sync in server mode, on CPU: the trainer (this process, the group's last member
as in TRL) and the server's workers (``multiprocessing`` children, members 0..N-1) make vLLM's own
``StatelessProcessGroup`` (vLLM's real class) and a ``PyNcclCommunicator`` over it (the CPU stand-in,
``pytest_nccl.testing.pynccl_standin``: NCCL needs a GPU). No process creates a default group.

    python vllm_sync_job.py CASE HOW WORKERS GROUP_PORT [HTTP_PORT]

- HOW ``trl``: TRL's own ``VLLMClient`` (``trl.extras.vllm_client``, TRL before the weight-transfer
  engine: 0.19.1 tested) against a small HTTP server in this process standing in for ``trl vllm-serve``:
  its routes (``/health/``, ``/get_world_size/``, ``/init_communicator/``, ``/update_named_param/``,
  ``/close_communicator/``) and its workers' ``WeightSyncWorkerExtension`` copied from TRL's
  ``trl/scripts/vllm_serve.py``. HOW ``plain``: the trainer makes the same calls itself (TRL's lines).
- HOW ``trl-server`` and ``trl-trainer``: the two commands a user runs (``trl vllm-serve`` and the
  training script), each started on its own (under its own watch); the trainer's step between its
  two syncs takes ``STEP`` seconds.
- CASE ``good``; ``never-joins`` (the last worker never joins the group); ``skip-broadcast`` (the
  trainer posts an update and goes to the barrier without broadcasting: the workers wait in it);
  ``barrier-timeout`` (the trainer never reaches the barrier after its second broadcast; the
  workers' store barrier, its bound made 3 s from TRL's 30, times out: vLLM's barrier times only
  what follows its member 0's arrival, and member 0 is a worker).
"""

import json
import multiprocessing
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

BARRIER_TIMEOUT = 3.0
STEP = 4.0  # the trainer's step between two syncs when it is a command of its own (its watch and the
            # server's meet in the group's store meanwhile: each imports torch first)


def mark(what: str) -> None:
    """The time a member starts a step (the test measures how soon the verdict follows the last one)."""
    print(f"event {time.time():.3f} {what}", flush=True)


class WeightSyncWorker:
    """TRL's ``WeightSyncWorkerExtension`` (trl/scripts/vllm_serve.py), on CPU, one per worker."""

    def __init__(self, rank: int, case: str, workers: int):
        self.rank, self.case, self.last = rank, case, rank == workers - 1
        self.pynccl_comm = None
        self.client_rank = None

    def init_communicator(self, host: str, port: int, world_size: int) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        if self.case == "never-joins" and self.last:
            time.sleep(600)  # busy elsewhere: never joins
        mark(f"worker {self.rank} creates")
        # barrier-timeout: the store's bound short too (vLLM's barrier polls with the store's ``get``,
        # which waits for a missing key as long as the store's timeout: 300 s unless given)
        short = {"store_timeout": int(BARRIER_TIMEOUT) + 1} if self.case == "barrier-timeout" else {}
        pg = StatelessProcessGroup.create(host=host, port=port, rank=self.rank, world_size=world_size, **short)
        self.pynccl_comm = PyNcclCommunicator(pg, device="cpu")
        self.client_rank = world_size - 1

    def update_named_param(self, name: str, dtype: str, shape) -> None:
        weight = torch.empty(shape, dtype=getattr(torch, dtype.split(".")[-1]))
        mark(f"worker {self.rank} receives {name}")
        self.pynccl_comm.broadcast(weight, src=self.client_rank)
        mark(f"worker {self.rank} at the barrier")
        # barrier-timeout: the store barrier's own bound (TRL's default 30 s) made short
        self.pynccl_comm.group.barrier(**({"timeout": BARRIER_TIMEOUT} if self.case == "barrier-timeout" else {}))
        print(f"worker {self.rank} got {name} {weight.tolist()}", flush=True)

    def close_communicator(self) -> None:
        self.pynccl_comm = None


def worker(rank: int, case: str, workers: int, conn) -> None:
    from pytest_nccl.testing import pynccl_standin

    pynccl_standin.install()
    extension = WeightSyncWorker(rank, case, workers)
    while True:
        method, args = conn.recv()
        if method == "exit":
            return
        getattr(extension, method)(*args)


def serve(connections: list, workers: int, http_port: int, closed: threading.Event) -> ThreadingHTTPServer:
    """The routes of ``trl vllm-serve`` the client's weight sync calls, fire-and-forget to every worker
    (``closed`` set once the client closed the group)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health/":
                self._answer({"status": "ok"})
            elif self.path == "/get_world_size/":
                self._answer({"world_size": workers})
            else:
                self.send_error(404)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/init_communicator/":
                send(("init_communicator", (request["host"], request["port"], workers + 1)))
            elif self.path == "/update_named_param/":
                send(("update_named_param", (request["name"], request["dtype"], tuple(request["shape"]))))
            elif self.path == "/close_communicator/":
                send(("close_communicator", ()))
                closed.set()
            else:
                return self.send_error(404)
            self._answer({"message": "Request received"})

    def send(message) -> None:
        for connection in connections:
            connection.send(message)

    server = ThreadingHTTPServer(("127.0.0.1", http_port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def trl_client(case: str, http_port: int, group_port: int, step: float = 0.0) -> None:
    import importlib

    # TRL 0.19 reads transformers' package probe as a bool; newer transformers return a tuple,
    # which would send it to vllm_ascend's communicator: the probe's answer, as it means it
    importlib.import_module("trl.import_utils")._vllm_ascend_available = False
    from trl.extras.vllm_client import VLLMClient

    from pytest_nccl.testing import pynccl_standin

    pynccl_standin.install()
    client = VLLMClient(base_url=f"http://127.0.0.1:{http_port}", group_port=group_port, connection_timeout=60)
    mark("trainer creates")
    client.init_communicator()
    print(f"trainer joined at {time.time()}", flush=True)
    for n in range(2):
        if n:
            time.sleep(step)  # a training step between two syncs
        weights = torch.full((4,), float(n + 1))
        mark(f"trainer sends w{n}")
        if case in ("skip-broadcast", "barrier-timeout") and n == 1:  # update_named_param's lines, one left out
            client.session.post(f"{client.base_url}/update_named_param/",
                                json={"name": "w1", "dtype": str(weights.dtype), "shape": [4]})
            if case == "barrier-timeout":
                client.pynccl_comm.broadcast(weights, src=client.rank)
                time.sleep(600)  # BUSY: never reaches the barrier
            client.pynccl_comm.group.barrier()  # SKIPPED: the broadcast of w1 is not made
        else:
            client.update_named_param(f"w{n}", weights)
    client.close_communicator()


def plain_trainer(case: str, connections: list, workers: int, group_port: int) -> None:
    from pytest_nccl.testing import pynccl_standin

    pynccl_standin.install()
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    def send(message) -> None:
        for connection in connections:
            connection.send(message)

    world = workers + 1
    send(("init_communicator", ("127.0.0.1", group_port, world)))
    mark("trainer creates")
    pg = StatelessProcessGroup.create(host="127.0.0.1", port=group_port, rank=workers, world_size=world)  # CREATE
    comm = PyNcclCommunicator(pg, device="cpu")
    print(f"trainer joined at {time.time()}", flush=True)
    for step in range(2):
        weights = torch.full((4,), float(step + 1))
        send(("update_named_param", (f"w{step}", str(weights.dtype), (4,))))
        mark(f"trainer sends w{step}")
        if not (case == "skip-broadcast" and step == 1):
            comm.broadcast(weights, src=workers)  # BROADCAST
        if case == "barrier-timeout" and step == 1:
            time.sleep(600)  # BUSY: never reaches the barrier
        comm.group.barrier()  # BARRIER


def main() -> int:
    case, how, workers, group_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if how == "trl-trainer":  # the trainer alone: the server is another command; its steps take seconds
        trl_client(case, int(sys.argv[5]), group_port, step=STEP)
        print("synced", flush=True)
        return 0
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(workers)]
    procs = [ctx.Process(target=worker, args=(r, case, workers, pipes[r][1])) for r in range(workers)]
    for p in procs:
        p.start()
    connections = [pipe[0] for pipe in pipes]
    print(f"trainer waits from {time.time()}", flush=True)
    if how in ("trl", "trl-server"):
        closed = threading.Event()
        server = serve(connections, workers, int(sys.argv[5]), closed)
        if how == "trl":
            trl_client(case, int(sys.argv[5]), group_port)
        else:  # the server alone (``trl vllm-serve``'s part): until the client closed the group
            closed.wait(300)
        server.shutdown()
    else:
        plain_trainer(case, connections, workers, group_port)
    for connection in connections:
        connection.send(("exit", ()))
    for p in procs:
        p.join(60)
    print("synced", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
