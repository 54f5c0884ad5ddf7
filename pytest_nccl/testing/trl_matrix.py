"""The TRL compatibility matrix: every trainer a TRL release has, under per-rank data stressors.

A cell is (trainer, stressor). ``cells()`` lists them all (what ``suites/trl/matrix`` parametrizes);
``run_cell`` builds the trainer of the installed TRL on a tiny model with the stressor's per-rank
data and trains (and evaluates, for ``eval_uneven``). ``unsupported`` says why a cell cannot run on
the installed TRL (the trainer or the feature is missing): the test skips with that reason, so a
release's column shows what it does not have instead of a failure.

Conventions shared with the rest of ``suites/trl``: batches of 2 per device, sequences under 32
tokens, and where one rank gets odd data it is exactly one, the last, so every stressor means the
same at any world size. Each rank builds its own rows (``data.py``); the sampler then takes the
rank's share of them, so ranks see different data, as they do in a real job. Every rank holds the
same number of rows: the samplers split one dataset across the ranks and assume its length is the
same everywhere (ranks that disagree on the epoch length desync in any trainer, which says nothing
about the trainer); ``uneven_rows`` makes the ranks' shares uneven the way a real dataset does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import data
from . import trl_compat as compat

BATCH = 2

#: stressor -> what differs between the ranks (the matrix's legend)
STRESSORS: dict[str, str] = {
    "baseline": "control: equal lengths and row counts on every rank",
    "ragged": "every rank pads its batches to its own length (rank r's rows lie in their own length band)",
    "uneven_rows": "2 * batch * world + 1 rows: the sampler gives the first rank one row more than the"
                   " others, whose last batch of the epoch is partial; training runs past the epoch end",
    "eval_uneven": "evaluate() on per-rank eval sets of ragged lengths; the last rank's has one row less"
                   " (a partial last batch), so gather_for_metrics drops padding on one rank only",
    "grad_accum": "gradient accumulation 3 over 4 micro-batches an epoch (a remainder of 1), ragged lengths",
    "packing": "packing=True on ragged data",
    "padding_free": "padding_free=True on ragged data",
    "all_masked": "the last rank's completions never end (no EOS) and mask_truncated_completions=True:"
                  " its completion mask is empty; the others' end",
    "all_masked_entropy": "all_masked with top_entropy_quantile=0.2: the entropy mask of a rank with no"
                          " unmasked token (trl#4041's condition)",
    "all_truncated": "the last rank's completions are all truncated (max length, no EOS), the others'"
                     " end after 2 tokens: every rank pads completions to its own length",
    "one_sided_labels": "the last rank holds only undesirable examples, the others both kinds",
}

LM = ("baseline", "ragged", "uneven_rows", "eval_uneven", "grad_accum")
ONLINE = ("baseline", "ragged", "uneven_rows", "grad_accum", "all_truncated")


@dataclass(frozen=True)
class TrainerSpec:
    name: str  # trl_compat name
    rows: str  # data family: text, messages, preference, unpaired, implicit, prompt
    stressors: tuple[str, ...]
    model: str = "llama"
    config: dict = field(default_factory=dict)
    online: bool = False


TRAINERS: tuple[TrainerSpec, ...] = (
    TrainerSpec("sft", "text", LM + ("packing", "padding_free"), config={"max_length": 32, "packing": False}),
    TrainerSpec("dpo", "preference", LM + ("padding_free",),
                config={"max_length": 32, "max_prompt_length": 8, "remove_unused_columns": False}),
    TrainerSpec("kto", "unpaired", LM + ("one_sided_labels",),
                config={"max_length": 32, "max_prompt_length": 8, "remove_unused_columns": False}),
    # max_length 64: RewardTrainer drops (not truncates) longer rows, and a rank that dropped rows
    # would have a shorter epoch than the others (rank 3's band reaches 33 tokens with the prompt)
    TrainerSpec("reward", "implicit", LM, config={"max_length": 64, "remove_unused_columns": False}),
    TrainerSpec("cpo", "preference", LM, model="qwen2",
                config={"max_length": 32, "max_prompt_length": 8, "remove_unused_columns": False}),
    TrainerSpec("orpo", "preference", LM, model="qwen2",
                config={"max_length": 32, "max_prompt_length": 8, "remove_unused_columns": False}),
    TrainerSpec("gkd", "messages", LM, config={"max_length": 32, "max_new_tokens": 4, "lmbda": 1.0}),
    TrainerSpec("grpo", "prompt", ONLINE + ("all_masked", "all_masked_entropy"), online=True),
    TrainerSpec("rloo", "prompt", ONLINE + ("all_masked", "all_masked_entropy"), online=True),
    TrainerSpec("online_dpo", "prompt", ONLINE, online=True, config={"max_new_tokens": 4, "max_length": 32}),
    TrainerSpec("distillation", "conversation_prompt", ONLINE, online=True, config={"max_completion_length": 4}),
)
BY_NAME = {t.name: t for t in TRAINERS}


def cells() -> list[tuple[str, str]]:
    """Every (trainer, stressor) of the matrix, trainers in ``TRAINERS`` order."""
    return [(t.name, s) for t in TRAINERS for s in t.stressors]


def reward_len(completions, **kwargs):
    """Reward function of the online trainers: the completion's length (any number will do)."""
    return [float(len(c)) for c in completions]


