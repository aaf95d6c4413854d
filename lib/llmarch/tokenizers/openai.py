"""GPT-2, GPT-4 (cl100k_base) and GPT-4o (o200k_base) as :class:`~llmarch.tokenizers.BPETokenizer`, and the
specifications of every encoding tiktoken ships, from the installed vocabulary files (nothing is downloaded).

Book: Tokenizers, "Real vocabularies".

The patterns and special-token ids are those of tiktoken 0.14 (``tiktoken_ext/openai_public.py``); GPT-2's
pattern is the original release's, which splits every text as tiktoken's faster ``r50k`` rewrite does.
:func:`encoding_spec` gives the arguments of :class:`~llmarch.tokenizers.Encoding` for ``gpt2``, ``r50k_base``,
``p50k_base``, ``p50k_edit``, ``cl100k_base``, ``o200k_base`` and ``o200k_harmony``: r50k's ranks are GPT-2's
``encoder.json`` without ``<|endoftext|>``, p50k adds the runs of 2 to 25 spaces as the tokens 50257 to
50280 (the tests check both files' sha256 against the ones tiktoken pins), o200k_harmony is o200k_base with
gpt-oss's special tokens.
"""

from __future__ import annotations

from functools import lru_cache

from ._common import _check_choice
from .bpe import BPETokenizer
from .pretokenize import CL100K_SPLIT_PATTERN, GPT2_SPLIT_PATTERN, O200K_SPLIT_PATTERN
from .vocab_files import OPENAI_VOCABULARIES, openai_vocabulary_files, read_gpt2_files, read_tiktoken_ranks

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


R50K_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
"""tiktoken's faster rewrite of :data:`~llmarch.tokenizers.GPT2_SPLIT_PATTERN` (same splits), used by its
``gpt2``, ``r50k_base`` and ``p50k`` encodings."""

_HARMONY_SPECIAL_TOKENS = {  # o200k_base's two, then gpt-oss's (200018 has two names, as in tiktoken)
    "<|endofprompt|>": 200018, "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|reserved_200000|>": 200000,
    "<|reserved_200001|>": 200001, "<|return|>": 200002, "<|constrain|>": 200003, "<|reserved_200004|>": 200004,
    "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
    "<|reserved_200009|>": 200009, "<|reserved_200010|>": 200010, "<|reserved_200011|>": 200011,
    "<|call|>": 200012, **{f"<|reserved_{i}|>": i for i in range(200013, 201088)},
}

ENCODING_NAMES = ("gpt2", "r50k_base", "p50k_base", "p50k_edit", "cl100k_base", "o200k_base", "o200k_harmony")
"""The encodings of tiktoken 0.14, all built from the installed files."""


@lru_cache(maxsize=None)
def _mergeable_ranks(vocabulary: str) -> dict[bytes, int]:
    """``{token bytes: rank}`` of ``"r50k"``, ``"p50k"``, ``"cl100k_base"`` or ``"o200k_base"``, read once (the
    encodings that share a vocabulary share this dict; nothing changes it)."""
    if vocabulary in ("r50k", "p50k"):
        token_ids, _ = read_gpt2_files(*openai_vocabulary_files("gpt2"))
        ranks = {token: i for token, i in token_ids.items() if token != b"<|endoftext|>"}
        if vocabulary == "p50k":
            ranks.update({b" " * n: 50257 + n - 2 for n in range(2, 26)})
        return ranks
    return read_tiktoken_ranks(openai_vocabulary_files(vocabulary)[0])


def encoding_spec(name: str) -> dict:
    """The keyword arguments of :class:`~llmarch.tokenizers.Encoding` for one of :data:`ENCODING_NAMES`:
    ``name``, ``pat_str``, ``mergeable_ranks``, ``special_tokens`` and (where tiktoken checks it)
    ``explicit_n_vocab``.

    Book: Tokenizers, "Real vocabularies".
    """
    _check_choice("name", name, ENCODING_NAMES)
    endoftext = {"<|endoftext|>": 50256}
    if name in ("gpt2", "r50k_base", "p50k_base", "p50k_edit"):
        ranks = _mergeable_ranks("r50k" if name in ("gpt2", "r50k_base") else "p50k")
        specials = dict(endoftext)
        if name == "p50k_edit":
            specials.update({"<|fim_prefix|>": 50281, "<|fim_middle|>": 50282, "<|fim_suffix|>": 50283})
        n_vocab = {"gpt2": 50257, "r50k_base": 50257, "p50k_base": 50281}.get(name)
        return {"name": name, "pat_str": R50K_SPLIT_PATTERN, "mergeable_ranks": ranks,
                "special_tokens": specials, "explicit_n_vocab": n_vocab}
    base = "cl100k_base" if name == "cl100k_base" else "o200k_base"
    specials = _HARMONY_SPECIAL_TOKENS if name == "o200k_harmony" else OPENAI_SPECIAL_TOKENS[base]
    return {"name": name, "pat_str": OPENAI_SPLIT_PATTERNS[base], "mergeable_ranks": _mergeable_ranks(base),
            "special_tokens": dict(specials), "explicit_n_vocab": None}
