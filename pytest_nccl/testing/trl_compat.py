"""The one place that knows how TRL's API moved between releases (0.14 .. 1.x).

Differences handled:
- import paths: ``CPOTrainer``/``ORPOTrainer`` live in ``trl`` up to 0.x and in
  ``trl.experimental.cpo`` / ``trl.experimental.orpo`` in 1.x;
- config field renames: SFT's ``max_seq_length`` (<= 0.19) vs ``max_length``; transformers 5's
  ``activation_checkpointing`` for ``gradient_checkpointing``;
  fields some releases dropped (CPO/ORPO ``max_prompt_length`` in 1.x);
- ``processing_class=`` vs the older ``tokenizer=`` trainer argument.

Importing this module sets the offline Hugging Face environment (``setdefault``)
before TRL is imported; TRL itself is imported on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from typing import Any

from . import hf_offline_env
from .releases import library_setup

hf_offline_env()
# trl.experimental (CPO/ORPO in 1.x) warns on import; the suites use it on purpose.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# name -> candidate (module, trainer class, config class), newest first.
_LOCATIONS = {
    "sft": [("trl", "SFTTrainer", "SFTConfig")],
    "cpo": [("trl.experimental.cpo", "CPOTrainer", "CPOConfig"), ("trl", "CPOTrainer", "CPOConfig")],
    "orpo": [("trl.experimental.orpo", "ORPOTrainer", "ORPOConfig"), ("trl", "ORPOTrainer", "ORPOConfig")],
    "grpo": [("trl", "GRPOTrainer", "GRPOConfig")],
    "dpo": [("trl", "DPOTrainer", "DPOConfig")],
    "kto": [("trl", "KTOTrainer", "KTOConfig"), ("trl.experimental.kto", "KTOTrainer", "KTOConfig")],
    "reward": [("trl", "RewardTrainer", "RewardConfig")],
    "rloo": [("trl", "RLOOTrainer", "RLOOConfig")],
    "gkd": [("trl.experimental.gkd", "GKDTrainer", "GKDConfig"), ("trl", "GKDTrainer", "GKDConfig")],
    "online_dpo": [("trl.experimental.online_dpo", "OnlineDPOTrainer", "OnlineDPOConfig"),
                   ("trl", "OnlineDPOTrainer", "OnlineDPOConfig")],
    "distillation": [("trl", "DistillationTrainer", "DistillationConfig"),
                     ("trl.experimental.distillation", "DistillationTrainer", "DistillationConfig")],
}
NAMES = tuple(_LOCATIONS)

# Same meaning, other spelling: first one the config class has wins.
_ALIASES = {
    "max_length": ("max_length", "max_seq_length"),
    # transformers 5 renamed it; the old name still exists there, deprecated (FutureWarning)
    "gradient_checkpointing": ("activation_checkpointing", "gradient_checkpointing"),
}
# Fields that a release may not have at all: dropped when absent.
_OPTIONAL = {"max_prompt_length", "dataset_num_proc", "use_liger_kernel", "use_liger"}

# What every trainer in a test gets: no saving, no logging, no workers; and the device of the rank
# (``use_cpu`` from ``on_cpu()`` when not given).
QUIET_ARGS = dict(
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    disable_tqdm=True,
    dataloader_num_workers=0,
    dataloader_pin_memory=False,
    ddp_find_unused_parameters=False,
    bf16=False,
    fp16=False,
    seed=0,
    learning_rate=1e-3,
    gradient_checkpointing=False,  # newer TRL configs default to True; pointless on tiny models
)


def classes(name: str):
    """(TrainerClass, ConfigClass) for ``name`` (one of ``NAMES``); ImportError when this TRL has none."""
    errors = []
    for module, trainer, config in _LOCATIONS[name]:
        try:
            mod = importlib.import_module(module)
            return getattr(mod, trainer), getattr(mod, config)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}.{trainer}: {exc!r}")
    raise ImportError(f"no {name} trainer in this TRL: " + "; ".join(errors))


def has(name: str) -> bool:
    """Whether the installed TRL has trainer ``name``."""
    try:
        classes(name)
    except ImportError:
        return False
    return True


def config_fields(name: str) -> set[str]:
    """The field names of trainer ``name``'s config class."""
    return {f.name for f in dataclasses.fields(classes(name)[1])}


