"""Helpers for writing distributed test suites: tiny tokenizers and models, no downloads.

Importing this package is cheap: ``transformers``/``tokenizers``/``torch`` are imported
only when a helper is called, since every rank may import it.
"""

from __future__ import annotations

import os

from .models import tiny_causal_lm, tiny_config
from .tokenizers import tiny_tokenizer

__all__ = ["tiny_tokenizer", "tiny_causal_lm", "tiny_config", "hf_offline_env", "write_sft_inputs"]

# Environment for running Hugging Face libraries with no network and no noise.
HF_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "WANDB_MODE": "disabled",
    "DISABLE_MLFLOW_INTEGRATION": "TRUE",
}


def hf_offline_env(environ=None) -> dict:
    """Set (setdefault) the offline/quiet Hugging Face variables in ``environ``
    (``os.environ`` when None). Call before ``huggingface_hub`` is imported: it reads
    ``HF_HUB_OFFLINE`` at import time. Returns the variables it set."""
    environ = os.environ if environ is None else environ
    done = {}
    for key, value in HF_OFFLINE_ENV.items():
        if key not in environ:
            environ[key] = value
            done[key] = value
    return done


def write_sft_inputs(directory: str, lengths) -> None:
    """What a real SFT script reads, offline, into ``directory``: a tiny model with its tokenizer
    (``model/``) and a JSON-lines dataset (``data/train.jsonl``), one row of ``"ab " * n`` for each
    n in ``lengths``. Run it with the interpreter of the release that will read them (files saved by
    another transformers may not load)."""
    import json

    hf_offline_env()
    tok = tiny_tokenizer()
    model = os.path.join(directory, "model")
    tiny_causal_lm("llama", tokenizer=tok).save_pretrained(model)
    tok.save_pretrained(model)
    os.makedirs(os.path.join(directory, "data"))
    with open(os.path.join(directory, "data", "train.jsonl"), "w") as f:
        for n in lengths:
            f.write(json.dumps({"text": "ab " * n}) + "\n")
