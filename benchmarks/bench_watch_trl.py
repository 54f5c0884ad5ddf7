"""Step time of a real training job with and without ``pytest-nccl watch``: TRL's own SFT script
(``python -m trl.scripts.sft``) under ``torchrun``, world 2 on CPU (gloo), a tiny model saved from
``pytest_nccl.testing.tiny_causal_lm`` and a local JSON-lines dataset, ``--max_steps N``.

Runs alternate A B A B ... (A: the launch command alone; B: the same under ``pytest-nccl watch``),
one fresh job each. The step time of a run is TRL's own ``train_runtime`` divided by the steps
(the training loop only: start-up and the model's save are outside it). Reports the median of each
side, the overhead of B over A, and each pair's ratio; and the whole job's CPU time (from wait4: the
launcher, its ranks, and the watch) with the CPU the watch adds per step, a measure that other load
on the machine disturbs less than wall time.

Run: python benchmarks/bench_watch_trl.py [--pairs 4] [--steps 200] [--json FILE]
No assertion: a benchmark reports, it does not gate (target: within 2 %).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from pytest_nccl.testing import HF_OFFLINE_ENV

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = ("import sys; from pytest_nccl.testing import write_sft_inputs; "
            "write_sft_inputs(sys.argv[1], [3 + i % 16 for i in range(64)])")
RUNTIME = re.compile(r"""['"]train_runtime['"]: '?([0-9.]+)""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTEST_NCCL_WATCH_DIR")}
    env.update(HF_OFFLINE_ENV, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p))
    return env


def make_fixtures(directory: str, python: str) -> None:
    subprocess.run([python, "-c", FIXTURES, directory], env=environment(), check=True, capture_output=True)


def sft_command(directory: str, python: str, steps: int) -> list:
    return [python, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", "-m", "trl.scripts.sft",
            "--model_name_or_path", os.path.join(directory, "model"),
            "--dataset_name", os.path.join(directory, "data"), "--packing", "False", "--use_cpu",
            "--per_device_train_batch_size", "2", "--max_steps", str(steps), "--logging_steps", str(steps),
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "True",
            "--output_dir", os.path.join(directory, "out")]


def watched(command: list, python: str) -> list:
    return [python, "-m", "pytest_nccl", "watch", "--quiet", "--timeout", "120", "--", *command]


def step_time(output: str, steps: int) -> float:
    found = RUNTIME.findall(output)
    if not found:
        raise RuntimeError(f"no train_runtime in the job's output:\n{output[-3000:]}")
    return float(found[-1]) / steps


def run_once(command: list, steps: int, timeout: float) -> tuple[float, float, float]:
    """(seconds per step, whole-job wall seconds, whole-job CPU seconds: the launcher, its ranks and,
    under the watch, the watch, from wait4)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, env=environment(), stdout=out, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"no end within {timeout} s")
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"exit {code}:\n{text[-3000:]}")
    return step_time(text, steps), wall, usage.ru_utime + usage.ru_stime


def order(pairs: int) -> list:
    return ["A", "B"] * pairs


def summary(a: list, b: list) -> dict:
    med_a, med_b = statistics.median(a), statistics.median(b)
    return {"runs": len(a), "step_ms_without": round(med_a * 1e3, 3), "step_ms_with": round(med_b * 1e3, 3),
            "overhead_pct": round((med_b / med_a - 1) * 100, 2),
            "pair_ratios": [round(y / x, 4) for x, y in zip(a, b, strict=True)]}


def main(argv: list | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--python", default=sys.executable, help="the job's interpreter (a TRL environment)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-watch-trl-") as directory:
        make_fixtures(directory, args.python)
        command = sft_command(directory, args.python, args.steps)
        run_once(command, args.steps, args.timeout)  # warm-up: page cache, datasets' cache
        steps = {"A": [], "B": []}
        walls = {"A": [], "B": []}
        cpus = {"A": [], "B": []}
        for side in order(args.pairs):
            per_step, wall, cpu = run_once(command if side == "A" else watched(command, sys.executable),
                                           args.steps, args.timeout)
            steps[side].append(per_step)
            walls[side].append(wall)
            cpus[side].append(cpu)
            print(f"{side} ({'under the watch' if side == 'B' else 'alone':15s}): {per_step * 1e3:8.3f} ms/step, "
                  f"job {wall:6.1f} s wall, {cpu:6.1f} s CPU (load {os.getloadavg()[0]:.1f})", flush=True)
    result = summary(steps["A"], steps["B"])
    result["job_wall_s"] = {"without": round(statistics.median(walls["A"]), 2),
                            "with": round(statistics.median(walls["B"]), 2)}
    result["job_cpu_s"] = {"without": round(statistics.median(cpus["A"]), 2),
                           "with": round(statistics.median(cpus["B"]), 2)}
    # the CPU the watch adds (the watch, the hook, the tracer, the agents), per training step
    result["added_cpu_ms_per_step"] = round(
        statistics.median([b - a for a, b in zip(cpus["A"], cpus["B"], strict=True)]) / args.steps * 1e3, 3)
    result["steps"] = args.steps
    print(f"step time: {result['step_ms_without']:.3f} ms alone, {result['step_ms_with']:.3f} ms under the watch: "
          f"{result['overhead_pct']:+.2f} % (median of {result['runs']} runs each, A B A B; pair ratios "
          f"{result['pair_ratios']}); CPU added per step (median of pairs, whole job): "
          f"{result['added_cpu_ms_per_step']:+.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
