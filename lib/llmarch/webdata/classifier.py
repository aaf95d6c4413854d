"""A model-based quality filter: logistic regression on hashed word n-grams, the fastText-style classifier
that GPT-3 (a logistic regression on HashingTF features of WebText and curated sources against Common
Crawl), DCLM (fastText, OpenHermes and ELI5 answers against RefinedWeb) and FineWeb-Edu (a regression head
on annotations by an LLM) put in front of their corpora.

Book: Pretraining data, "Quality classifiers".

Features: the lower-cased word (``\\w+``) unigrams and bigrams of a text, each hashed with CRC-32 into
``buckets`` slots (the hashing trick: no vocabulary, collisions tolerated), counted, and scaled to unit L2
norm so that long and short texts weigh alike. The model is ``P(reference | text) = sigmoid(w . f + c)``,
fitted by full-batch gradient descent with Adam on the mean logistic loss plus ``l2 / 2 |w|^2``. Positive
examples are reference text (what the corpus should look like), negatives crawl text; the filter keeps a
page whose score is at least ``threshold``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .quality import FilterResult

__all__ = ["hashed_features", "QualityClassifier", "train_quality_classifier", "precision_recall",
           "quality_classifier_filter"]

_WORD = re.compile(r"\w+")


def hashed_features(texts: Sequence[str], buckets: int = 1 << 18) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The feature matrix of ``texts`` in CSR form ``(indptr, indices, values)``: row ``i`` holds the
    L2-normalised counts of the CRC-32 buckets of the word unigrams and bigrams of ``texts[i]``.

    Book: Pretraining data, "Quality classifiers"
    """
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a sequence of strings")
    if buckets < 2:
        raise ValueError(f"buckets must be at least 2, got {buckets}")
    indptr, indices, values = [0], [], []
    for text in texts:
        words = _WORD.findall(text.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        slots = np.array([zlib.crc32(g.encode("utf-8")) % buckets for g in grams], dtype=np.int64)
        slot, count = np.unique(slots, return_counts=True)
        weight = count / np.sqrt((count.astype(np.float64) ** 2).sum()) if len(count) else count.astype(float)
        indices.append(slot)
        values.append(weight)
        indptr.append(indptr[-1] + len(slot))
    return (np.array(indptr), np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64),
            np.concatenate(values) if values else np.zeros(0))


def _scores(features, weights: np.ndarray, bias: float) -> np.ndarray:
    indptr, indices, values = features
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    logits = np.bincount(rows, weights=values * weights[indices], minlength=len(indptr) - 1) + bias
    return logits


@dataclass
class QualityClassifier:
    """A fitted classifier: ``weights`` (``(buckets,)``), ``bias``; :meth:`score` gives ``P(reference)``.

    Book: Pretraining data, "Quality classifiers"
    """

    weights: np.ndarray
    bias: float

    def score(self, texts: Sequence[str]) -> np.ndarray:
        """``P(reference | text)`` for each text, shape ``(len(texts),)``."""
        logits = _scores(hashed_features(texts, len(self.weights)), self.weights, self.bias)
        return 1.0 / (1.0 + np.exp(-logits))


def train_quality_classifier(reference: Sequence[str], crawl: Sequence[str], buckets: int = 1 << 18,
                             l2: float = 1e-4, steps: int = 300, lr: float = 0.05) -> QualityClassifier:
    """Fit the classifier on ``reference`` texts (label 1) against ``crawl`` texts (label 0), the two
    classes weighted equally; full-batch Adam for ``steps`` steps.

    Book: Pretraining data, "Quality classifiers"
    """
    if not reference or not crawl:
        raise ValueError("both reference and crawl need at least one text")
    texts = list(reference) + list(crawl)
    y = np.concatenate([np.ones(len(reference)), np.zeros(len(crawl))])
    sample = np.where(y == 1, 0.5 / len(reference), 0.5 / len(crawl))  # weights summing to 1
    indptr, indices, values = features = hashed_features(texts, buckets)
    rows = np.repeat(np.arange(len(texts)), np.diff(indptr))
    params = np.zeros(buckets + 1)
    m, v = np.zeros_like(params), np.zeros_like(params)
    for step in range(1, steps + 1):
        p = 1.0 / (1.0 + np.exp(-_scores(features, params[:-1], params[-1])))
        residual = sample * (p - y)  # gradient of the weighted logistic loss per text
        grad = np.empty_like(params)
        grad[:-1] = np.bincount(indices, weights=values * residual[rows], minlength=buckets) + l2 * params[:-1]
        grad[-1] = residual.sum()
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad ** 2
        params -= lr * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    return QualityClassifier(params[:-1].copy(), float(params[-1]))


def precision_recall(scores, labels, threshold: float) -> tuple[float, float]:
    """``(precision, recall)`` of the decision ``score >= threshold`` against boolean ``labels``
    (True: reference quality); precision is 1.0 when nothing is predicted positive.

    Book: Pretraining data, "Quality classifiers"
    """
    scores, labels = np.asarray(scores), np.asarray(labels, dtype=bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores and labels differ in shape: {scores.shape} vs {labels.shape}")
    predicted = scores >= threshold
    hits = int((predicted & labels).sum())
    return (hits / int(predicted.sum()) if predicted.any() else 1.0,
            hits / int(labels.sum()) if labels.any() else 1.0)


def quality_classifier_filter(text: str, model: QualityClassifier, threshold: float = 0.5) -> FilterResult:
    """Keep ``text`` when ``model`` scores it at least ``threshold``; reason ``quality_model:low_score``.

    Book: Pretraining data, "Quality classifiers"
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
    keep = bool(model.score([text])[0] >= threshold)
    return FilterResult(keep, () if keep else ("quality_model:low_score",), text)
