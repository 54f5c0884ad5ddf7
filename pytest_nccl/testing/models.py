"""Tiny causal language models built from configs: random weights, no downloads.

``transformers`` and ``torch`` are imported inside the functions, so importing this
module costs nothing.
"""

from __future__ import annotations

from typing import Any

from .releases import library_setup

# Small enough that a TRL step on 2 CPU ranks takes milliseconds.
_BASE = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)

KINDS = ("llama", "qwen2")
# per kind: Qwen2 has a 4096-token sliding window by default, which older transformers warn
# about for every non-flash attention; these models never see such lengths.
_KIND_FIELDS = {"qwen2": dict(sliding_window=None, use_sliding_window=False)}


def _config_class(kind: str):
    if kind == "llama":
        from transformers import LlamaConfig

        return LlamaConfig
    if kind == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config
    raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")


def tiny_config(kind: str = "llama", tokenizer=None, **overrides: Any):
    """Config of a tiny ``kind`` model whose vocabulary and special ids match ``tokenizer``
    (``tiny_tokenizer()`` when None). ``overrides`` are config fields."""
    if tokenizer is None:
        from .tokenizers import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    fields: dict[str, Any] = dict(_BASE, **_KIND_FIELDS.get(kind, {}))
    fields.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    fields.update(overrides)
    with library_setup(f"a tiny {kind} config", "transformers"):
        return _config_class(kind)(**fields)


def tiny_causal_lm(kind: str = "llama", *, tokenizer=None, seed: int = 0, dtype=None, **overrides: Any):
    """A ``kind`` ("llama" or "qwen2") causal LM with seeded random weights.

    Same ``seed`` and arguments give identical weights on every rank (what DDP
    expects).  Defaults: hidden 16, 1 layer, 2 heads (1 KV head), vocab = ``len(tokenizer)``;
    ``overrides`` change any config field (e.g. ``num_hidden_layers=2``).  The model is in
    float32 (or ``dtype``), on CPU, in train mode, with ``generation_config`` pad/eos/bos
    set from the tokenizer.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(kind, tokenizer, **overrides)
    model = _seeded(AutoModelForCausalLM, config, seed).to(dtype or torch.float32)
    gc = model.generation_config
    gc.pad_token_id = config.pad_token_id
    gc.eos_token_id = config.eos_token_id
    gc.bos_token_id = config.bos_token_id
    model.train()
    return model


def tiny_reward_model(kind: str = "llama", *, tokenizer=None, seed: int = 0, **overrides: Any):
    """A ``kind`` sequence classifier with one label (a reward model), seeded like
    ``tiny_causal_lm``: what TRL's RewardTrainer trains."""
    from transformers import AutoModelForSequenceClassification

    model = _seeded(AutoModelForSequenceClassification, tiny_config(kind, tokenizer, num_labels=1, **overrides),
                    seed)
    model.train()
    return model


def _seeded(auto_class, config, seed: int):
    """``auto_class.from_config(config)`` (eager attention) with weights from ``seed``; the RNG is
    forked so the caller's global torch RNG state is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]), library_setup(f"{auto_class.__name__}.from_config", "transformers"):
        torch.manual_seed(seed)
        return auto_class.from_config(config, attn_implementation="eager")