def reward_kwargs(trainer: str, tok, model_kind: str = "llama") -> dict:
    """What an online trainer is scored by: ``reward_len`` where it takes reward functions, else
    (releases before them) a tiny reward model with ``tok`` as its processing class; nothing for a
    trainer that takes neither (Distillation, scored by its teacher)."""
    params = compat.trainer_params(trainer)
    if "reward_funcs" in params:
        return {"reward_funcs": reward_len}
    if "reward_model" not in params:
        return {}
    from .models import tiny_reward_model

    out = {"reward_model": tiny_reward_model(model_kind, tokenizer=tok, seed=2)}
    if "reward_processing_class" in params:
        out["reward_processing_class"] = tok
    return out


def unsupported(trainer: str, stressor: str) -> str | None:
    """Why the installed TRL cannot run this cell (a skip reason), or None."""
    spec = BY_NAME[trainer]
    if not compat.has(trainer):
        return f"this TRL has no {trainer} trainer"
    fields = compat.config_fields(trainer)
    params = compat.trainer_params(trainer)
    if spec.online and not ({"reward_funcs", "reward_model", "teacher_model"} & params):
        return f"this TRL's {trainer} trainer takes no reward functions (older API)"
    if trainer == "rloo" and "reward_funcs" not in params:
        return "this TRL's RLOO is the PPO-style trainer (policy, reference and reward models), not in the matrix"
    if stressor in ("packing", "padding_free") and stressor not in fields:
        return f"this TRL's {trainer} config has no {stressor}"
    if stressor.startswith("all_masked") and "mask_truncated_completions" not in fields:
        return f"this TRL's {trainer} config has no mask_truncated_completions"
    if stressor == "all_masked_entropy" and "top_entropy_quantile" not in fields:
        return f"this TRL's {trainer} config has no top_entropy_quantile"
    return None


def _rows(spec: TrainerSpec, rank: int, **kw) -> dict:
    fn = {"text": data.text_rows, "messages": data.conversation_rows, "preference": data.preference_rows,
          "implicit": data.implicit_preference_rows, "unpaired": data.unpaired_rows,
          "prompt": data.prompt_rows, "conversation_prompt": data.conversation_prompt_rows}[spec.rows]
    return fn(rank, **kw)


def rows_for(spec: TrainerSpec, stressor: str, rank: int, world: int) -> dict:
    """The training rows of ``rank`` for this cell."""
    last = rank == world - 1
    if stressor in ("baseline", "eval_uneven"):
        kw = dict(ragged=False, rows=8, extra=0)
    elif stressor == "uneven_rows":
        # The samplers split one dataset across the ranks (they assume the same row count on every
        # rank: per-rank counts that differ would make the ranks disagree on the epoch length,
        # which no trainer supports); the remainder row is what makes the ranks' shares uneven.
        kw = dict(ragged=False, rows=2 * BATCH * world + 1, extra=0)
    elif stressor == "grad_accum":
        kw = dict(ragged=True, rows=4 * BATCH * world, extra=0)  # this rank's share: 4 micro-batches
    else:  # ragged, and the stressors that run on ragged data
        kw = dict(ragged=True, rows=8, extra=0)
    if spec.rows == "unpaired" and stressor == "one_sided_labels" and last:
        kw["desirable"] = False
    return _rows(spec, rank, **kw)


def eval_rows_for(spec: TrainerSpec, rank: int, world: int) -> dict:
    """``eval_uneven``'s eval rows: ragged, ``BATCH * world`` of them, one less on the last rank."""
    return _rows(spec, rank, ragged=True, rows=BATCH * world - (1 if rank == world - 1 else 0), extra=0)


