"""Subword tokenizers: classic BPE, byte-level BPE (with BPE-dropout), WordPiece and the Unigram model.

Book: Tokenizers (``book/tokenizers.md``).

Conventions, stated once here and referred to by the docstrings below:

- **Classic BPE** (:func:`train_bpe_words`, :func:`bpe_segment_word`; Sennrich et al., 2016) works on
  characters. The word ``"low"`` starts as the symbols ``l o w </w>``: the end-of-word marker ``</w>`` is a
  *separate* symbol, as in the paper's listing and the course notes. (subword-nmt >= 0.2 glues it to the last
  character instead, ``l o w</w>``: pass ``end_of_word="attached"``.) Among equally frequent pairs the one
  seen **first** wins, scanning the words in the order given and each word left to right -- what the
  listing's ``max(pairs, key=pairs.get)`` does on Python >= 3.7, where dicts keep insertion order.
- **Byte-level BPE** (:class:`BPETokenizer`, GPT-2) works on UTF-8 bytes: ids ``0..255`` are the single
  bytes, ``merges[i] = (id_a, id_b)`` creates id ``256 + i``, special tokens take the ids after the last
  merge. Any string round-trips. Among equally frequent pairs the smallest ``(id_a, id_b)`` wins. Text is
  first cut into pre-tokens by the GPT-2 regex (:data:`GPT2_SPLIT_PATTERN`, run by the standard ``re``
  module, see :func:`pretokenize`); merges never cross pre-tokens.
- **WordPiece** (:class:`WordPieceTokenizer`; BERT): the first piece of a word is written as is, every later
  piece with the prefix ``##`` (``"hugs" -> hug ##s``); words that cannot be segmented become ``[UNK]``.
- **Unigram** (:class:`UnigramTokenizer`; Kudo, 2018; SentencePiece): a space is the meta symbol ``▁``
  (U+2581) and every text gets one ``▁`` in front, so ``"a b" -> ▁a ▁b``; id 0 is ``<unk>``; piece scores
  are natural-log probabilities.
- Every public function checks its arguments and raises ``TypeError``/``ValueError`` naming the problem.
"""

from __future__ import annotations

import heapq
import json
import math
import operator
import os
import random
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from fractions import Fraction
from functools import lru_cache

import numpy as np

__all__ = [
    "END_OF_WORD",
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "train_bpe_words",
    "bpe_segment_word",
    "merge_symbols",
    "pretokenize",
    "BPETokenizer",
    "WordPieceTokenizer",
    "UnigramTokenizer",
]

END_OF_WORD = "</w>"
"""The end-of-word marker of classic BPE (Sennrich et al., 2016)."""

GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""GPT-2's pre-tokenisation regex (``encoder.py`` of openai/gpt-2), in the syntax of the ``regex`` module."""

