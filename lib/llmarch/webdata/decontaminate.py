"""Benchmark decontamination: cut from the training text every span that shares a word 13-gram with a
benchmark, as GPT-3 did (Brown et al. 2020, appendix C), and report what was cut.

Book: Pretraining data, "Decontamination".

Words are the lower-cased ``\\w+`` runs (:func:`llmarch.webdata.words`), so case, punctuation and spacing do
not hide an overlap. GPT-3 removed each colliding 13-gram with 200 characters on either side, split the
document there, dropped the pieces shorter than 200 characters, and removed a document split into more than
10 pieces. :func:`decontaminate` does the same with the window, the minimum piece and the maximum number of
pieces as parameters, and returns the removed character spans so that a pipeline can report them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .quality import FilterResult

__all__ = ["benchmark_ngrams", "load_benchmark", "Contamination", "find_contamination", "decontaminate",
           "decontamination_filter"]

_WORD = re.compile(r"\w+")


def benchmark_ngrams(texts, n: int = 13) -> frozenset[tuple[str, ...]]:
    """The set of word ``n``-grams of the benchmark ``texts`` (questions, answers, passages).

    Book: Pretraining data, "Decontamination"
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a collection of strings, not one string")
    grams = set()
    for text in texts:
        words = _WORD.findall(text.lower())
        grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return frozenset(grams)


def load_benchmark(path, n: int = 13) -> frozenset[tuple[str, ...]]:
    """The ``n``-grams of a benchmark file: JSON lines (every string value of each object is a text) or
    plain text (one text per line).

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
    return benchmark_ngrams(texts, n)


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


def find_contamination(text: str, ngrams: frozenset, n: int = 13) -> list[tuple[int, int, tuple[str, ...]]]:
    """``(start, end, ngram)`` character spans of ``text`` whose words form a benchmark ``n``-gram.

    Book: Pretraining data, "Decontamination"
    """
    matches = list(_WORD.finditer(text))
    words = [m.group().lower() for m in matches]
    return [(matches[i].start(), matches[i + n - 1].end(), tuple(words[i:i + n]))
            for i in range(len(words) - n + 1) if tuple(words[i:i + n]) in ngrams]


def decontaminate(text: str, ngrams: frozenset, n: int = 13, window: int = 200, min_piece: int = 200,
                  max_pieces: int = 10) -> Contamination:
    """Cut each colliding ``n``-gram of ``text`` with ``window`` characters either side; of the pieces left,
    keep those of at least ``min_piece`` characters. ``pieces`` counts all pieces (a document with more than
    ``max_pieces`` is contaminated as a whole: :func:`decontamination_filter` removes it).

    Book: Pretraining data, "Decontamination"
    """
    found = find_contamination(text, ngrams, n)
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


def decontamination_filter(text: str, ngrams: frozenset, n: int = 13, max_pieces: int = 10) -> FilterResult:
    """:func:`decontaminate` as a filter: removed (``decontamination:too_many_pieces``) when split into more
    than ``max_pieces`` pieces or when nothing is left (``decontamination:nothing_left``); otherwise kept
    with the contaminated spans cut.

    Book: Pretraining data, "Decontamination"
    """
    result = decontaminate(text, ngrams, n, max_pieces=max_pieces)
    if result.pieces > max_pieces:
        return FilterResult(False, ("decontamination:too_many_pieces",), result.text)
    if not result.text:
        return FilterResult(False, ("decontamination:nothing_left",), result.text)
    return FilterResult(True, (), result.text)