def _steps(stressor: str) -> dict:
    if stressor == "uneven_rows":
        return dict(max_steps=4)
    if stressor == "grad_accum":
        return dict(max_steps=2, gradient_accumulation_steps=3)
    return dict(max_steps=2)


def _online_config(spec: TrainerSpec, stressor: str, rank: int, world: int, tok, fields: set[str]) -> dict:
    """Generation settings: completions of at most 4 tokens that end in EOS on every rank, except
    the last rank's under the completion stressors, which never end."""
    last = rank == world - 1
    never_ends = last and stressor in ("all_masked", "all_masked_entropy", "all_truncated")
    ends: dict[str, Any] = ({"suppress_tokens": [tok.eos_token_id]} if never_ends
                            else {"forced_eos_token_id": tok.eos_token_id})
    if stressor == "all_truncated" and not last:
        ends["max_new_tokens"] = 2
    config = {"max_prompt_length": 16, "max_completion_length": 4, "num_generations": 2, "beta": 0.0,
              "generation_kwargs": ends}
    if stressor.startswith("all_masked"):
        config["mask_truncated_completions"] = True
    if stressor == "all_masked_entropy":
        config["top_entropy_quantile"] = 0.2
    config.update(spec.config)
    return {k: v for k, v in config.items() if k in fields or k in ("max_prompt_length",)}


def run_cell(trainer: str, stressor: str, *, rank: int, world: int, output_dir):
    """Train (and for ``eval_uneven`` evaluate) cell (trainer, stressor) on this rank; returns the
    trainer. Raises AssertionError when training ran a different number of steps."""
    from datasets import Dataset

    from .models import tiny_causal_lm, tiny_reward_model
    from .tokenizers import tiny_tokenizer

    spec = BY_NAME[trainer]
    tok = tiny_tokenizer(padding_side="left" if spec.online else "right")
    fields = compat.config_fields(trainer)
    params = compat.trainer_params(trainer)
    # Metrics logged every step, as a real job logs them: TRL gathers its metrics across the
    # ranks in log(), which a run without logging never reaches before its end
    config = dict(per_device_train_batch_size=BATCH, logging_strategy="steps", logging_steps=1,
                  **_steps(stressor))
    kwargs: dict = {}
    if spec.online:
        config.update(_online_config(spec, stressor, rank, world, tok, fields))
    else:
        config.update(spec.config)
    if stressor in ("packing", "padding_free"):
        config[stressor] = True
    if stressor == "padding_free" and trainer == "sft":
        config["max_length"] = None  # SFT refuses to truncate without packing; rows are short anyway
    if stressor == "eval_uneven":
        config["per_device_eval_batch_size"] = BATCH
        kwargs["eval_dataset"] = Dataset.from_dict(eval_rows_for(spec, rank, world))
    if trainer == "reward":
        model = tiny_reward_model(spec.model, tokenizer=tok)
    else:
        model = tiny_causal_lm(spec.model, tokenizer=tok)
    if trainer in ("dpo", "kto") and "ref_model" in params:
        # they would load the reference by the model's name; a tiny model has none
        kwargs["ref_model"] = tiny_causal_lm(spec.model, tokenizer=tok)
    if "teacher_model" in params:
        teacher = tiny_causal_lm(spec.model, tokenizer=tok, seed=1)
        if trainer == "distillation":
            # DistillationTrainer (1.x) loads the teacher's tokenizer by the model's name to compare
            # it with the student's: give the tiny teacher a local directory as its name
            where = Path(output_dir) / f"teacher-rank{rank}"
            teacher.save_pretrained(where)
            tok.save_pretrained(where)
            teacher.config._name_or_path = str(where)
        kwargs["teacher_model"] = teacher
    if spec.online:
        kwargs.update(reward_kwargs(trainer, tok, spec.model))
    compat.reset_accelerate_state()
    try:
        args = compat.make_config(trainer, output_dir, **config)
        built = compat.make_trainer(trainer, model=model, args=args, tokenizer=tok,
                                    train_dataset=Dataset.from_dict(rows_for(spec, stressor, rank, world)),
                                    **kwargs)
        built.train()
        assert built.state.global_step == config["max_steps"], (
            f"trained {built.state.global_step} steps, expected {config['max_steps']}")
        if stressor == "eval_uneven":
            metrics = built.evaluate()
            assert "eval_loss" in metrics or metrics, f"evaluate() returned {metrics!r}"
        return built
    finally:
        compat.reset_accelerate_state()
