"""SFTTrainer on ranks whose batches pad to different lengths.

huggingface/trl#2879: trl 0.15.0 gathered the full shifted logits [B, L-1, V] for its
token-accuracy metric, L being each rank's own longest sample, so ranks entered one
all_gather with different shapes (NCCL hangs at step 0; gloo aborts).  Introduced by #2597,
fixed by #2890 (0.15.1).  Good: 0.14.0, 0.15.1 and later.
"""

import pytest

from pytest_nccl.testing import trl_compat as compat  # first: offline HF environment

# isort: split
from datasets import Dataset

from pytest_nccl.testing import data, tiny_causal_lm, tiny_tokenizer

# Trainer modules load lazily (seconds): pay that once, in the plugin's fork server.
compat.preload("sft")

MAX_LEN = 32
STEPS = dict(max_steps=2, per_device_train_batch_size=2)


def _train(tmp_path, rows, **config):
    tok = tiny_tokenizer()
    trainer = compat.train(
        "sft",
        model=tiny_causal_lm("llama", tokenizer=tok),
        tokenizer=tok,
        train_dataset=Dataset.from_dict(rows),
        output_dir=tmp_path,
        max_length=MAX_LEN,
        **STEPS,
        **config,
    )
    assert trainer.state.global_step == STEPS["max_steps"]


@pytest.mark.nccl
@pytest.mark.parametrize("fmt", ["text", "messages"])
def test_sft_unpacked_ragged_lengths(rank, tmp_path, fmt):
    """Regression for trl#2879: packing=False, every rank pads to its own length.
    Fails (CollectiveMismatch in the metric all_gather) on trl 0.15.0."""
    rows = data.text_rows(rank) if fmt == "text" else data.conversation_rows(rank)
    _train(tmp_path, rows, packing=False)


@pytest.mark.nccl
def test_sft_packed_ragged_lengths(rank, tmp_path):
    """Control: packing=True makes every batch MAX_LEN long on every rank; passes on 0.15.0 too.
    0.15's packing cuts each rank's token stream into MAX_LEN blocks plus one shorter remainder;
    these rows give an even block count on each rank up to world 4 (rank 0: 49 tokens = 32 + 17,
    rank 1: 181 = 5 * 32 + 21, rank 2: 378 = 11 * 32 + 26, rank 3: 637 = 19 * 32 + 29), so every
    batch of 2 holds at least one full block and pads to MAX_LEN. (Rank 4's 961 = 30 * 32 + 1 would
    not: at world 5+ this is a control on releases without the bug only.)"""
    rows = data.text_rows(rank, rows=10, extra=4)
    _train(tmp_path, rows, packing=True)


@pytest.mark.nccl
def test_sft_unpacked_equal_lengths(rank, tmp_path):
    """Control: the same length on every rank; passes on every release, 0.15.0 included."""
    _train(tmp_path, data.text_rows(rank, ragged=False), packing=False)

