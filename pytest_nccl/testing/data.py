"""Per-rank toy data that differs between ranks the way real data does.

With ``ragged=True`` rank ``r``'s sequences fall in their own length band, disjoint
from every other rank's, so any batch a rank pads to its longest sample has a
different length on every rank; rank ``r`` also holds ``r * extra`` more rows
(uneven batch counts).  With ``ragged=False`` every row on every rank has the
same token length (the control).

Lengths are in tokens of ``tiny_tokenizer()`` (one token per ASCII character).
Rows are plain ``dict[str, list]`` (``datasets.Dataset.from_dict`` takes them); this
module imports nothing heavy.
"""

from __future__ import annotations

_ALPHABET = "abcdefghijklmnopqrstuvwxyz"

# Band of rank r: [BASE + r * STRIDE, BASE + r * STRIDE + SPREAD).
BASE = 4
STRIDE = 8
SPREAD = 3


def _text(seed: int, n: int) -> str:
    """Deterministic lowercase text of exactly ``n`` characters."""
    return "".join(_ALPHABET[(seed * 7 + i * 3) % 26] for i in range(n))


def lengths(rank: int, *, ragged: bool = True, rows: int = 6, extra: int = 2, base: int = BASE, equal: int = 8):
    """Token lengths of rank ``rank``'s rows (see module doc)."""
    count = rows + rank * extra
    if not ragged:
        return [equal] * count
    lo = base + rank * STRIDE
    return [lo + (i % SPREAD) for i in range(count)]


def text_rows(rank: int, *, ragged: bool = True, **kw) -> dict:
    """Language-modeling rows: ``{"text": [...]}``."""
    return {"text": [_text(rank * 100 + i, n) for i, n in enumerate(lengths(rank, ragged=ragged, **kw))]}


def conversation_rows(rank: int, *, ragged: bool = True, **kw) -> dict:
    """Conversational rows: ``{"messages": [[user, assistant], ...]}``; the assistant
    reply carries the rank's length band (the user turn is fixed, 3 characters)."""
    out = []
    for i, n in enumerate(lengths(rank, ragged=ragged, **kw)):
        out.append(
            [
                {"role": "user", "content": _text(i, 3)},
                {"role": "assistant", "content": _text(rank * 100 + i, n)},
            ]
        )
    return {"messages": out}


def preference_rows(rank: int, *, ragged: bool = True, **kw) -> dict:
    """Preference rows ``{"prompt", "chosen", "rejected"}`` (plain text). The prompt has
    a fixed length (3); chosen/rejected carry the rank's length band (rejected one shorter
    on ragged data, equal on the control)."""
    prompts, chosen, rejected = [], [], []
    for i, n in enumerate(lengths(rank, ragged=ragged, **kw)):
        prompts.append(_text(i, 3))
        chosen.append(" " + _text(rank * 100 + i, n - 1))
        rejected.append(" " + _text(rank * 100 + i + 50, n - 1 - (1 if ragged and i % 2 else 0)))
    return {"prompt": prompts, "chosen": chosen, "rejected": rejected}


def prompt_rows(rank: int, *, ragged: bool = True, **kw) -> dict:
    """Prompt-only rows ``{"prompt": [...]}`` (for online trainers such as GRPO)."""
    return {"prompt": [_text(rank * 100 + i, n) for i, n in enumerate(lengths(rank, ragged=ragged, **kw))]}


def unpaired_rows(rank: int, *, ragged: bool = True, desirable=None, **kw) -> dict:
    """Unpaired preference rows ``{"prompt", "completion", "label"}`` (KTO, BCO). Labels
    alternate True/False unless ``desirable`` (True or False) gives every row the same label."""
    prompts, completions, labels = [], [], []
    for i, n in enumerate(lengths(rank, ragged=ragged, **kw)):
        prompts.append(_text(i, 3))
        completions.append(" " + _text(rank * 100 + i, n - 1))
        labels.append(bool(i % 2 == 0) if desirable is None else bool(desirable))
    return {"prompt": prompts, "completion": completions, "label": labels}


def implicit_preference_rows(rank: int, *, ragged: bool = True, **kw) -> dict:
    """Preference rows with the prompt inside each text, ``{"chosen", "rejected"}``: the
    format every RewardTrainer release takes."""
    rows = preference_rows(rank, ragged=ragged, **kw)
    return {"chosen": [p + c for p, c in zip(rows["prompt"], rows["chosen"], strict=True)],
            "rejected": [p + r for p, r in zip(rows["prompt"], rows["rejected"], strict=True)]}


def conversation_prompt_rows(rank: int, *, ragged: bool = True, **kw) -> dict:
    """Conversational prompt-only rows (the user turn carries the rank's length band), under both
    names TRL's on-policy trainers have read them by: ``{"prompt": [[user], ...], "messages":
    [[user], ...]}`` (DistillationTrainer read ``messages`` in 1.x's experimental releases)."""
    turns = [[{"role": "user", "content": _text(rank * 100 + i, n)}]
             for i, n in enumerate(lengths(rank, ragged=ragged, **kw))]
    return {"prompt": turns, "messages": [list(t) for t in turns]}
