"""Scenario 4 (smoke): a real TRL trainer (SFT) under DeepSpeed ZeRO-2 and ZeRO-3 configs trains a
few steps on 2 CPU ranks, through transformers' Trainer -> accelerate -> deepspeed.initialize on the
plugin's process group.

On a machine without GPUs the trainer needs ``use_cpu=True`` (``ddp_backend="gloo"``): with
``use_cpu=False`` transformers' DeepSpeed path builds accelerate's state with no backend, counts 1
process, and DeepSpeed's batch check fails ("train_batch_size is not equal to micro_batch_per_gpu *
gradient_acc_step * world_size 2 != 2 * 1 * 2"). With it, accelerate still switches to
DistributedType.DEEPSPEED and ZeRO-3 really partitions (parameters have ds_shape and numel 0), unless
ACCELERATE_USE_CPU is set, which turns DeepSpeed off: the test unsets the plugin's.
"""

from __future__ import annotations

import importlib.util
import math
import os
from unittest import mock

import pytest
import torch.distributed as dist

HAVE_TRL = importlib.util.find_spec("trl") is not None
if HAVE_TRL:
    import datasets  # noqa: F401  (imported here so the fork server preloads them for every rank)
    import trl  # noqa: F401

# trl_compat first: its environment (offline Hub, TRL's silence) before zero_helpers imports transformers
from pytest_nccl.testing import trl_compat  # noqa: E402

# isort: split
from zero_helpers import clean_state, reset_hf_state, tiny_causal_lm, tiny_tokenizer  # noqa: E402

STEPS = 3


def hf_ds_config(stage: int) -> dict:
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # tiny model: partition everything
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def train_sft(stage: int, output_dir: str) -> dict:
    tok = tiny_tokenizer()
    model = tiny_causal_lm("llama", tokenizer=tok)
    dataset = datasets.Dataset.from_dict({"text": [f"sample number {i} says hello" for i in range(16)]})
    with clean_state() as stack:
        # accelerate takes DeepSpeed off under ACCELERATE_USE_CPU, which the plugin's CPU ranks get as
        # under accelerate's debug_launcher (docs/support.md): this test asks for DeepSpeed by name
        stack.enter_context(mock.patch.dict(os.environ))
        os.environ.pop("ACCELERATE_USE_CPU", None)
        reset_hf_state()
        args = trl_compat.make_config(
            "sft", output_dir, max_steps=STEPS, per_device_train_batch_size=2, max_length=32,
            deepspeed=hf_ds_config(stage), ddp_backend="gloo", use_cpu=True)
        trainer = trl_compat.make_trainer("sft", model=model, args=args, tokenizer=tok, train_dataset=dataset)
        out = trainer.train()
        engine = trainer.model_wrapped
        stack.callback(lambda: getattr(engine, "destroy", lambda: None)())
        params = list(engine.module.parameters())
        partitioned = all(hasattr(p, "ds_shape") and p.numel() == 0 for p in params)
        return {
            "distributed_type": str(trainer.accelerator.distributed_type),
            "world": dist.get_world_size(),
            "global_step": out.global_step,
            "loss": out.training_loss,
            "engine": type(engine).__name__,
            "zero_stage": engine.zero_optimization_stage(),
            "partitioned": partitioned,
        }


@pytest.mark.skipif(not HAVE_TRL, reason="trl is not installed (pip install 'pytest-nccl[trl]')")
@pytest.mark.nccl(timeout=90)
@pytest.mark.parametrize("stage", [2, 3])
def test_trl_sft_under_zero(stage, deepspeed_ops, tmp_path):
    info = train_sft(stage, str(tmp_path / f"rank{dist.get_rank()}"))
    assert info["distributed_type"].endswith("DEEPSPEED"), info
    assert info["engine"] == "DeepSpeedEngine" and info["zero_stage"] == stage, info
    assert info["global_step"] == STEPS and math.isfinite(info["loss"]), info
    assert info["partitioned"] == (stage == 3), info
