"""Pre-tokenisation: the regexes that cut text into the pieces byte-level BPE merges within.

Book: Tokenizers, "Byte-level BPE" and "Real vocabularies".

The patterns are written in the syntax of the third-party ``regex`` module (``\\p{L}`` letters, ``\\p{N}``
numbers, possessive quantifiers ``++``), as GPT-2 and tiktoken publish them, and ``regex`` runs them with its
own Unicode tables. Merges never cross the pieces.
"""

from __future__ import annotations

from functools import lru_cache

import regex

from ._common import _check_str

GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""GPT-2's pre-tokenisation regex, as released in ``src/encoder.py`` of openai/gpt-2 (2019).

tiktoken's ``r50k_pat_str`` (``tiktoken_ext/openai_public.py``) is a faster rewrite that splits every text the
same way; the tests check both against tiktoken."""

CL100K_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s"""
)
"""The ``cl100k_base`` (GPT-4, GPT-3.5) regex as tiktoken 0.14 gives it in ``tiktoken_ext/openai_public.py``:
case-insensitive contractions, a letter run may take one leading non-letter, digits in groups of at most
three, and ``\\s++$`` for whitespace at the end of the text."""

GPT4_SPLIT_PATTERN = CL100K_SPLIT_PATTERN
"""Another name for :data:`CL100K_SPLIT_PATTERN`."""

_O200K_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
O200K_SPLIT_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _O200K_CONTRACTION,
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _O200K_CONTRACTION,
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
"""The ``o200k_base`` (GPT-4o) regex of tiktoken 0.14 (``tiktoken_ext/openai_public.py``): a word is a run of
upper-case letters then a run of lower-case ones (so ``"camelCase"`` is ``"camel"`` + ``"Case"``), combining
marks (``\\p{M}``) stay inside words, a contraction (any case) stays attached to its word."""


@lru_cache(maxsize=32)
def compile_split_pattern(pattern: str) -> regex.Pattern:
    """``pattern`` compiled by the ``regex`` module; ``ValueError`` naming the pattern if it does not compile."""
    _check_str("pattern", pattern, non_empty=True)
    try:
        return regex.compile(pattern)
    except regex.error as err:
        raise ValueError(f"pattern {pattern!r} does not compile: {err}") from None


def split_pieces(compiled: regex.Pattern, text: str) -> list[str]:
    """All matches of ``compiled`` in ``text``, which must cover it: ``ValueError`` names the first lost text."""
    pieces = compiled.findall(text) if compiled.groups == 0 else [m.group() for m in compiled.finditer(text)]
    if sum(map(len, pieces)) == len(text):  # non-overlapping, in order: equal lengths mean no gap
        return [p for p in pieces if p] if "" in pieces else pieces
    end = 0
    for m in compiled.finditer(text):
        if m.start() != end:
            raise ValueError(
                f"pattern {compiled.pattern!r} skips {text[end:m.start()]!r} at position {end}; a "
                "pre-tokenisation pattern must match every character or text would be lost"
            )
        end = m.end()
    raise ValueError(f"pattern {compiled.pattern!r} does not match {text[end:]!r} at the end of the text")


def pretokenize(text: str, pattern: str | None = GPT2_SPLIT_PATTERN) -> list[str]:
    """Cut ``text`` into the pre-tokens that byte-level BPE merges within (merges never cross them).

    Book: Tokenizers, "Byte-level BPE".

    ``pattern`` is a ``regex``-module pattern (:data:`GPT2_SPLIT_PATTERN`, :data:`CL100K_SPLIT_PATTERN`,
    :data:`O200K_SPLIT_PATTERN` or your own). The pieces always concatenate back to ``text``: a pattern that
    skips a character raises ``ValueError``. ``pattern=None`` returns ``[text]`` (no pre-tokenisation).

    >>> pretokenize("Hello world's 42  cats!!")
    ['Hello', ' world', "'s", ' 42', ' ', ' cats', '!!']
    """
    _check_str("text", text)
    if pattern is None:
        return [text] if text else []
    return split_pieces(compile_split_pattern(pattern), text)
