"""Benchmark decontamination: cut from the training text every span that shares a word 13-gram with a
benchmark, with the cutting rules of GPT-3 (Brown et al. 2020, appendix C), and report what was cut.

Book: Pretraining data, "Decontamination".

Words: by default (``words="w+"``, this library's choice) the lower-cased ``\\w+`` runs, so that "U.S." gives
two words and "don't" two. GPT-3 defined a word as a lower-case, whitespace-delimited token with its
punctuation removed (``words="gpt3"``: "U.S." is "us", "don't" is "dont"); the two rules find different
13-grams on the same text. GPT-3 removed each colliding 13-gram with 200 characters on either side, split the
document there, dropped the pieces shorter than 200 characters, and removed a document split into more than
10 pieces. :func:`decontaminate` does the same with the window, the minimum piece and the maximum number of
pieces as parameters, and returns the removed character spans so that a pipeline can report them. GPT-3 also
ignored the 13-grams found in more than 10 training documents (boilerplate such as licences, common
phrases): :func:`drop_frequent_ngrams`. An item shorter than 13 words has no 13-gram and can never match;
``short_items=True`` in :func:`benchmark_ngrams` matches such an item whole (its full word sequence), this
library's option (GPT-3's own contamination analysis instead lowered n for benchmarks of short items).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from .quality import FilterResult

__all__ = ["word_spans", "benchmark_ngrams", "load_benchmark", "drop_frequent_ngrams", "Contamination",
           "find_contamination", "decontaminate", "decontamination_filter"]

_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"\S+")
WORD_RULES = ("w+", "gpt3")


def word_spans(text: str, words: str = "w+") -> list[tuple[int, int, str]]:
    """``(start, end, word)`` for each word of ``text``, lower-cased. ``words="w+"``: the ``\\w+`` runs;
    ``words="gpt3"``: the whitespace-delimited tokens with every punctuation character (Unicode category P)
    removed, tokens left empty dropped (GPT-3's definition).

    Book: Pretraining data, "Decontamination"
    """
    if words == "w+":
        return [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(text)]
    if words == "gpt3":
        out = []
        for m in _TOKEN.finditer(text):
            word = "".join(c for c in m.group().lower() if not unicodedata.category(c).startswith("P"))
            if word:
                out.append((m.start(), m.end(), word))
        return out
    raise ValueError(f"words must be one of {WORD_RULES}, got {words!r}")


def benchmark_ngrams(texts, n: int = 13, words: str = "w+", short_items: bool = False) -> frozenset[tuple[str, ...]]:
    """The set of word ``n``-grams of the benchmark ``texts`` (questions, answers, passages); with
    ``short_items=True`` a text of fewer than ``n`` words adds its whole word sequence instead (found only
    whole). ``words``: see :func:`word_spans`.

    Book: Pretraining data, "Decontamination"
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a collection of strings, not one string")
    grams = set()
    for text in texts:
        item = [w for *_, w in word_spans(text, words)]
        if short_items and 0 < len(item) < n:
            grams.add(tuple(item))
        grams.update(tuple(item[i:i + n]) for i in range(len(item) - n + 1))
    return frozenset(grams)


def drop_frequent_ngrams(ngrams: frozenset, documents, max_documents: int = 10,
                         words: str = "w+") -> frozenset[tuple[str, ...]]:
    """``ngrams`` without those found in more than ``max_documents`` of the training ``documents`` (GPT-3
    ignored the 13-grams of more than 10 training documents: mostly common phrases and legal boilerplate
    that the model should learn).

    Book: Pretraining data, "Decontamination"
    """
    if isinstance(documents, str):
        raise ValueError("documents must be a collection of strings, not one string")
    counts: dict[tuple[str, ...], int] = {}
    for document in documents:
        for gram in {g for *_, g in find_contamination(document, ngrams, words=words)}:
            counts[gram] = counts.get(gram, 0) + 1
    return frozenset(g for g in ngrams if counts.get(g, 0) <= max_documents)


def load_benchmark(path, n: int = 13, words: str = "w+", short_items: bool = False) -> frozenset[tuple[str, ...]]:
    """The ``n``-grams of a benchmark file: JSON lines (every string value of each object is a text) or
    plain text (one text per line). ``words`` and ``short_items``: see :func:`benchmark_ngrams`.

    Book: Pretraining data, "Decontamination"
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file not found: {path}")
    texts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix in (".jsonl", ".json"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
            values = row.values() if isinstance(row, dict) else [row]
            texts.extend(v for v in values if isinstance(v, str))
        else:
            texts.append(line)
    return benchmark_ngrams(texts, n, words, short_items)


@dataclass(frozen=True)
class Contamination:
    """What :func:`decontaminate` found in one text: ``ngrams`` (the colliding n-grams, in order of
    appearance), ``removed`` (the half-open character spans cut, merged), ``pieces`` (the number of pieces
    the text was split into) and ``text`` (the pieces kept, joined by newlines).

    Book: Pretraining data, "Decontamination"
    """

    ngrams: tuple[tuple[str, ...], ...]
    removed: tuple[tuple[int, int], ...]
    pieces: int
    text: str


def find_contamination(text: str, ngrams: frozenset, n: int = 13,
                       words: str = "w+") -> list[tuple[int, int, tuple[str, ...]]]:
    """``(start, end, ngram)`` character spans of ``text`` whose words form a benchmark gram: an ``n``-gram,
    or a whole short item (a shorter gram, see :func:`benchmark_ngrams`). ``n`` is kept for compatibility:
    the lengths looked for are those of the grams in ``ngrams``.

    Book: Pretraining data, "Decontamination"
    """
    spans = word_spans(text, words)
    found = []
    for length in sorted({len(g) for g in ngrams}):
        for i in range(len(spans) - length + 1):
            gram = tuple(w for *_, w in spans[i:i + length])
            if gram in ngrams:
                found.append((spans[i][0], spans[i + length - 1][1], gram))
    return sorted(found, key=lambda f: (f[0], f[1]))


def decontaminate(text: str, ngrams: frozenset, n: int = 13, window: int = 200, min_piece: int = 200,
                  max_pieces: int = 10, words: str = "w+") -> Contamination:
    """Cut each colliding ``n``-gram of ``text`` with ``window`` characters either side; of the pieces left,
    keep those of at least ``min_piece`` characters. ``pieces`` counts all pieces (a document with more than
    ``max_pieces`` is contaminated as a whole: :func:`decontamination_filter` removes it).

    ``words``: the word rule the ``ngrams`` were made with (:func:`word_spans`).

    Book: Pretraining data, "Decontamination"
    """
    found = find_contamination(text, ngrams, n, words)
    if not found:
        return Contamination((), (), 1, text)
    spans = []
    for start, end, _ in found:
        start, end = max(0, start - window), min(len(text), end + window)
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    pieces, last = [], 0
    for start, end in spans:
        pieces.append(text[last:start])
        last = end
    pieces.append(text[last:])
    pieces = [p.strip() for p in pieces if p.strip()]
    kept = [p for p in pieces if len(p) >= min_piece]
    return Contamination(tuple(g for *_, g in found), tuple(spans), len(pieces), "\n".join(kept))


def decontamination_filter(text: str, ngrams: frozenset, n: int = 13, max_pieces: int = 10,
                           words: str = "w+") -> FilterResult:
    """:func:`decontaminate` as a filter: removed (``decontamination:too_many_pieces``) when split into more
    than ``max_pieces`` pieces or when nothing is left (``decontamination:nothing_left``); otherwise kept
    with the contaminated spans cut.

    Book: Pretraining data, "Decontamination"
    """
    result = decontaminate(text, ngrams, n, max_pieces=max_pieces, words=words)
    if result.pieces > max_pieces:
        return FilterResult(False, ("decontamination:too_many_pieces",), result.text)
    if not result.text:
        return FilterResult(False, ("decontamination:nothing_left",), result.text)
    return FilterResult(True, (), result.text)
