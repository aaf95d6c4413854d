"""Classic BPE (Sennrich et al., 2016): character-level merges learned from word counts.

Book: Tokenizers, "Byte-pair encoding".

The word ``"low"`` starts as the symbols ``l o w </w>``: the end-of-word marker ``</w>`` is a *separate*
symbol, as in the paper's listing and the course notes. (subword-nmt >= 0.2 glues it to the last character
instead, ``l o w</w>``: pass ``end_of_word="attached"``.) Among equally frequent pairs the one seen **first**
wins, scanning the words in the order given and each word left to right -- what the listing's
``max(pairs, key=pairs.get)`` does on Python >= 3.7, where dicts keep insertion order. :func:`merge_symbols`
(one merge applied to one word) is reused by byte-level BPE (:mod:`llmarch.tokenizers.bpe`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._common import _check_choice, _check_int, _check_str, _check_word_counts, _type_name

END_OF_WORD = "</w>"
"""The end-of-word marker of classic BPE (Sennrich et al., 2016)."""


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
