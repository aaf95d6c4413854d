"""Byte-level BPE (GPT-2) with BPE-dropout, and the regex pre-tokenisation that runs before it.

Book: Tokenizers, "Byte-level BPE".

:class:`BPETokenizer` works on UTF-8 bytes: ids ``0..255`` are the single bytes, ``merges[i] = (id_a, id_b)``
creates id ``256 + i``, special tokens take the ids after the last merge. Any string round-trips. Among
equally frequent pairs the smallest ``(id_a, id_b)`` wins. Text is first cut into pre-tokens by the GPT-2
regex (:data:`GPT2_SPLIT_PATTERN`, run by the standard ``re`` module, see :func:`pretokenize`); merges never
cross pre-tokens. The incremental pair counts of training (:class:`_PairIndex`) also serve WordPiece.
"""

from __future__ import annotations

import heapq
import math
import random
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from functools import lru_cache

from ._common import (
    _check_choice,
    _check_ids,
    _check_int,
    _check_probability,
    _check_special_tokens,
    _check_str,
    _make_rng,
    _read_json,
    _type_name,
    _write_json_lines,
)
from .classic import merge_symbols

GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""GPT-2's pre-tokenisation regex (``encoder.py`` of openai/gpt-2), in the syntax of the ``regex`` module."""

GPT4_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"""
    r"""|\s+(?!\S)|\s+"""
)
"""The ``cl100k_base`` (GPT-4) pre-tokenisation regex of tiktoken: digits in groups of at most three."""


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
