"""ms-swift's own CLI (``swift rlhf --rlhf_type cpo``, which starts torchrun itself) under
``pytest-nccl watch``: ms-swift 3.3.1 on trl 0.16.1 (trl#3068: CPOTrainer gathers the logits padded to
each rank's own length), a tiny local model and preference rows, world 2 on CPU.

- ragged rows: the verdict names the all_gather, the per-rank shapes and TRL's line through
  ms-swift's, exit 3, whether the watch or torchrun ended the job first (gloo aborts on the size
  mismatch within milliseconds: both happen);
- rows of one length: the job ends untouched, with its own status.

Its environment is a venv cached under ~/.cache/pytest-nccl/stacks/ms-swift-3.3.1 (``SWIFT_PINS``,
installed with pip on CPU in about 10 minutes); without it the tests skip and say how to build it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from watch_support import FIXTURES, HF_OFFLINE, REPO, free_port, run_watch, untouched, verdict_ok

TIMEOUT = 60.0
STACK = "ms-swift-3.3.1"
SWIFT_PINS = ("torch==2.13.0 ms-swift==3.3.1 trl==0.16.1 transformers==4.51.0 accelerate==1.6.0 datasets==3.5.0 "
              "peft==0.15.2 pyarrow==17.0.0 numpy==1.26.4")


def swift_venv() -> Path:
    venv = Path(os.environ.get("PYTEST_NCCL_CACHE", Path.home() / ".cache" / "pytest-nccl")) / "stacks" / STACK
    stamp = venv / ".stack-stamp"
    if not ((venv / "bin" / "swift").exists() and stamp.exists() and "ms-swift==3.3.1" in stamp.read_text()):
        pytest.skip(f"no {STACK} environment at {venv}: build it with `python3.11 -m venv {venv} && {venv}/bin/pip "
                    f"install {SWIFT_PINS} && echo '{SWIFT_PINS}' > {venv}/.stack-stamp` (CPU torch)")
    return venv


def rows(ragged: bool) -> list:
    out = []
    for i in range(16):
        k = i if ragged else 4
        out.append({"messages": [{"role": "user", "content": "why " * (1 + 2 * k)},
                                 {"role": "assistant", "content": "yes " * (1 + k % 3)}],
                    "rejected_response": "no " * (2 + k % 4)})
    return out


def swift_job(tmp_path: Path, venv: Path, ragged: bool) -> tuple[list, dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO), **HF_OFFLINE)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", FIXTURES, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows(ragged)))
    launch = [str(venv / "bin" / "swift"), "rlhf", "--rlhf_type", "cpo", "--model", str(tmp_path / "model"),
              "--model_type", "llama", "--template", "llama", "--system", "", "--max_length", "1024",
              "--dataset", str(data), "--split_dataset_ratio", "0", "--train_type", "full", "--max_steps", "2",
              "--per_device_train_batch_size", "2", "--torch_dtype", "float32", "--use_cpu", "true",
              "--ddp_backend", "gloo", "--dataloader_num_workers", "0", "--save_strategy", "no",
              "--report_to", "none", "--output_dir", str(tmp_path / "out")]
    # swift starts torchrun itself when NPROC_PER_NODE is set
    return launch, dict(HF_OFFLINE, USE_HF="1", NPROC_PER_NODE="2", MASTER_PORT=str(free_port()))


def test_swift_cpo_on_trl_0_16_1_is_diagnosed(tmp_path):
    launch, env = swift_job(tmp_path, swift_venv(), ragged=True)
    run = run_watch(tmp_path, launch, "--timeout", f"{TIMEOUT:g}", timeout=300, **env)
    verdict_ok(run, TIMEOUT)
    headline = run.summary["headline"]
    assert headline.startswith("shape mismatch in all_gather #"), headline
    assert ("(from trl/trainer/cpo_trainer.py:839 <- swift/trainers/rlhf_trainer/rlhf_mixin.py:98, via accelerate)"
            in headline), headline
    assert "rank 0 [2, " in headline and "rank 1 [2, " in headline, headline


def test_swift_cpo_with_rows_of_one_length_runs_untouched(tmp_path):
    launch, env = swift_job(tmp_path, swift_venv(), ragged=False)
    run = run_watch(tmp_path, launch, "--timeout", f"{TIMEOUT:g}", timeout=300, **env)
    untouched(run)
