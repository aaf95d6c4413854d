"""A CCNet-style perplexity filter (Wenzek et al. 2020): an n-gram language model trained on reference text
scores each document, and documents are bucketed by perplexity into head, middle and tail.

Book: Pretraining data, "Quality filters".

CCNet trains a 5-gram KenLM model (modified Kneser-Ney) on Wikipedia, per language, over SentencePiece
tokens, and cuts the perplexity distribution of each language at its 33rd and 66th percentiles. Here the
model is an interpolated Kneser-Ney n-gram model (Kneser & Ney 1995; Chen & Goodman 1999) with one absolute
discount ``D``, over characters (default) or lower-cased words, trained on whatever reference text the caller
has (the synthetic crawl's clean pages, the book's own prose):

    P_N(w | h) = max(c(h w) - D, 0) / c(h) + D * T(h) / c(h) * P_{N-1}(w | h'),

where ``h'`` drops the oldest token of ``h``, ``c`` counts n-grams, ``T(h)`` is the number of distinct tokens
seen after ``h``; lower orders replace ``c`` by continuation counts ``N1+(. h w)`` (the number of distinct
tokens seen before ``h w``); order 0 is uniform over the vocabulary (seen tokens, end of line and unknown).
An unseen context backs off entirely. Every ``P(. | h)`` sums to 1 over the vocabulary. Each non-empty line
is a sequence padded with ``N - 1`` start symbols and ended by an end symbol; a document's perplexity is
``exp(total negative log-likelihood / number of predicted tokens)``, lines weighted by their length, as
CCNet aggregates paragraph scores.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from llmarch._checks import check_text

from .quality import FilterResult

__all__ = [
    "NGramLanguageModel",
    "train_ngram_model",
    "perplexity_cutoffs",
    "perplexity_bucket",
    "perplexity_filter",
]

_BOS, _EOS, _UNK = "\x02<s>", "\x03</s>", "\x04<unk>"
_WORD_OR_SYMBOL = re.compile(r"\w+|[^\w\s]")


def _tokenize(line: str, unit: str) -> list[str]:
    return list(line) if unit == "char" else _WORD_OR_SYMBOL.findall(line.lower())


class NGramLanguageModel:
    """An interpolated Kneser-Ney n-gram model (module docstring); build it with :func:`train_ngram_model`.

    ``prob(token, context)`` is ``P(token | last order-1 tokens of context)``; ``perplexity(text)`` scores a
    document. Attributes: ``order``, ``discount``, ``unit`` (``"char"`` or ``"word"``), ``vocabulary``.

    Book: Pretraining data, "Quality filters"
    """

    def __init__(self, order: int, discount: float, unit: str, counts: list[dict], vocabulary: frozenset):
        self.order, self.discount, self.unit = order, discount, unit
        self.vocabulary = vocabulary  # predictable tokens: the seen ones, end of line and unknown
        self._counts = counts  # _counts[k][(context tuple of length k - 1)] = Counter of next tokens
        self._totals = [{h: sum(c.values()) for h, c in level.items()} for level in counts]

    def _map(self, token: str) -> str:
        return token if token in self.vocabulary or token == _BOS else _UNK

    def _prob(self, token: str, context: tuple) -> float:
        p = 1.0 / len(self.vocabulary)
        for k in range(1, self.order + 1):  # from unigrams up to the full order
            h = context[len(context) - (k - 1) :] if k > 1 else ()
            followers = self._counts[k - 1].get(h)
            if not followers:
                continue  # unseen context: keep the lower-order estimate
            total = self._totals[k - 1][h]
            d = self.discount
            p = max(followers.get(token, 0) - d, 0.0) / total + d * len(followers) / total * p
        return p

    def prob(self, token: str, context: Sequence[str] = ()) -> float:
        """``P(token | context)``: ``context`` is the preceding tokens (start symbols are added on the left);
        an unknown token is scored as the unknown symbol, the end of a line is ``token=None``.

        Book: Pretraining data, "Quality filters"
        """
        if isinstance(context, str) and self.unit == "word":
            raise ValueError("context must be a sequence of word tokens, not a str")
        mapped = [self._map(t) for t in context]
        ctx = tuple(([_BOS] * (self.order - 1) + mapped)[len(mapped) :])  # the last order - 1 tokens
        return self._prob(_EOS if token is None else self._map(token), ctx)

    def _line_nll(self, tokens: list[str]) -> float:
        padded = [_BOS] * (self.order - 1) + [self._map(t) for t in tokens] + [_EOS]
        nll = 0.0
        for i in range(self.order - 1, len(padded)):
            nll -= math.log(self._prob(padded[i], tuple(padded[i - self.order + 1 : i])))
        return nll

    def perplexity(self, text: str) -> float:
        """``exp(NLL / tokens)`` over the non-empty lines of ``text`` (each line's tokens and its end symbol).

        Book: Pretraining data, "Quality filters"
        """
        check_text("text", text)
        nll, count = 0.0, 0
        for line in text.splitlines():
            tokens = _tokenize(line.strip(), self.unit)
            if tokens:
                nll += self._line_nll(tokens)
                count += len(tokens) + 1
        if count == 0:
            raise ValueError("text has no tokens: its perplexity is undefined")
        return math.exp(nll / count)


def train_ngram_model(
    texts: Iterable[str], order: int = 5, discount: float = 0.75, unit: str = "char"
) -> NGramLanguageModel:
    """Train an interpolated Kneser-Ney model of the given ``order`` on the non-empty lines of ``texts``.

    ``unit``: ``"char"`` (characters, robust on a small reference text) or ``"word"`` (lower-cased words and
    punctuation marks). ``discount`` ``D`` in ``(0, 1]``; 0.75 is the usual single-discount choice.

    Book: Pretraining data, "Quality filters"
    """
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise ValueError(f"order must be a positive integer, got {order!r}")
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount must lie in (0, 1], got {discount!r}")
    if unit not in ("char", "word"):
        raise ValueError(f"unit must be 'char' or 'word', got {unit!r}")
    if isinstance(texts, str):
        raise ValueError("texts must be a collection of texts, not one str")
    highest: Counter = Counter()  # full-order n-grams (context + token)
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"texts must hold str, got {type(text).__name__}")
        for line in text.splitlines():
            tokens = _tokenize(line.strip(), unit)
            if tokens:
                padded = [_BOS] * (order - 1) + tokens + [_EOS]
                for i in range(order - 1, len(padded)):
                    highest[tuple(padded[i - order + 1 : i + 1])] += 1
    if not highest:
        raise ValueError("the reference texts have no tokens")
    # level k (k-grams, index k - 1): raw counts at the full order, continuation counts below
    grams: list[Counter] = [Counter() for _ in range(order)]
    grams[order - 1] = highest
    for k in range(order - 1, 0, -1):
        for gram in grams[k]:  # each distinct (k+1)-gram adds one left extension to its k-gram suffix
            grams[k - 1][gram[1:]] += 1
    counts = []
    for level in grams:
        by_context: dict[tuple, Counter] = defaultdict(Counter)
        for gram, c in level.items():
            by_context[gram[:-1]][gram[-1]] = c
        counts.append(dict(by_context))
    vocabulary = frozenset({g[-1] for g in highest} | {_EOS, _UNK})
    return NGramLanguageModel(order, float(discount), unit, counts, vocabulary)


def perplexity_cutoffs(perplexities, quantiles: Sequence[float] = (1 / 3, 2 / 3)) -> tuple[float, ...]:
    """The perplexities at the given quantiles of a sample: CCNet's head/middle/tail boundaries (its 33rd and
    66th percentiles, computed per language).

    Book: Pretraining data, "Quality filters"
    """
    values = np.asarray(perplexities, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"perplexities must be a non-empty 1-D array of finite values, got shape {values.shape}")
    q = np.asarray(quantiles, dtype=np.float64)
    if q.ndim != 1 or np.any((q <= 0) | (q >= 1)) or np.any(np.diff(q) <= 0):
        raise ValueError(f"quantiles must increase strictly within (0, 1), got {quantiles!r}")
    return tuple(float(v) for v in np.quantile(values, q))


def perplexity_bucket(perplexity: float, cutoffs: Sequence[float]) -> str:
    """``"head"`` (perplexity ``<= cutoffs[0]``: most like the reference), ``"middle"`` (``<= cutoffs[1]``)
    or ``"tail"``.

    Book: Pretraining data, "Quality filters"
    """
    if len(cutoffs) != 2 or not cutoffs[0] <= cutoffs[1]:
        raise ValueError(f"cutoffs must be two increasing values (head, middle), got {cutoffs!r}")
    if not math.isfinite(perplexity) or perplexity < 1:
        raise ValueError(f"perplexity must be a finite value >= 1, got {perplexity!r}")
    return "head" if perplexity <= cutoffs[0] else "middle" if perplexity <= cutoffs[1] else "tail"


def perplexity_filter(text: str, model: NGramLanguageModel, max_perplexity: float) -> FilterResult:
    """Keep ``text`` when its perplexity under ``model`` is at most ``max_perplexity`` (e.g. the middle/tail
    cutoff); reasons ``perplexity:too_high`` or ``perplexity:empty`` (no token to score).

    Book: Pretraining data, "Quality filters"
    """
    if not isinstance(model, NGramLanguageModel):
        raise ValueError(f"model must be an NGramLanguageModel, got {type(model).__name__}")
    if not max_perplexity >= 1:
        raise ValueError(f"max_perplexity must be >= 1, got {max_perplexity!r}")
    check_text("text", text)
    try:
        ppl = model.perplexity(text)
    except ValueError:
        return FilterResult(False, ("perplexity:empty",), text)
    if ppl > max_perplexity:
        return FilterResult(False, ("perplexity:too_high",), text)
    return FilterResult(True, (), text)
