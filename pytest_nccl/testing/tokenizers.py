"""An in-memory byte-level tokenizer for tests: no downloads, no files.

Every byte of UTF-8 text is one token (a byte-level BPE with no merges), so
lengths are predictable (``len(text.encode())`` tokens for plain text) and
tokenizing ``prompt + completion`` always starts with the tokens of ``prompt``,
which TRL's preference trainers rely on.

``transformers`` and ``tokenizers`` are imported inside the function, so importing
this module costs nothing.
"""

from __future__ import annotations

import functools

from .releases import library_setup

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|end|>"
UNK = "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK) + ROLE_TOKENS

# One turn is ``<|role|>content<|end|>``; ``{% generation %}`` marks what the
# assistant wrote (transformers' ``return_assistant_tokens_mask`` and TRL's
# ``assistant_only_loss`` use it).  The generation prompt is ``<|assistant|>``.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # Byte-level alphabet: the 256 printable stand-ins GPT-2 uses for bytes.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok.to_str()


def tiny_tokenizer(*, padding_side: str = "right", chat_template: str | None = CHAT_TEMPLATE):
    """Return a fresh ``PreTrainedTokenizerFast`` over a byte-level vocabulary.

    Special tokens: pad ``<|pad|>`` (id 0), bos ``<|bos|>`` (1), eos ``<|end|>`` (2),
    unk ``<|unk|>`` (3), role markers ``<|system|>``, ``<|user|>``, ``<|assistant|>``;
    then one token per byte (``len(tokenizer) == 263``).  No BOS/EOS is added by
    ``tokenizer(text)``: plain text of n ASCII characters is n tokens.  The chat
    template renders ``<|role|>content<|end|>`` per message.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    with library_setup("the tiny tokenizer", "transformers"):
        tok = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
            pad_token=PAD,
            bos_token=BOS,
            eos_token=EOS,
            unk_token=UNK,
            additional_special_tokens=list(ROLE_TOKENS),
            padding_side=padding_side,
            model_max_length=1024,
            clean_up_tokenization_spaces=False,
            model_input_names=["input_ids", "attention_mask"],
        )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok
