"""GRPO with top-entropy masking when one rank's completion mask is empty.

huggingface/trl#4041: ``get_high_entropy_mask`` returned early when the rank's mask had no
tokens, skipping the ``accelerator.gather`` its peers entered.  A rank's mask is empty when
``mask_truncated_completions=True`` and every one of its completions ran to
``max_completion_length`` without EOS.  Bad: 0.21.0 to 0.23.0 (checked in the
wheels); good: 0.23.1 and later, which pads across processes instead of returning early.

The data decides which rank's completions end: here the last rank may not produce EOS
(``suppress_tokens``) and every other rank's generation is forced to end in EOS
(``forced_eos_token_id``), so exactly one rank, the last, has an empty mask on every step whatever
the random tiny model samples. Any world size (rank 1 at world 2, as in the stack runs).
"""

import pytest

from pytest_nccl.testing import trl_compat as compat  # first: offline HF environment

# isort: split
from datasets import Dataset

from pytest_nccl.testing import data, tiny_causal_lm, tiny_tokenizer
from pytest_nccl.testing.trl_matrix import reward_len

# Trainer modules load lazily (seconds): pay that once, in the plugin's fork server.
compat.preload("grpo")


def _grpo_has_entropy_mask():
    import dataclasses

    _, config = compat.classes("grpo")
    return "top_entropy_quantile" in {f.name for f in dataclasses.fields(config)}


@pytest.mark.nccl
def test_grpo_entropy_mask_one_rank_empty(rank, world_size, tmp_path):
    """Regression for trl#4041: the last rank has no unmasked completion token; the others have
    some. Fails (CollectiveMismatch: the last rank skips the entropy all_gather) on trl 0.21.0 .. 0.23.0."""
    if not _grpo_has_entropy_mask():
        pytest.skip("this TRL's GRPO has no top_entropy_quantile (added in 0.21)")
    tok = tiny_tokenizer(padding_side="left")
    empty = rank == world_size - 1
    ends = {"suppress_tokens": [tok.eos_token_id]} if empty else {"forced_eos_token_id": tok.eos_token_id}
    trainer = compat.train(
        "grpo",
        model=tiny_causal_lm("llama", tokenizer=tok),
        tokenizer=tok,
        train_dataset=Dataset.from_dict(data.prompt_rows(rank)),
        output_dir=tmp_path,
        trainer_kwargs={"reward_funcs": reward_len},
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_prompt_length=16,
        max_completion_length=4,
        mask_truncated_completions=True,
        top_entropy_quantile=0.2,
        generation_kwargs=ends,
        beta=0.0,
    )
    assert trainer.state.global_step == 1