GPT4_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"""
    r"""|\s+(?!\S)|\s+"""
)
"""The ``cl100k_base`` (GPT-4) pre-tokenisation regex of tiktoken: digits in groups of at most three."""

_CONTINUATION = "##"
_SPACE_SYMBOL = "\u2581"  # ▁, SentencePiece's meta symbol for a space
_MIN_LOG_PROB = math.log(sys.float_info.min)  # about -708: the floor for a character EM would round to 0
_UNK_SURFACE = "\u2047"  # ⁇, what an <unk> id decodes to (SentencePiece does the same)


# --------------------------------------------------------------------------------------------------------------
# argument checks


def _type_name(value) -> str:
    return type(value).__name__


def _check_int(name: str, value, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {_type_name(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_str(name: str, value, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {_type_name(value)}")
    if non_empty and not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _check_probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1], got {_type_name(value)}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return float(value)


def _check_choice(name: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_word_counts(word_counts, name: str = "word_counts") -> dict[str, int]:
    """A ``{word: count}`` mapping with non-empty string words and positive int counts."""
    if not isinstance(word_counts, Mapping):
        raise TypeError(f"{name} must be a dict {{word: count}}, got {_type_name(word_counts)}")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word:
            raise ValueError(f"{name} has the key {word!r}; words must be non-empty strings")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"{name}[{word!r}] must be an int count, got {_type_name(count)}")
        if count < 1:
            raise ValueError(f"{name}[{word!r}] = {count}; counts must be positive")
    return dict(word_counts)


def _check_special_tokens(special_tokens, name: str = "special_tokens") -> list[str]:
    if isinstance(special_tokens, str) or not isinstance(special_tokens, Iterable):
        raise TypeError(f"{name} must be a list of strings, got {_type_name(special_tokens)}")
    tokens = list(special_tokens)
    for tok in tokens:
        _check_str(f"each of {name}", tok, non_empty=True)
    duplicates = sorted({t for t in tokens if tokens.count(t) > 1})
    if duplicates:
        raise ValueError(f"{name} lists {duplicates} more than once")
    return tokens


def _check_ids(ids, vocab_size: int) -> list[int]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be a sequence of ints, got {_type_name(ids)}")
    out = []
    for k, i in enumerate(ids):
        if isinstance(i, bool):
            raise TypeError(f"ids[{k}] must be an int, got bool")
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"ids[{k}] must be an int, got {_type_name(i)}") from None
        if not 0 <= i < vocab_size:
            raise ValueError(f"ids[{k}] = {i} is not a token id: the vocabulary has ids 0..{vocab_size - 1}")
        out.append(i)
    return out


def _make_rng(seed) -> random.Random:
    """``None`` -> fresh randomness, an int -> a seeded generator, a ``random.Random`` -> used as is."""
    if seed is None:
        return random.Random()
    if isinstance(seed, random.Random):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be None, an int or a random.Random, got {_type_name(seed)}")
    return random.Random(seed)


def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {_type_name(path)}")
    return os.fspath(path)


def _read_json(path, kind: str) -> dict:
    path = _check_path(path)
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a JSON tokenizer file: {err}") from None
    if not isinstance(data, dict) or data.get("type") != kind:
        found = data.get("type") if isinstance(data, dict) else _type_name(data)
        raise ValueError(f"{path} holds {found!r}, not a {kind!r} file")
    if data.get("version") != 1:
        raise ValueError(f"{path} has format version {data.get('version')!r}; this code reads version 1")
    return data


def _write_json_lines(path, header: dict, list_key: str, rows: list) -> None:
    """JSON with the header keys first and one row of ``list_key`` per line, so the file reads well and diffs well."""
    path = _check_path(path)
    lines = ["{"]
    for key, value in header.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    lines.append(f"  {json.dumps(list_key)}: [")
    for k, row in enumerate(rows):
        lines.append("    " + json.dumps(row, ensure_ascii=False) + ("," if k < len(rows) - 1 else ""))
    lines += ["  ]", "}"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------------------------------
# Classic BPE (Sennrich et al., 2016)


def _initial_symbols(word: str, end_of_word: str) -> list[str]:
    if end_of_word == "separate":
        return [*word, END_OF_WORD]
    return [*word[:-1], word[-1] + END_OF_WORD]


def merge_symbols(symbols: list, a, b, new) -> list:
    """Replace every occurrence of the adjacent pair ``(a, b)`` by ``new``, left to right: one BPE merge
    applied to one word (any symbols: strings or ids).

    ``merge_symbols(["a", "a", "a"], "a", "a", "aa") == ["aa", "a"]``
    """
    out = []
    i, n = 0, len(symbols)
    while i < n:
        if i < n - 1 and symbols[i] == a and symbols[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def train_bpe_words(
    word_counts: dict[str, int],
    num_merges: int,
    *,
    end_of_word: str = "separate",
    tie_break: str = "first",
) -> list[tuple[str, str]]:
    """Learn ``num_merges`` BPE merges from word counts: the classic character-level algorithm.

    Book: Tokenizers, "Byte-pair encoding" (Sennrich et al., 2016, Algorithm 1).

    Each word becomes its characters plus the end-of-word marker ``</w>`` (``end_of_word="separate"``:
    ``low -> l o w </w>``, the paper's and the course notes' convention; ``"attached"``: ``l o w</w>``, the
    convention of subword-nmt >= 0.2). Then, ``num_merges`` times: count every adjacent symbol pair weighted
    by the word counts, merge the most frequent pair everywhere, record it. Stops early when no pair is left.

    Ties between equally frequent pairs (``tie_break``):

    - ``"first"`` (default): the pair seen first, scanning the words in the order of ``word_counts`` and each
      word left to right -- what the paper's ``max(pairs, key=pairs.get)`` does on Python >= 3.7;
    - ``"smallest"`` / ``"largest"``: the lexicographically smallest / largest pair (subword-nmt's
      ``learn_bpe.py`` takes ``max(stats, key=lambda x: (stats[x], x))``, i.e. ``"largest"``).

    This version recounts all pairs after every merge, as the paper does; :class:`BPETokenizer` updates the
    counts incrementally.

    >>> train_bpe_words({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 4)
    [('e', 's'), ('es', 't'), ('est', '</w>'), ('l', 'o')]
    """
    word_counts = _check_word_counts(word_counts)
    _check_int("num_merges", num_merges, minimum=0)
    _check_choice("end_of_word", end_of_word, ("separate", "attached"))
    _check_choice("tie_break", tie_break, ("first", "smallest", "largest"))

    words = [(_initial_symbols(w, end_of_word), c) for w, c in word_counts.items()]
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        counts: dict[tuple[str, str], int] = {}  # insertion order = order of first occurrence
        for symbols, c in words:
            for pair in zip(symbols, symbols[1:]):
                counts[pair] = counts.get(pair, 0) + c
        if not counts:
            break
        top = max(counts.values())
        tied = [pair for pair, c in counts.items() if c == top]
        best = tied[0] if tie_break == "first" else (min(tied) if tie_break == "smallest" else max(tied))
        merges.append(best)
        words = [(merge_symbols(symbols, *best, best[0] + best[1]), c) for symbols, c in words]
    return merges


def _check_str_merges(merges) -> list[tuple[str, str]]:
    if isinstance(merges, (str, bytes)) or not isinstance(merges, Iterable):
        raise TypeError(f"merges must be a list of (str, str) pairs, got {_type_name(merges)}")
    out = []
    for k, pair in enumerate(merges):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"merges[{k}] = {pair!r} is not a pair (a, b)")
        a, b = pair
        if not isinstance(a, str) or not isinstance(b, str) or not a or not b:
            raise ValueError(f"merges[{k}] = {pair!r}: both symbols must be non-empty strings")
        out.append((a, b))
    return out


def bpe_segment_word(word: str, merges, *, end_of_word: str = "separate") -> list[str]:
    """Segment one word with merges learned by :func:`train_bpe_words`.

    Book: Tokenizers, "Byte-pair encoding".

    Start from the characters and ``</w>`` (same ``end_of_word`` convention as in training); while some
    adjacent pair is a learned merge, merge (all occurrences of) the pair that was learned earliest. This is
    the same as replaying the merges in the order they were learned. The symbols returned keep the ``</w>``
    marker, which is what tells ``low</w>`` (a whole word) from ``low`` (the start of ``lower``).

    >>> merges = train_bpe_words({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 10)
    >>> bpe_segment_word("lowest", merges)
    ['low', 'est</w>']
    """
    _check_str("word", word, non_empty=True)
    merges = _check_str_merges(merges)
    _check_choice("end_of_word", end_of_word, ("separate", "attached"))
    ranks: dict[tuple[str, str], int] = {}
    for r, pair in enumerate(merges):
        ranks.setdefault(pair, r)
    symbols = _initial_symbols(word, end_of_word)
    while len(symbols) > 1:
        pair = min(zip(symbols, symbols[1:]), key=lambda p: ranks.get(p, math.inf))
        if pair not in ranks:
            break
        symbols = merge_symbols(symbols, *pair, pair[0] + pair[1])
    return symbols


# --------------------------------------------------------------------------------------------------------------
# Pre-tokenisation: the GPT-2 regex with the standard ``re`` module

# Unicode's White_Space property, which is what ``\s`` means in the ``regex`` module. (``re``'s ``\s`` also
# matches U+001C..U+001F, which are not White_Space.)
_WHITE_SPACE = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


@lru_cache(maxsize=None)
def _category_class(major: str) -> str:
    """The body of a character class (no brackets) matching every code point whose category starts with ``major``.

    ``re`` has no ``\\p{L}``/``\\p{N}``; these explicit ranges, computed once from ``unicodedata``, make the GPT-2
    regex behave as with the ``regex`` module (for the Unicode version of this Python).
    """
    majors = "".join([unicodedata.category(chr(cp))[0] for cp in range(sys.maxunicode + 1)])
    parts = []
    for m in re.finditer(major + "+", majors):
        lo, hi = m.start(), m.end() - 1
        parts.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
    return "".join(parts)


def _translate_pattern(pattern: str) -> str:
    """Rewrite ``\\p{L}``, ``\\p{N}``, ``\\s`` and ``\\S`` (``regex`` syntax) as explicit ``re`` classes."""
    out = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            if pattern.startswith(("\\p{L}", "\\p{N}"), i):
                body = _category_class(pattern[i + 3])
                out.append(body if in_class else f"[{body}]")
                i += 5
                continue
            if pattern[i + 1] == "s":
                out.append(_WHITE_SPACE if in_class else f"[{_WHITE_SPACE}]")
                i += 2
                continue
            if pattern[i + 1] == "S" and not in_class:
                out.append(f"[^{_WHITE_SPACE}]")
                i += 2
                continue
            if pattern.startswith(("\\p{", "\\P{"), i) or (pattern[i + 1] == "S" and in_class):
                raise ValueError(
                    f"pattern uses {pattern[i:i + 5]!r} at position {i}: only \\p{{L}}, \\p{{N}}, \\s and \\S "
                    "(outside brackets) are translated for the re module"
                )
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":  # a literal ] first in a class
                out.append("\\]")
                i += 1
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


@lru_cache(maxsize=16)
def _compile_split_pattern(pattern: str) -> re.Pattern:
    try:
        return re.compile(_translate_pattern(pattern))
    except re.error as err:
        raise ValueError(f"pattern {pattern!r} does not compile: {err}") from None


def pretokenize(text: str, pattern: str | None = GPT2_SPLIT_PATTERN) -> list[str]:
    """Cut ``text`` into the pre-tokens that byte-level BPE merges within (merges never cross them).

    Book: Tokenizers, "Byte-level BPE".

    ``pattern`` is written in the syntax of the ``regex`` module (``\\p{L}`` letters, ``\\p{N}`` numbers), as
    GPT-2 and tiktoken publish it. The standard ``re`` module runs it after ``\\p{L}``, ``\\p{N}`` become
    explicit code-point ranges (from ``unicodedata``, built once, ~0.3 s) and ``\\s``/``\\S`` become Unicode's
    White_Space set (``re``'s own ``\\s`` also matches U+001C..U+001F). No third-party package is needed and
    the split equals the ``regex`` module's for every code point assigned in this Python's Unicode version.
    The pieces always concatenate back to ``text``: a pattern that skips a character raises ``ValueError``.
    ``pattern=None`` returns ``[text]`` (no pre-tokenisation).

    >>> pretokenize("Hello world's 42  cats!!")
    ['Hello', ' world', "'s", ' 42', ' ', ' cats', '!!']
    """
    _check_str("text", text)
    if pattern is None:
        return [text] if text else []
    _check_str("pattern", pattern, non_empty=True)
    regex = _compile_split_pattern(pattern)
    pieces = []
    end = 0
    for m in regex.finditer(text):
        if m.start() != end:
            raise ValueError(
                f"pattern {pattern!r} skips {text[end:m.start()]!r} at position {end}; a pre-tokenisation "
                "pattern must match every character or text would be lost"
            )
        if m.end() > m.start():
            pieces.append(m.group())
        end = m.end()
    if end != len(text):
        raise ValueError(f"pattern {pattern!r} does not match {text[end:]!r} at the end of the text")
    return pieces


# --------------------------------------------------------------------------------------------------------------
# Incremental pair counts, shared by byte-level BPE and WordPiece training


class _PairIndex:
    """Counts of adjacent symbol pairs over distinct words, with an index from each pair to the words holding it.

    ``counts[(a, b)] = sum over words w of freq(w) * (number of positions i with w[i] = a, w[i+1] = b)``.
    A merge rewrites only the words that contain the pair and updates the counts of the pairs that changed,
    instead of recounting the corpus (the ``indices`` idea of subword-nmt's ``learn_bpe.py``).
    """

    def __init__(self, words: list[list], freqs: list[int]):
        self.words = words
        self.freqs = freqs
        self.counts: dict[tuple, int] = defaultdict(int)
        self.where: dict[tuple, set[int]] = defaultdict(set)
        for i, (w, f) in enumerate(zip(words, freqs)):
            for pair in zip(w, w[1:]):
                self.counts[pair] += f
                self.where[pair].add(i)

    def merge(self, pair: tuple, new) -> tuple[set, int]:
        """Merge ``pair`` into the symbol ``new`` everywhere; return the pairs whose count changed and how many
        occurrences (weighted by word frequency) were merged."""
        a, b = pair
        counts, where = self.counts, self.where
        changed = set()
        merged = 0
        for i in where.pop(pair, ()):
            old = self.words[i]
            new_word = merge_symbols(old, a, b, new)
            f = self.freqs[i]
            merged += (len(old) - len(new_word)) * f
            old_pairs = Counter(zip(old, old[1:]))
            new_pairs = Counter(zip(new_word, new_word[1:]))
            for p, n_old in old_pairs.items():
                n_new = new_pairs.get(p, 0)
                if n_new != n_old:
                    counts[p] += (n_new - n_old) * f
                    changed.add(p)
                    if n_new == 0 and p != pair:
                        where[p].discard(i)
            for p, n_new in new_pairs.items():
                if p not in old_pairs:
                    counts[p] += n_new * f
                    where[p].add(i)
                    changed.add(p)
            self.words[i] = new_word
        counts.pop(pair, None)
        changed.discard(pair)
        for p in changed:
            if counts[p] == 0:
                del counts[p]
                where.pop(p, None)
        return changed, merged


# --------------------------------------------------------------------------------------------------------------
# Byte-level BPE (GPT-2) with BPE-dropout


class BPETokenizer:
    """Byte-level BPE (GPT-2): any string round-trips, special tokens are never split.

    Book: Tokenizers, "Byte-level BPE".

    The vocabulary starts as the 256 byte values; ``merges[i] = (id_a, id_b)`` makes id ``256 + i`` whose bytes
    are ``vocab[id_a] + vocab[id_b]``; special tokens (e.g. ``"<|endoftext|>"``) take the ids after the last
    merge, in the order given. ``vocab`` maps every id to its bytes (so ``[(vocab[a], vocab[b]) for a, b in
    merges]`` lists the merges as byte strings). Encoding: cut the text at special tokens
    (longest match first), cut each piece into pre-tokens with ``pattern`` (:func:`pretokenize`, GPT-2's regex
    by default), turn each pre-token into its UTF-8 bytes and apply the merges in the order they were learned.

    >>> tok = BPETokenizer().train("low lower lowest " * 20, vocab_size=262)
    >>> [tok.vocab[i] for i in tok.encode(" lowest lower")]
    [b' lowe', b'st', b' lower']
    >>> tok.decode(tok.encode("naïve 🙂\\r\\n"))
    'naïve 🙂\\r\\n'
    """

    def __init__(self, merges=(), special_tokens=(), pattern: str | None = GPT2_SPLIT_PATTERN):
        self._setup(merges, special_tokens, pattern)

    def _setup(self, merges, special_tokens, pattern) -> None:
        if pattern is not None:
            _check_str("pattern", pattern, non_empty=True)
            _compile_split_pattern(pattern)  # fail now, not at the first encode
        if isinstance(merges, (str, bytes)) or not isinstance(merges, Iterable):
            raise TypeError(f"merges must be a list of (id_a, id_b) pairs, got {_type_name(merges)}")
        checked: list[tuple[int, int]] = []
        ranks: dict[tuple[int, int], int] = {}
        vocab = {i: bytes([i]) for i in range(256)}
        for k, pair in enumerate(merges):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"merges[{k}] = {pair!r} is not a pair (id_a, id_b)")
            a, b = pair
            for x in (a, b):
                if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 256 + k:
                    raise ValueError(
                        f"merges[{k}] = {pair!r}: ids must be ints that exist before this merge (0..{255 + k})"
                    )
            if (a, b) in ranks:
                raise ValueError(f"merges[{k}] = {pair!r} repeats merges[{ranks[(a, b)] - 256}]")
            checked.append((a, b))
            ranks[(a, b)] = 256 + k
            vocab[256 + k] = vocab[a] + vocab[b]
        specials = _check_special_tokens(special_tokens)
        self.pattern = pattern
        self.merges = checked
        self._ranks = ranks
        self.special_tokens = {tok: 256 + len(checked) + j for j, tok in enumerate(specials)}
        for tok, i in self.special_tokens.items():
            vocab[i] = tok.encode("utf-8")
        self.vocab = vocab
        self._special_regex = (
            re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")")
            if specials
            else None
        )
        self._cache: dict[str, tuple[int, ...]] = {}

    @property
    def vocab_size(self) -> int:
        """``256 + len(merges) + len(special_tokens)``."""
        return len(self.vocab)

    def _split_special(self, text: str) -> list[tuple[str, bool]]:
        if self._special_regex is None:
            return [(text, False)] if text else []
        parts = self._special_regex.split(text)  # the capture group keeps the separators at odd positions
        return [(p, k % 2 == 1) for k, p in enumerate(parts) if p]

    # ---- training

    def train(self, text: str, vocab_size: int, special_tokens=()) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``; returns ``self``.

        Book: Tokenizers, "Byte-level BPE".

        Special tokens are cut out of the training text first (they are never merged into anything). The
        pre-tokens are counted once; each distinct pre-token becomes a list of byte ids with its frequency.
        Then, per merge: take the most frequent adjacent pair (ties: smallest ``(id_a, id_b)``), rewrite only
        the pre-tokens that contain it and update only the counts that change (an index from each pair to the
        pre-tokens holding it, and a heap with lazy deletion to find the maximum). Training stops early when
        no pair is left, so the vocabulary can come out smaller than ``vocab_size``.
        """
        _check_str("text", text)
        _check_int("vocab_size", vocab_size)
        specials = _check_special_tokens(special_tokens)
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the 256 bytes and {len(specials)} special tokens alone "
                f"need {256 + len(specials)} ids"
            )
        self._setup((), specials, self.pattern)
        pretokens: Counter[str] = Counter()
        for chunk, is_special in self._split_special(text):
            if not is_special:
                pretokens.update(pretokenize(chunk, self.pattern))
        words = [list(p.encode("utf-8")) for p in pretokens]
        index = _PairIndex(words, list(pretokens.values()))
        heap = [(-c, a, b) for (a, b), c in index.counts.items()]
        heapq.heapify(heap)
        merges: list[tuple[int, int]] = []
        for new_id in range(256, vocab_size - len(specials)):
            while heap:
                neg, a, b = heap[0]
                if index.counts.get((a, b)) == -neg:
                    break
                heapq.heappop(heap)  # stale: the count changed after this entry was pushed
            if not heap:
                break
            _, a, b = heapq.heappop(heap)
            merges.append((a, b))
            changed, _ = index.merge((a, b), new_id)
            for p in changed:
                c = index.counts.get(p)
                if c:
                    heapq.heappush(heap, (-c, p[0], p[1]))
        self._setup(merges, specials, self.pattern)
        return self

    # ---- encoding

    def _merge_pretoken(self, ids: list[int]) -> list[int]:
        ranks = self._ranks
        while len(ids) >= 2:
            best, best_rank = None, math.inf
            for pair in zip(ids, ids[1:]):
                r = ranks.get(pair)
                if r is not None and r < best_rank:
                    best, best_rank = pair, r
            if best is None:
                break
            ids = merge_symbols(ids, best[0], best[1], best_rank)
        return ids

    def _merge_pretoken_dropout(self, ids: list[int], dropout: float, rng: random.Random) -> list[int]:
        # Provilkov et al. (2020), as in their reference code: at every step the candidate merges are tried in
        # priority order (rank, then position) and each is skipped with probability `dropout`; the first one
        # kept is applied. When every candidate is skipped, the segmentation is final.
        ranks = self._ranks
        while len(ids) >= 2:
            candidates = sorted(
                (ranks[pair], pos) for pos, pair in enumerate(zip(ids, ids[1:])) if pair in ranks
            )
            chosen = next((c for c in candidates if rng.random() >= dropout), None)
            if chosen is None:
                break
            new_id, pos = chosen
            ids = ids[:pos] + [new_id] + ids[pos + 2 :]
        return ids

    def encode(self, text: str, dropout: float = 0.0, seed=None) -> list[int]:
        """Token ids of ``text``; with ``dropout > 0``, BPE-dropout.

        Book: Tokenizers, "Byte-level BPE" (BPE-dropout: Provilkov et al., 2020).

        ``dropout = p``: while segmenting each pre-token, every applicable merge is skipped with probability
        ``p`` at every step (the first merge not skipped, in the order they were learned, is applied; the word
        is final when all are skipped). ``p = 0`` is plain BPE, ``p = 1`` gives single bytes. The result
        always decodes back to ``text``. ``seed``: an int (same ids every time), a ``random.Random`` (shared
        state), or ``None`` (fresh randomness). Special tokens are always their single id.
        """
        _check_str("text", text)
        dropout = _check_probability("dropout", dropout)
        rng = _make_rng(seed) if dropout > 0 else None
        ids: list[int] = []
        for chunk, is_special in self._split_special(text):
            if is_special:
                ids.append(self.special_tokens[chunk])
                continue
            for piece in pretokenize(chunk, self.pattern):
                if rng is not None:
                    ids.extend(self._merge_pretoken_dropout(list(piece.encode("utf-8")), dropout, rng))
                    continue
                cached = self._cache.get(piece)
                if cached is None:
                    cached = tuple(self._merge_pretoken(list(piece.encode("utf-8"))))
                    if len(self._cache) >= 100_000:
                        self._cache.clear()
                    self._cache[piece] = cached
                ids.extend(cached)
        return ids

    def decode(self, ids, errors: str = "replace") -> str:
        """The text of ``ids``: concatenate the tokens' bytes and decode UTF-8.

        Book: Tokenizers, "Byte-level BPE".

        A slice of ids can end inside a multi-byte character; ``errors="replace"`` (as GPT-2 does) shows the
        broken bytes as U+FFFD, ``errors="strict"`` raises ``UnicodeDecodeError``.
        """
        ids = _check_ids(ids, self.vocab_size)
        _check_choice("errors", errors, ("strict", "replace", "ignore", "backslashreplace"))
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors=errors)

    # ---- files

    def save(self, path) -> None:
        """Write a readable JSON file: pattern, special tokens and one merge per line.

        Book: Tokenizers, "Byte-level BPE".

        Each merge is written as ``[id_a, id_b, "text"]``: ``text`` shows the new token's bytes (invalid UTF-8
        as ``\\xNN``) for a human reader and is ignored by :meth:`load`.
        """
        header = {
            "type": "llmarch.BPETokenizer",
            "version": 1,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
        }
        rows = [
            [a, b, self.vocab[256 + k].decode("utf-8", errors="backslashreplace")]
            for k, (a, b) in enumerate(self.merges)
        ]
        _write_json_lines(path, header, "merges", rows)

    @classmethod
    def load(cls, path) -> BPETokenizer:
        """Read a file written by :meth:`save`; the loaded tokenizer encodes exactly as the saved one."""
        data = _read_json(path, "llmarch.BPETokenizer")
        merges = data.get("merges")
        if not isinstance(merges, list) or "pattern" not in data:
            raise ValueError(f"{path} needs a 'pattern' and a list of 'merges'")
        pairs = []
        for k, row in enumerate(merges):
            if not isinstance(row, list) or len(row) < 2:
                raise ValueError(f"{path}: merge {k} is {row!r}, not [id_a, id_b, ...]")
            pairs.append((row[0], row[1]))
        return cls(pairs, data.get("special_tokens", []), data.get("pattern"))

    def __repr__(self) -> str:
        return f"BPETokenizer(merges={len(self.merges)}, special_tokens={list(self.special_tokens)})"


# --------------------------------------------------------------------------------------------------------------
# WordPiece (BERT)


def _is_punctuation(ch: str) -> bool:
    """BERT's rule: ASCII symbols count as punctuation too (``$``, ``^``, ...), plus every Unicode ``P*``."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _bert_is_whitespace(ch: str) -> bool:
    """BERT's whitespace: space, tab, newline, carriage return and the Unicode space separators (``Zs``)."""
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _bert_clean(text: str) -> str:
    """BERT's text cleaning: NUL, U+FFFD and control characters (category ``C*``, except tab, newline and
    carriage return, which are whitespace) are removed, and every whitespace character becomes a space.
    ``_bert_clean("a\x00b\tc\u200bd")`` -> ``"ab cd"`` (U+200B is a format character, ``Cf``)."""
    kept = []
    for ch in text:
        if ch in ("\x00", "\ufffd") or (ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")):
            continue
        kept.append(" " if _bert_is_whitespace(ch) else ch)
    return "".join(kept)


def _bert_pretokenize(text: str, lowercase: bool) -> list[str]:
    """BERT's basic tokenizer: clean the text (:func:`_bert_clean`), then split on whitespace; every
    punctuation mark and CJK character is its own word."""
    text = _bert_clean(text)
    if lowercase:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")  # strip accents, as uncased BERT
    words, buf = [], []
    for ch in text:
        if ch == " ":  # after cleaning, the only whitespace left
            if buf:
                words.append("".join(buf))
                buf = []
        elif _is_punctuation(ch) or _is_cjk(ch):
            if buf:
                words.append("".join(buf))
                buf = []
            words.append(ch)
        else:
            buf.append(ch)
    if buf:
        words.append("".join(buf))
    return words


def _wordpiece_score_key(pair_count: int, count_a: int, count_b: int) -> Fraction:
    return Fraction(pair_count, count_a * count_b)


class WordPieceTokenizer:
    """WordPiece (BERT): ``##`` continuation pieces, greedy longest-match-first encoding, ``[UNK]``.

    Book: Tokenizers, "WordPiece".

    ``vocab`` maps each token to its id (the order of BERT's ``vocab.txt``); ``merges`` lists the pairs
    merged in training, in order; ``special_tokens`` (``unk_token`` first) are never split. Text is
    pre-tokenised as BERT's basic tokenizer does: split on whitespace, every punctuation character and CJK
    ideograph is a word of its own (``lowercase=True`` also lowercases and strips accents, as uncased BERT).

    >>> tok = WordPieceTokenizer().train({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 14)
    >>> tok.merges[:2]
    [('##g', '##s'), ('##u', '##g')]
    >>> tok.tokenize("bugs mug")
    ['b', '##ugs', '[UNK]']
    """

    def __init__(
        self,
        vocab=(),
        unk_token: str = "[UNK]",
        lowercase: bool = False,
        max_input_chars_per_word: int = 100,
        special_tokens=(),
    ):
        _check_str("unk_token", unk_token, non_empty=True)
        if not isinstance(lowercase, bool):
            raise TypeError(f"lowercase must be a bool, got {_type_name(lowercase)}")
        _check_int("max_input_chars_per_word", max_input_chars_per_word, minimum=1)
        if isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
            raise TypeError(f"vocab must be a list of tokens in id order, got {_type_name(vocab)}")
        tokens = list(vocab)
        for tok in tokens:
            _check_str("each vocab entry", tok, non_empty=True)
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocab lists a token more than once")
        if tokens and unk_token not in tokens:
            raise ValueError(f"vocab does not contain the unknown token {unk_token!r}")
        specials = _check_special_tokens(special_tokens)
        missing = [t for t in specials if t not in tokens]
        if missing:
            raise ValueError(f"special_tokens {missing} are not in vocab")
        self.special_tokens = [unk_token, *(t for t in specials if t != unk_token)] if tokens else []
        self._special_regex = re.compile(
            "(" + "|".join(re.escape(t) for t in sorted(self.special_tokens, key=len, reverse=True)) + ")"
        ) if self.special_tokens else None
        self.unk_token = unk_token
        self.lowercase = lowercase
        self.max_input_chars_per_word = max_input_chars_per_word
        self.vocab: dict[str, int] = {tok: i for i, tok in enumerate(tokens)}
        self._id_to_token = tokens
        self._max_token_chars = max((len(t) for t in tokens), default=0)
        self.merges: list[tuple[str, str]] = []

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def train(self, text_or_word_counts, vocab_size: int, special_tokens=("[UNK]",)) -> WordPieceTokenizer:
        """Learn a vocabulary of ``vocab_size`` tokens; returns ``self``.

        Book: Tokenizers, "WordPiece".

        Input: a text (pre-tokenised as BERT does) or a dict ``{word: count}`` (used as given). Each word starts
        as ``w ##o ##r ##d``; the vocabulary starts as the special tokens (``unk_token`` is added first if
        missing) and every symbol seen. Then, until the vocabulary has ``vocab_size`` tokens or no pair is
        left, merge the pair with the highest score

            ``score(a, b) = count(a b) / (count(a) * count(b))``

        (counts weighted by word frequency; exact rational comparison; ties: the lexicographically smallest
        pair). Unlike BPE's raw frequency, the score prefers pairs whose parts are rare on their own.
        """
        if isinstance(text_or_word_counts, str):
            word_counts = dict(Counter(_bert_pretokenize(text_or_word_counts, self.lowercase)))
        else:
            word_counts = _check_word_counts(text_or_word_counts, "text_or_word_counts")
        _check_int("vocab_size", vocab_size)
        specials = _check_special_tokens(special_tokens)
        if self.unk_token not in specials:
            specials.insert(0, self.unk_token)

        words = [[w[0], *(_CONTINUATION + ch for ch in w[1:])] for w in word_counts]
        freqs = list(word_counts.values())
        alphabet = sorted({s for w in words for s in w} - set(specials))
        tokens = specials + alphabet
        if vocab_size < len(tokens):
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the {len(specials)} special tokens and the "
                f"{len(alphabet)} symbols of the corpus (every character, with and without ##) need {len(tokens)}"
            )
        symbol_counts: Counter = Counter()
        for w, f in zip(words, freqs):
            for s in w:
                symbol_counts[s] += f
        index = _PairIndex(words, freqs)
        known = set(tokens)
        merges: list[tuple[str, str]] = []
        while len(tokens) < vocab_size and index.counts:
            # float scores find the near-best pairs fast; exact fractions then decide between them
            scored = [(c / (symbol_counts[a] * symbol_counts[b]), (a, b), c) for (a, b), c in index.counts.items()]
            top = max(s for s, _, _ in scored)
            near = [(p, c) for s, p, c in scored if s >= top * (1 - 1e-9)]
            exact = {p: _wordpiece_score_key(c, symbol_counts[p[0]], symbol_counts[p[1]]) for p, c in near}
            best_score = max(exact.values())
            a, b = min(p for p, s in exact.items() if s == best_score)
            new = a + b[len(_CONTINUATION) :]
            _, merged = index.merge((a, b), new)
            symbol_counts[a] -= merged
            symbol_counts[b] -= merged
            symbol_counts[new] += merged
            merges.append((a, b))
            if new not in known:
                known.add(new)
                tokens.append(new)
        self.__init__(tokens, self.unk_token, self.lowercase, self.max_input_chars_per_word, specials)
        self.merges = merges
        return self

    def _tokenize_word(self, word: str) -> list[str]:
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces = []
        start, n = 0, len(word)
        while start < n:
            end = min(n, start + self._max_token_chars)
            piece = None
            while start < end:
                candidate = word[start:end] if start == 0 else _CONTINUATION + word[start:end]
                if candidate in self.vocab:
                    piece = candidate
                    break
                end -= 1
            if piece is None:
                return [self.unk_token]  # BERT: one unknown stretch makes the whole word [UNK]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``: greedy longest-match-first within each word, as BERT does.

        Book: Tokenizers, "WordPiece".

        From the start of the word take the longest prefix in the vocabulary, then the longest ``##``-piece
        that continues it, and so on; a word with a stretch no piece covers (or longer than
        ``max_input_chars_per_word``) becomes the single token ``unk_token``. Special tokens (``unk_token``
        and ``special_tokens``) in the text are kept whole, before pre-tokenisation.
        """
        _check_str("text", text)
        if not self.vocab:
            raise ValueError("this WordPieceTokenizer has no vocabulary yet: call train() or pass vocab")
        parts = self._special_regex.split(text) if self._special_regex else [text]
        tokens = []
        for k, part in enumerate(parts):  # odd positions hold the special tokens
            if k % 2:
                tokens.append(part)
            else:
                tokens.extend(p for word in _bert_pretokenize(part, self.lowercase) for p in self._tokenize_word(word))
        return tokens

    def encode(self, text: str) -> list[int]:
        """Ids of :meth:`tokenize`."""
        return [self.vocab[t] for t in self.tokenize(text)]

    def decode(self, ids) -> str:
        """Join tokens with spaces and glue ``##`` pieces to the previous token.

        Book: Tokenizers, "WordPiece". The pre-tokeniser threw the whitespace away, so this is not the exact
        input: ``"Hello, world"`` decodes as ``"Hello , world"``.
        """
        ids = _check_ids(ids, self.vocab_size)
        out = []
        for i in ids:
            tok = self._id_to_token[i]
            if tok.startswith(_CONTINUATION) and len(tok) > len(_CONTINUATION) and out:
                out[-1] += tok[len(_CONTINUATION) :]
            else:
                out.append(tok)
        return " ".join(out)

    def save(self, path) -> None:
        """A readable JSON file: settings, then the tokens in id order, one per line."""
        header = {
            "type": "llmarch.WordPieceTokenizer",
            "version": 1,
            "unk_token": self.unk_token,
            "lowercase": self.lowercase,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "special_tokens": self.special_tokens,
            "merges": [list(m) for m in self.merges],
        }
        _write_json_lines(path, header, "vocab", list(self._id_to_token))

    @classmethod
    def load(cls, path) -> WordPieceTokenizer:
        data = _read_json(path, "llmarch.WordPieceTokenizer")
        tok = cls(
            data.get("vocab", []),
            data.get("unk_token", "[UNK]"),
            data.get("lowercase", False),
            data.get("max_input_chars_per_word", 100),
            data.get("special_tokens", ()),
        )
        tok.merges = [tuple(m) for m in data.get("merges", [])]
        return tok

    def __repr__(self) -> str:
        return f"WordPieceTokenizer(vocab_size={self.vocab_size}, unk_token={self.unk_token!r})"


# --------------------------------------------------------------------------------------------------------------
# Unigram language model (Kudo, 2018)


def _logsumexp(values: list[float]) -> float:
    if not values:
        return -math.inf
    m = max(values)
    if m == -math.inf:
        return m
    return m + math.log(sum(math.exp(v - m) for v in values))


def _sentencepiece_words(text: str) -> list[str]:
    """Spaces become ``▁``, one ``▁`` goes in front, a new word starts at every ``▁``.

    ``"a  b" -> ["▁a", "▁", "▁b"]``
    """
    if not text:
        return []
    s = _SPACE_SYMBOL + text.replace(" ", _SPACE_SYMBOL)
    starts = [i for i, ch in enumerate(s) if ch == _SPACE_SYMBOL]
    return [s[a:b] for a, b in zip(starts, starts[1:] + [len(s)])]


def _build_lattices(counts: dict[str, int], piece_index: dict[str, int], max_len: int) -> list:
    """Every word's segmentation lattice as arrays, words of similar length batched together.

    A batch is ``(ids, lengths, weights, words)``: ``ids[b, e - 1, l - 1]`` is the index of the piece
    ``word_b[e - l : e]`` (the edge of length ``l`` that ends at position ``e``) or -1 if it is not a piece;
    words are padded to the batch length ``N`` with -1; ``weights`` are the word counts.
    """
    batches: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for word, c in counts.items():
        n = len(word)
        batches[n if n <= 16 else 1 << (n - 1).bit_length()].append((word, c))
    out = []
    for size, group in sorted(batches.items()):
        k = min(max_len, size)
        flat: list[int] = []
        for word, _ in group:
            n = len(word)
            for e in range(1, size + 1):
                if e > n:
                    flat.extend([-1] * k)
                else:
                    flat.extend(piece_index.get(word[e - l : e], -1) if l <= e else -1 for l in range(1, k + 1))
        ids = np.array(flat, dtype=np.int32).reshape(len(group), size, k)
        lengths = np.array([len(w) for w, _ in group], dtype=np.int64)
        weights = np.array([c for _, c in group], dtype=np.float64)
        out.append((ids, lengths, weights, [w for w, _ in group]))
    return out


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1)
    shift = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return shift + np.log(np.exp(x - shift[:, None]).sum(axis=1))


def _forward_backward(lattices: list, log_probs: np.ndarray) -> tuple[np.ndarray, float]:
    """Expected piece counts and the corpus log-likelihood, all words of a batch at once.

    ``alpha[e] = logsumexp_l(alpha[e - l] + log p(word[e-l:e]))`` from ``alpha[0] = 0``;
    ``beta[s] = logsumexp_l(log p(word[s:s+l]) + beta[s + l])`` from ``beta[n] = 0``; ``log P(word) = alpha[n]``;
    the edge ``word[s:e]`` is used ``exp(alpha[s] + log p + beta[e] - log P(word))`` times in expectation.
    """
    expected = np.zeros(len(log_probs))
    total = 0.0
    for ids, lengths, weights, words in lattices:
        batch, size, k = ids.shape
        rows = np.arange(batch)
        lp = np.where(ids >= 0, log_probs[np.maximum(ids, 0)], -np.inf)
        alpha = np.full((batch, size + 1), -np.inf)
        alpha[:, 0] = 0.0
        for e in range(1, size + 1):
            m = min(k, e)
            alpha[:, e] = _logsumexp_rows(alpha[:, e - m : e][:, ::-1] + lp[:, e - 1, :m])
        log_z = alpha[rows, lengths]
        if not np.all(np.isfinite(log_z)):
            word = words[int(np.argmin(np.isfinite(log_z)))]
            raise ValueError(f"{word!r} cannot be segmented with the current pieces")
        beta = np.full((batch, size + 1), -np.inf)
        beta[rows, lengths] = 0.0
        for s in range(size - 1, -1, -1):
            m = min(k, size - s)
            steps = np.arange(m)
            inner = _logsumexp_rows(lp[:, s + steps, steps] + beta[:, s + 1 : s + 1 + m])
            beta[:, s] = np.where(lengths == s, 0.0, inner)
        ends = np.arange(1, size + 1)[:, None]
        starts = np.maximum(ends - np.arange(1, k + 1)[None, :], 0)
        with np.errstate(invalid="ignore"):
            log_post = alpha[:, starts] + lp + beta[:, ends] - log_z[:, None, None]
        used = ids >= 0
        post = np.exp(log_post[used]) * np.broadcast_to(weights[:, None, None], ids.shape)[used]
        expected += np.bincount(ids[used], weights=post, minlength=len(log_probs))
        total += float(weights @ log_z)
    return expected, total


def _best_splits(lattices: list, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every word of ``lattices`` (in pruning: the pieces themselves), the best segmentation that is *not*
    the whole word: Viterbi (``max`` where :func:`_forward_backward` has ``logsumexp``), a batch at a time.

    Returns ``(whole, split)``: ``whole[r]`` is the index of the row's whole word as a piece (-1 if it is not
    one); ``split[r]`` the piece indices of its best split, padded with -1. Ties go to the longest final piece,
    as in :meth:`UnigramTokenizer.viterbi`.
    """
    wholes, splits = [], []
    width = max((ids.shape[2] for ids, *_ in lattices), default=1)
    for ids, lengths, _, _ in lattices:
        batch, size, k = ids.shape
        rows = np.arange(batch)
        wholes.append(ids[rows, lengths - 1, lengths - 1])
        lp = np.where(ids >= 0, log_probs[np.maximum(ids, 0)], -np.inf)
        lp[rows, lengths - 1, lengths - 1] = -np.inf  # forbid the edge that is the whole word
        best = np.full((batch, size + 1), -np.inf)
        best[:, 0] = 0.0
        last = np.zeros((batch, size + 1), dtype=np.int64)  # length of the last piece of the best path
        for e in range(1, size + 1):
            m = min(k, e)
            cand = (best[:, e - m : e][:, ::-1] + lp[:, e - 1, :m])[:, ::-1]  # column j: last piece of length m - j
            j = cand.argmax(axis=1)
            best[:, e] = cand[rows, j]
            last[:, e] = m - j
        split = np.full((batch, width), -1, dtype=np.int64)  # filled from the end, then left-aligned
        pos = lengths.copy()
        for t in range(width):
            active = np.nonzero(pos > 0)[0]
            if not len(active):
                break
            length = last[active, pos[active]]
            split[active, t] = ids[active, pos[active] - 1, length - 1]
            pos[active] -= length
        splits.append(split)  # pieces in reverse order; the order does not matter for the loss
    if not wholes:
        return np.zeros(0, dtype=np.int64), np.zeros((0, width), dtype=np.int64)
    return np.concatenate(wholes), np.concatenate(splits)


def _drop_rows(lattices: list) -> list:
    """Keep the rows whose whole word is (still) a piece."""
    out = []
    for ids, lengths, weights, words in lattices:
        keep = ids[np.arange(len(lengths)), lengths - 1, lengths - 1] >= 0
        if keep.any():
            out.append((ids[keep], lengths[keep], weights[keep], [w for w, k in zip(words, keep.tolist()) if k]))
    return out


class UnigramTokenizer:
    """Unigram language-model tokenizer (Kudo, 2018), the model of SentencePiece.

    Book: Tokenizers, "Unigram".

    A word is a sequence of pieces ``x = (x_1, ..., x_n)`` with probability ``P(x) = prod_i p(x_i)``; a string
    ``X`` has many segmentations ``S(X)``, its likelihood is ``P(X) = sum_{x in S(X)} P(x)``. ``pieces`` maps
    each piece to ``log p`` (natural log); ids: 0 is ``unk_token``, then the pieces in the order of
    ``pieces`` (training sorts them by probability, most probable first). Text is handled as SentencePiece
    does (module docstring): spaces become ``▁`` and every text starts with one, so
    ``decode(encode(text)) == text`` whenever every character of ``text`` is a piece. A character that is not
    a piece is encoded as the ``unk_token`` id (one per character) and decodes to ``⁇``. Only the space is
    replaced (no other normalisation); a ``▁`` already in the input decodes as a space.

    >>> tok = UnigramTokenizer.from_pieces({"a": -1.0, "b": -2.0, "ab": -2.5})
    >>> tok.viterbi("abab")
    (['ab', 'ab'], -5.0)
    """

    def __init__(self, pieces: Mapping[str, float] | None = None, unk_token: str = "<unk>"):
        _check_str("unk_token", unk_token, non_empty=True)
        pieces = {} if pieces is None else pieces
        if not isinstance(pieces, Mapping):
            raise TypeError(f"pieces must be a dict {{piece: log_prob}}, got {_type_name(pieces)}")
        checked: dict[str, float] = {}
        for piece, lp in pieces.items():
            _check_str("each piece", piece, non_empty=True)
            if isinstance(lp, bool) or not isinstance(lp, (int, float)):
                raise TypeError(f"pieces[{piece!r}] must be a float log-probability, got {_type_name(lp)}")
            if not math.isfinite(lp):
                raise ValueError(f"pieces[{piece!r}] = {lp}; log-probabilities must be finite")
            checked[piece] = float(lp)
        if unk_token in checked:
            raise ValueError(f"the unknown token {unk_token!r} cannot also be a piece")
        self.unk_token = unk_token
        self.history: list[tuple[int, float]] = []
        self._set_pieces(checked)

    def _set_pieces(self, pieces: dict[str, float]) -> None:
        self.pieces: dict[str, float] = pieces
        self._id_to_piece = [self.unk_token, *pieces]
        self.vocab: dict[str, int] = {p: i for i, p in enumerate(self._id_to_piece)}
        self._max_len = max((len(p) for p in pieces), default=0)

    @classmethod
    def from_pieces(cls, pieces: Mapping[str, float], unk_token: str = "<unk>") -> UnigramTokenizer:
        """A tokenizer with the given ``{piece: log_prob}`` (ids 1, 2, ... in the dict's order; 0 is ``unk_token``).

        Book: Tokenizers, "Unigram". The log-probabilities need not be normalised for :meth:`viterbi`
        (only differences matter there); :meth:`log_likelihood` treats them as given.
        """
        return cls(pieces, unk_token)

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_piece)

    # ---- the lattice

    def _check_word(self, word: str) -> str:
        _check_str("word", word)
        for ch in word:
            if ch not in self.pieces:
                raise ValueError(
                    f"cannot segment {word!r}: the character {ch!r} is not a piece (encode() maps it to "
                    f"{self.unk_token!r})"
                )
        return word

    def _forward(self, word: str, scale: float = 1.0) -> list[float]:
        """``alpha[e] = log sum over segmentations x of word[:e] of prod p(x_i)^scale``."""
        logp, maxlen = self.pieces, self._max_len
        n = len(word)
        alpha = [-math.inf] * (n + 1)
        alpha[0] = 0.0
        for e in range(1, n + 1):
            terms = []
            for s in range(max(0, e - maxlen), e):
                lp = logp.get(word[s:e])
                if lp is not None and alpha[s] > -math.inf:
                    terms.append(alpha[s] + scale * lp)
            alpha[e] = _logsumexp(terms)
        return alpha

    def _viterbi(self, word: str, split: bool = False) -> tuple[list[str], float]:
        """Best segmentation of ``word``; with ``split=True`` the best one that is not ``word`` itself."""
        get, maxlen = self.pieces.get, self._max_len
        n = len(word)
        best = [0.0] + [-math.inf] * n
        back = [0] * (n + 1)
        for e in range(1, n + 1):
            top, arg = -math.inf, 0
            for s in range(max(0, e - maxlen), e):  # longest final piece first: it wins ties
                lp = get(word[s:e])
                if lp is not None and best[s] + lp > top:
                    top, arg = best[s] + lp, s
            if e == n and split and arg == 0:
                # the best way to end is the whole word: redo the last position without that edge
                top, arg = -math.inf, 0
                for s in range(max(1, e - maxlen), e):
                    lp = get(word[s:e])
                    if lp is not None and best[s] + lp > top:
                        top, arg = best[s] + lp, s
            best[e], back[e] = top, arg
        if best[n] == -math.inf:
            return [], -math.inf
        pieces, e = [], n
        while e > 0:
            pieces.append(word[back[e] : e])
            e = back[e]
        return pieces[::-1], best[n]

    def viterbi(self, word: str) -> tuple[list[str], float]:
        """The most probable segmentation of ``word`` and its log-probability ``sum_i log p(x_i)``.

        Book: Tokenizers, "Unigram": ``x* = argmax_{x in S(X)} log P(x)`` by dynamic programming over the end
        positions, ``best[e] = max_s best[s] + log p(word[s:e])``. Equal scores go to the segmentation whose
        last piece is longest. ``word`` is taken literally (no ``▁`` is added); a character that is not a
        piece raises ``ValueError``.
        """
        self._check_word(word)
        return self._viterbi(word)

    def sample(self, word: str, alpha: float = 1.0, seed=None) -> list[str]:
        """Draw a segmentation ``x`` of ``word`` with probability ``P(x)^alpha / sum_{x'} P(x')^alpha``.

        Book: Tokenizers, "Unigram" (subword regularisation, Kudo, 2018). Forward filtering computes
        ``A[e] = log sum over segmentations of word[:e] of P^alpha``; backward sampling then draws the last piece
        ``word[s:e]`` with probability ``exp(A[s] + alpha log p(word[s:e]) - A[e])`` and repeats from ``s``.
        ``alpha -> 0`` is uniform over segmentations, large ``alpha`` approaches :meth:`viterbi`. ``seed``: an
        int, a ``random.Random`` or ``None``.
        """
        self._check_word(word)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise TypeError(f"alpha must be a finite float, got {alpha!r}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        rng = _make_rng(seed)
        forward = self._forward(word, scale=float(alpha))
        logp, maxlen = self.pieces, self._max_len
        pieces, e = [], len(word)
        while e > 0:
            r = rng.random()
            acc = 0.0
            chosen = None
            for s in range(max(0, e - maxlen), e):
                lp = logp.get(word[s:e])
                if lp is None or forward[s] == -math.inf:
                    continue
                chosen = s
                acc += math.exp(forward[s] + alpha * lp - forward[e])
                if r < acc:
                    break
            pieces.append(word[chosen:e])  # rounding can leave r >= acc: then the last candidate is taken
            e = chosen
        return pieces[::-1]

    # ---- likelihood and EM

    def _word_counts(self, text_or_word_counts) -> dict[str, int]:
        if isinstance(text_or_word_counts, str):
            counts = dict(Counter(_sentencepiece_words(text_or_word_counts)))
        else:
            counts = _check_word_counts(text_or_word_counts, "text_or_word_counts")
        return counts

    def _lattices(self, counts: dict[str, int]) -> list:
        for word in counts:
            self._check_word(word)
        index = {p: k for k, p in enumerate(self.pieces)}
        return _build_lattices(counts, index, self._max_len)

    def _renumber(self, lattices: list, old_pieces: list[str]) -> list:
        """Lattices built for ``old_pieces``, re-indexed for the current pieces (a subset); dropped pieces -> -1."""
        index = {p: k for k, p in enumerate(self.pieces)}
        remap = np.array([index.get(p, -1) for p in old_pieces] + [-1], dtype=np.int32)
        return [(remap[ids], *rest) for ids, *rest in lattices]  # an id of -1 picks remap[-1] = -1

    def _log_probs(self) -> np.ndarray:
        return np.fromiter(self.pieces.values(), dtype=np.float64, count=len(self.pieces))

    def log_likelihood(self, text_or_word_counts) -> float:
        """``L = sum_words count(X) * log sum_{x in S(X)} P(x)`` (natural log), by the forward algorithm.

        Book: Tokenizers, "Unigram". A text is split into ``▁`` words first; a dict ``{word: count}`` is used
        as given. Every character must be a piece.
        """
        lattices = self._lattices(self._word_counts(text_or_word_counts))
        return _forward_backward(lattices, self._log_probs())[1]

    def _em_update(self, lattices) -> tuple[float, bool]:
        """One EM step on prepared lattices; returns the log-likelihood before it and whether pieces were dropped."""
        expected, ll = _forward_backward(lattices, self._log_probs())
        ratios = expected / expected.sum()
        new = {}
        for (p, _), r in zip(self.pieces.items(), ratios):
            if r > 0.0:
                new[p] = math.log(r)
            elif len(p) == 1:  # a character whose expected count underflowed: keep it, encode() needs it
                new[p] = _MIN_LOG_PROB
        dropped = len(new) != len(self.pieces)
        self._set_pieces(new)
        return ll, dropped

    def em_step(self, text_or_word_counts) -> float:
        """One EM iteration on the current pieces; returns the log-likelihood *before* the update.

        Book: Tokenizers, "Unigram". E-step: the expected count ``c(x)`` of each piece, summed over all
        segmentations weighted by their posterior ``P(x | X)``; forward-backward on each word's lattice gives
        it as ``sum over uses X[s:e] = x of exp(alpha[s] + log p(x) + beta[e] - log P(X))``. M-step:
        ``p(x) = c(x) / sum_y c(y)`` (maximum likelihood; SentencePiece adds a Bayesian correction). By the EM
        theorem the likelihood never decreases. Pieces whose expected count is 0 are dropped, except single
        characters, which keep a floor log-probability of about -708 (the smallest normal double) so that
        every character seen stays encodable.
        """
        return self._em_update(self._lattices(self._word_counts(text_or_word_counts)))[0]

    def _prune(self, lattices, piece_lattices, target: int) -> None:
        """Keep the ``target`` pieces whose removal would cost the most likelihood (all characters stay).

        The cost of removing ``x`` is estimated as Kudo (2018) and SentencePiece do: every use of ``x`` is
        replaced by the best segmentation ``alt(x)`` of ``x`` without ``x``. With expected counts ``c`` and
        ``N = sum c``: ``loss(x) = c(x) * (log(c(x) / N) - sum_{y in alt(x)} log p'(y))`` where
        ``p'(y) = (c(y) + c(x)) / (N + c(x) * (|alt(x)| - 1))``. ``lattices`` are the corpus's,
        ``piece_lattices`` those of the pieces themselves (longer than one character), both for the current pieces.
        """
        log_probs = self._log_probs()
        expected, _ = _forward_backward(lattices, log_probs)
        total = float(expected.sum())
        whole, split = _best_splits(piece_lattices, log_probs)
        present = whole >= 0
        whole, split = whole[present], split[present]
        c = expected[whole]
        in_split = split >= 0
        new_total = total + c * (in_split.sum(axis=1) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            new_p = (expected[np.maximum(split, 0)] + c[:, None]) / new_total[:, None]
            split_lp = np.where(in_split, np.log(new_p), 0.0)
            loss = np.where(c / total > 0.0, c * (np.log(c / total) - split_lp.sum(axis=1)), 0.0)
        names = list(self.pieces)
        ranked = sorted(zip((-loss).tolist(), (names[i] for i in whole.tolist())))
        n_chars = sum(1 for p in names if len(p) == 1)
        keep = {p for _, p in ranked[: max(0, target - n_chars)]}
        self._set_pieces({p: lp for p, lp in self.pieces.items() if len(p) == 1 or p in keep})

    def train(
        self,
        text_or_word_counts,
        vocab_size: int,
        *,
        max_piece_length: int = 16,
        seed_size: int = 100_000,
        shrink_factor: float = 0.75,
        em_iterations: int = 2,
    ) -> UnigramTokenizer:
        """Learn ``vocab_size - 1`` pieces (plus ``unk_token``); returns ``self``.

        Book: Tokenizers, "Unigram" (Kudo, 2018, section 3.2).

        1. Seed: every substring of at most ``max_piece_length`` characters seen at least twice (the
           ``seed_size`` most frequent; ties by string), plus every character; ``p`` proportional to frequency.
        2. Repeat: ``em_iterations`` EM steps (:meth:`em_step`); stop if at most ``vocab_size - 1`` pieces are
           left; otherwise prune to ``max(vocab_size - 1, shrink_factor * size)`` pieces, dropping those whose
           removal loses the least likelihood (:meth:`_prune`). Single characters are never dropped.

        Input: a text (split SentencePiece-style into ``▁`` words) or a dict ``{word: count}`` (used as
        given). ``history`` records ``(number of pieces, log-likelihood)`` before every EM step. Pieces are
        finally sorted by log-probability (highest first, ties by string), which fixes the ids. The result can
        have fewer pieces than asked: when the seed is smaller, and when EM drops pieces whose expected count
        underflows to zero (:meth:`em_step`), e.g. once whole words explain a small corpus.
        """
        counts = self._word_counts(text_or_word_counts)
        _check_int("vocab_size", vocab_size, minimum=2)
        _check_int("max_piece_length", max_piece_length, minimum=1)
        _check_int("seed_size", seed_size, minimum=1)
        _check_int("em_iterations", em_iterations, minimum=1)
        if isinstance(shrink_factor, bool) or not isinstance(shrink_factor, (int, float)):
            raise TypeError(f"shrink_factor must be a float in (0, 1), got {_type_name(shrink_factor)}")
        if not 0 < shrink_factor < 1:
            raise ValueError(f"shrink_factor must be in (0, 1), got {shrink_factor}")
        if not counts:
            raise ValueError("the training data is empty")

        chars: Counter[str] = Counter()
        substrings: Counter[str] = Counter()
        for word, c in counts.items():
            for ch in word:
                chars[ch] += c
            n = len(word)
            for s in range(n):
                for e in range(s + 2, min(n, s + max_piece_length) + 1):
                    substrings[word[s:e]] += c
        if len(chars) > vocab_size - 1:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the corpus has {len(chars)} distinct characters, which "
                f"are all kept, plus one id for {self.unk_token!r}: use vocab_size >= {len(chars) + 1}"
            )
        frequent = sorted(((c, s) for s, c in substrings.items() if c >= 2), key=lambda t: (-t[0], t[1]))
        seed = dict(chars)
        for c, s in frequent[: max(0, seed_size - len(chars))]:
            seed[s] = c
        total = sum(seed.values())
        self._set_pieces({p: math.log(c / total) for p, c in seed.items()})

        history: list[tuple[int, float]] = []
        target = vocab_size - 1
        # Pieces are only ever removed after the seed, so the seed's lattices hold every edge there will be:
        # build them once and renumber their piece indices after each removal. The pieces' own lattices
        # (for the pruning loss) lose the rows of removed pieces.
        indexed_for = list(self.pieces)  # the pieces that the lattices' indices refer to
        lattices = self._lattices(counts)
        piece_lattices = self._lattices({p: 1 for p in indexed_for if len(p) > 1})

        def renumber():
            nonlocal lattices, piece_lattices, indexed_for
            lattices = self._renumber(lattices, indexed_for)
            piece_lattices = _drop_rows(self._renumber(piece_lattices, indexed_for))
            indexed_for = list(self.pieces)

        while True:
            for _ in range(em_iterations):
                size = len(self.pieces)
                ll, dropped = self._em_update(lattices)
                history.append((size, ll))
                if dropped:
                    renumber()
            if len(self.pieces) <= target:
                break
            self._prune(lattices, piece_lattices, max(target, int(len(self.pieces) * shrink_factor)))
            renumber()
        ordered = sorted(self.pieces.items(), key=lambda t: (-t[1], t[0]))
        self._set_pieces(dict(ordered))
        self.history = history
        return self

    # ---- text

    def _segment_word(self, word: str, alpha, rng) -> list[int]:
        ids: list[int] = []
        run_start = 0
        for k in range(len(word) + 1):
            if k < len(word) and word[k] in self.pieces:
                continue
            if k > run_start:  # a stretch of known characters
                run = word[run_start:k]
                pieces = self._viterbi(run)[0] if alpha is None else self.sample(run, alpha, rng)
                ids.extend(self.vocab[p] for p in pieces)
            if k < len(word):
                ids.append(0)  # the unknown character: no piece can contain it
            run_start = k + 1
        return ids

    def tokenize(self, text: str, alpha: float | None = None, seed=None) -> list[str]:
        """The pieces of :meth:`encode` (``unk_token`` for unknown characters)."""
        return [self._id_to_piece[i] for i in self.encode(text, alpha, seed)]

    def encode(self, text: str, alpha: float | None = None, seed=None) -> list[int]:
        """Ids of ``text``: each ``▁`` word by :meth:`viterbi`, or sampled with :meth:`sample` when ``alpha`` is set.

        Book: Tokenizers, "Unigram". ``"Hello world" -> ▁Hello ▁world``; unknown characters -> id 0
        (``unk_token``); ``alpha``/``seed`` turn on subword regularisation.
        """
        _check_str("text", text)
        if not self.pieces:
            raise ValueError("this UnigramTokenizer has no pieces yet: call train() or from_pieces()")
        rng = None if alpha is None else _make_rng(seed)
        ids: list[int] = []
        for word in _sentencepiece_words(text):
            ids.extend(self._segment_word(word, alpha, rng))
        return ids

    def decode(self, ids) -> str:
        """Concatenate the pieces, turn ``▁`` back into spaces and drop the one space added in front."""
        ids = _check_ids(ids, self.vocab_size)
        text = "".join(_UNK_SURFACE if i == 0 else self._id_to_piece[i] for i in ids)
        text = text.replace(_SPACE_SYMBOL, " ")
        return text[1:] if text.startswith(" ") else text

    # ---- files

    def save(self, path) -> None:
        """A readable JSON file: ``unk_token``, then one ``[piece, log_prob]`` per line, in id order."""
        header = {"type": "llmarch.UnigramTokenizer", "version": 1, "unk_token": self.unk_token}
        _write_json_lines(path, header, "pieces", [[p, lp] for p, lp in self.pieces.items()])

    @classmethod
    def load(cls, path) -> UnigramTokenizer:
        data = _read_json(path, "llmarch.UnigramTokenizer")
        rows = data.get("pieces")
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 2 for r in rows):
            raise ValueError(f"{path}: 'pieces' must be a list of [piece, log_prob]")
        return cls({p: lp for p, lp in rows}, data.get("unk_token", "<unk>"))

    def __repr__(self) -> str:
        return f"UnigramTokenizer(pieces={len(self.pieces)}, unk_token={self.unk_token!r})"
