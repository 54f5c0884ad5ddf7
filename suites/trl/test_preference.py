"""CPO, SimPO (CPO with loss_type="simpo") and ORPO on ranks whose batches pad to
different lengths.

huggingface/trl#3068: ``get_batch_loss_metrics`` gathered ``policy_chosen_logits`` /
``policy_rejected_logits`` of shape [B, L, V], L being each rank's own padded length, so the
ranks entered one all_gather with different shapes (NCCL hangs; gloo aborts).  Introduced by
#2474, fixed by #3069.  Bad: 0.14.0 through 0.16.1; good: 0.17.0 and later.
"""

import pytest

from pytest_nccl.testing import trl_compat as compat  # first: offline HF environment

# isort: split
from datasets import Dataset

from pytest_nccl.testing import data, tiny_causal_lm, tiny_tokenizer

# Trainer modules load lazily (seconds): pay that once, in the plugin's fork server.
compat.preload("cpo", "orpo")

# name -> (trainer, config fields)
TRAINERS = {
    "cpo": ("cpo", {}),
    "simpo": ("cpo", {"loss_type": "simpo", "cpo_alpha": 0.0}),
    "orpo": ("orpo", {}),
}
STEPS = dict(max_steps=2, per_device_train_batch_size=2)


def _train(tmp_path, which, rows):
    name, config = TRAINERS[which]
    tok = tiny_tokenizer()
    trainer = compat.train(
        name,
        model=tiny_causal_lm("qwen2", tokenizer=tok),
        tokenizer=tok,
        train_dataset=Dataset.from_dict(rows),
        output_dir=tmp_path,
        max_length=32,
        max_prompt_length=8,
        remove_unused_columns=False,  # what these trainers set themselves, with a warning
        **STEPS,
        **config,
    )
    assert trainer.state.global_step == STEPS["max_steps"]


@pytest.mark.nccl
@pytest.mark.parametrize("which", list(TRAINERS))
def test_preference_ragged_lengths(rank, tmp_path, which):
    """Regression for trl#3068: every rank pads chosen/rejected to its own length.
    Fails (CollectiveMismatch in the logits all_gather) on trl 0.14.0 .. 0.16.1."""
    _train(tmp_path, which, data.preference_rows(rank))


@pytest.mark.nccl
@pytest.mark.parametrize("which", list(TRAINERS))
def test_preference_equal_lengths(rank, tmp_path, which):
    """Control: the same lengths on every rank; passes on every release."""
    _train(tmp_path, which, data.preference_rows(rank, ragged=False))