def trainer_params(name: str) -> set[str]:
    """The parameter names of trainer ``name``'s constructor: the first ``__init__`` in its MRO that
    names its parameters (TRL's deprecation shims, e.g. ``trl.KTOTrainer`` in 0.2x, take
    ``*args, **kwargs`` and pass them on to the real trainer in ``trl.experimental``)."""
    passing_on = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for klass in classes(name)[0].__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        if sum(p.kind not in passing_on for p in params.values()) > 1:  # more than self
            return set(params)
    return set()


def preload(*names: str, model_kinds=("llama", "qwen2"), missing_ok: bool = False) -> dict:
    """Import now what the first trainer would import lazily (TRL and transformers load trainer
    and model modules on first use, several seconds): the trainer/config classes of ``names``,
    transformers' Trainer, accelerate, datasets and the ``model_kinds`` modeling code.  Call it
    at a test module's top level: the plugin preloads test modules in its fork server, so every
    rank starts with these paid for.  Returns {name: (TrainerClass, ConfigClass)}; with
    ``missing_ok`` the trainers this TRL lacks are left out instead of raising ImportError."""
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import transformers.trainer  # noqa: F401

    from .models import _config_class

    for kind in model_kinds:
        _config_class(kind)
        importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    if missing_ok:
        return {name: classes(name) for name in names if has(name)}
    return {name: classes(name) for name in names}


def on_cpu() -> bool:
    """Whether a trainer on this rank runs on the CPU: yes unless the group's backend is NCCL. The
    plugin gives every NCCL rank a GPU of its own and makes ``cuda:LOCAL_RANK`` current; a trainer
    with ``use_cpu=True`` there would hand CPU tensors to NCCL collectives. Under gloo the device is
    the CPU (the plugin's ``device`` fixture says so too), CUDA hidden or not. Outside a group:
    whether CUDA is available."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_backend() != "nccl"
    return not torch.cuda.is_available()


def make_config(name: str, output_dir, **kwargs):
    """Config for trainer ``name`` with ``QUIET_ARGS`` (and ``use_cpu=on_cpu()``) under ``kwargs``,
    field names translated to what the installed TRL calls them."""
    _, config_cls = classes(name)
    fields = config_fields(name)
    args = dict(QUIET_ARGS, use_cpu=on_cpu())
    args.update(kwargs)
    out: dict[str, Any] = {"output_dir": str(output_dir)}
    for key, value in args.items():
        alias = next((a for a in _ALIASES.get(key, ()) if a in fields), None)
        if alias is not None:
            key = alias
        elif key not in fields and key in _OPTIONAL:
            continue
        out[key] = value
    with library_setup(config_cls.__name__, "trl", "transformers", "accelerate"):
        return config_cls(**out)


def make_trainer(name: str, *, model, args, tokenizer, train_dataset, **kwargs):
    """Build trainer ``name``, passing ``tokenizer`` as ``processing_class`` or ``tokenizer``."""
    trainer_cls, _ = classes(name)
    key = "processing_class" if "processing_class" in trainer_params(name) else "tokenizer"
    kwargs[key] = tokenizer
    packages = ("trl", "transformers", "accelerate", "datasets") + (("deepspeed",) if getattr(args, "deepspeed", None)
                                                                     else ())
    with library_setup(trainer_cls.__name__, *packages):
        return trainer_cls(model=model, args=args, train_dataset=train_dataset, **kwargs)


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide singletons (the process group stays up)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def train(name: str, *, model, tokenizer, train_dataset, output_dir, trainer_kwargs=None, **config):
    """Reset accelerate state, build config and trainer ``name``, run ``trainer.train()``,
    reset again; returns the trainer."""
    reset_accelerate_state()
    try:
        args = make_config(name, output_dir, **config)
        trainer = make_trainer(
            name, model=model, args=args, tokenizer=tokenizer, train_dataset=train_dataset, **(trainer_kwargs or {})
        )
        trainer.train()
        return trainer
    finally:
        reset_accelerate_state()
