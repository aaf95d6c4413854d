"""GPT-2, GPT-4 (cl100k_base) and GPT-4o (o200k_base) as :class:`~llmarch.tokenizers.BPETokenizer`, from the
installed vocabulary files (nothing is downloaded).

Book: Tokenizers, "Real vocabularies".

The patterns and special-token ids are those of tiktoken 0.14 (``tiktoken_ext/openai_public.py``); GPT-2's
pattern is the original release's, which splits every text as tiktoken's faster ``r50k`` rewrite does.
"""

from __future__ import annotations

from ._common import _check_choice
from .bpe import BPETokenizer
from .pretokenize import CL100K_SPLIT_PATTERN, GPT2_SPLIT_PATTERN, O200K_SPLIT_PATTERN
from .vocab_files import OPENAI_VOCABULARIES, openai_vocabulary_files

OPENAI_SPECIAL_TOKENS = {
    "gpt2": {"<|endoftext|>": 50256},
    "cl100k_base": {
        "<|endoftext|>": 100257,
        "<|fim_prefix|>": 100258,
        "<|fim_middle|>": 100259,
        "<|fim_suffix|>": 100260,
        "<|endofprompt|>": 100276,
    },
    "o200k_base": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}
"""The official special tokens and ids of each vocabulary."""

OPENAI_SPLIT_PATTERNS = {
    "gpt2": GPT2_SPLIT_PATTERN,
    "cl100k_base": CL100K_SPLIT_PATTERN,
    "o200k_base": O200K_SPLIT_PATTERN,
}
"""The pre-tokenisation regex of each vocabulary."""


def openai_tokenizer(name: str) -> BPETokenizer:
    """``"gpt2"``, ``"cl100k_base"`` (GPT-4) or ``"o200k_base"`` (GPT-4o) with the official ids.

    Book: Tokenizers, "Real vocabularies".

    GPT-2 is read from ``encoder.json`` + ``vocab.bpe`` (:meth:`BPETokenizer.from_gpt2_files`), the others
    from their tiktoken rank files (:meth:`BPETokenizer.from_tiktoken`); see
    :func:`~llmarch.tokenizers.vocab_files.openai_vocabulary_files` for where the files come from.
    """
    _check_choice("name", name, OPENAI_VOCABULARIES)
    files = openai_vocabulary_files(name)
    specials, pattern = OPENAI_SPECIAL_TOKENS[name], OPENAI_SPLIT_PATTERNS[name]
    if name == "gpt2":
        return BPETokenizer.from_gpt2_files(*files, special_tokens=specials, pattern=pattern)
    return BPETokenizer.from_tiktoken(files[0], pattern, specials)
