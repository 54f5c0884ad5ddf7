"""OnlineDPOTrainer on more than one rank.

huggingface/trl#3063: ``OnlineDPOTrainer._generate`` read ``model.config`` on the model the
Trainer hands to ``training_step``, which on more than one rank is the DistributedDataParallel
wrapper: every multi-rank run died at its first step with ``AttributeError:
'DistributedDataParallel' object has no attribute 'config'`` (a crash on every rank, not a hang;
one rank works). Found by the matrix (suites/trl/MATRIX.md, every online_dpo row red on 0.14.0 to
0.16.1); bisected with ``python -m pytest_nccl bisect trl --good 0.13.0 --bad 0.16.1 --
suites/trl/matrix -k online_dpo-baseline --nccl-world=2``: first bad 0.14.0. Good: 0.13.0 and
earlier, 0.17.0 and later.
"""

import pytest

from pytest_nccl.testing import trl_compat as compat  # first: offline HF environment

# isort: split
from datasets import Dataset

from pytest_nccl.testing import data, tiny_causal_lm, tiny_tokenizer
from pytest_nccl.testing.trl_matrix import reward_kwargs

# Trainer modules load lazily (seconds): pay that once, in the plugin's fork server.
compat.preload("online_dpo", missing_ok=True)


@pytest.mark.nccl
def test_online_dpo_generates_on_every_rank(tmp_path):
    """Regression for trl#3063: one step of online DPO, equal data on every rank. Fails
    (AttributeError on every rank, at the first generation) on trl 0.14.0 .. 0.16.1."""
    if not compat.has("online_dpo"):
        pytest.skip("this TRL has no OnlineDPOTrainer")
    tok = tiny_tokenizer(padding_side="left")
    # reward functions where it takes them, else (the releases of the bug) a tiny reward model
    judge = reward_kwargs("online_dpo", tok)
    trainer = compat.train(
        "online_dpo",
        model=tiny_causal_lm("llama", tokenizer=tok),
        tokenizer=tok,
        train_dataset=Dataset.from_dict(data.prompt_rows(0, ragged=False, rows=4, extra=0)),
        output_dir=tmp_path,
        trainer_kwargs=judge,
        max_steps=1,
        per_device_train_batch_size=2,
        max_new_tokens=2,
    )
    assert trainer.state.global_step == 1
