"""TRL's own SFT script (``python -m trl.scripts.sft``) under ``torchrun`` under ``pytest-nccl
watch``: a tiny model saved from ``pytest_nccl.testing.tiny_causal_lm``, a local JSON-lines dataset
of ragged rows, ``--packing False --use_cpu``, world 2.

- the documented bad release (trl 0.15.0 + transformers 4.49.0 + accelerate 1.4.0 + datasets 3.3.2,
  trl#2879): its token-accuracy metric all_gathers the logits padded to each rank's own length; gloo
  aborts on the size mismatch. The verdict names the all_gather, the per-rank shapes and TRL's line,
  exit 3. Its environment is the stack that ``.ci/trl_stacks.sh trl-0.15.0`` builds (cached under
  ~/.cache/pytest-nccl/stacks); without it the test skips and says so.
- a good release (this environment's trl): the job ends untouched, with the launcher's status.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from watch_support import (
    FIXTURES,
    HF_OFFLINE,
    REPO,
    inherited_pythonpath,
    run_watch,
    torchrun,
    untouched,
    verdict_ok,
)

TIMEOUT = 60.0
BAD_STACK = "trl-0.15.0"
BAD_PINS = "trl==0.15.0 transformers==4.49.0 accelerate==1.4.0 datasets==3.3.2"
GATHER = "shift_logits = self.accelerator.gather_for_metrics(shift_logits)"  # trl 0.15.0's sft_trainer.py



def stack_python(name: str) -> Path | None:
    venv = Path(os.environ.get("PYTEST_NCCL_CACHE", Path.home() / ".cache" / "pytest-nccl")) / "stacks" / name
    stamp = venv / ".stack-stamp"
    python = venv / "bin" / "python"
    if python.exists() and stamp.exists() and BAD_PINS in stamp.read_text():
        return python
    return None


def fixtures(tmp_path: Path, python: str) -> tuple[Path, Path]:
    """The model and the dataset, written by the release that will read them."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *inherited_pythonpath(python)]), **HF_OFFLINE)
    proc = subprocess.run([python, "-c", FIXTURES, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "model", tmp_path / "data"


def sft(tmp_path: Path, python: str, *extra: str) -> list:
    model, data = fixtures(tmp_path, python)
    return torchrun("-m", "trl.scripts.sft", "--model_name_or_path", str(model), "--dataset_name", str(data),
                    "--packing", "False", "--use_cpu", "--per_device_train_batch_size", "1", "--max_steps", "2",
                    "--output_dir", str(tmp_path / "out"), "--report_to", "none", *extra, python=python)


def test_sft_script_on_the_bad_release_is_diagnosed(tmp_path):
    python = stack_python(BAD_STACK)
    if python is None:
        pytest.skip(f"the {BAD_STACK} stack ({BAD_PINS}) is not built: `.ci/trl_stacks.sh {BAD_STACK}` builds "
                    "it under ~/.cache/pytest-nccl/stacks")
    trainer = next(python.parent.parent.glob("lib/python*/site-packages/trl/trainer/sft_trainer.py"))
    line = next(i for i, text in enumerate(trainer.read_text().splitlines(), 1) if GATHER in text)
    run = run_watch(tmp_path, sft(tmp_path, str(python)), "--timeout", f"{TIMEOUT:g}", timeout=300,
                    inherit_pythonpath=False, **HF_OFFLINE)
    verdict_ok(run, TIMEOUT)
    headline = run.summary["headline"]
    found = re.match(r"shape mismatch in all_gather #(\d+) of group default: rank 0 \[1, (\d+), (\d+)\], "
                     r"rank 1 \[1, (\d+), (\d+)\] \(from trl/trainer/sft_trainer\.py:(\d+) <- ", headline)
    assert found, headline
    _, len0, vocab0, len1, vocab1, at = found.groups()
    assert len0 != len1 and vocab0 == vocab1 and int(at) == line, headline  # each rank's own padded length
    assert headline in run.stderr and run.summary["kind"] == "shape-mismatch"
    assert run.summary["job_exit_code"] != 0  # the launcher's own status, kept in --json


def test_sft_script_on_a_good_release_runs_untouched(tmp_path):
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed")
    run = run_watch(tmp_path, sft(tmp_path, sys.executable), "--timeout", f"{TIMEOUT:g}", timeout=300,
                    **HF_OFFLINE)
    untouched(run)
    assert (tmp_path / "out" / "config.json").exists(), run.text  # the model was trained and saved
    assert json.loads((tmp_path / "model" / "config.json").read_text())["model_type"] == "llama"
