"""Language identification with ``py3langid``, a fork of Lui & Baldwin (2012)'s langid.py: a naive Bayes
model over byte n-grams (140 labels in the installed version) that ships inside the package, so nothing is
downloaded.

Book: Pretraining data, "Language identification".

Scores are probabilities over the model's languages (``norm_probs=True``: a softmax of the naive Bayes
log-scores, which py3langid tempers by the square root of the text's length in bytes so that long texts are
not all given probability 1). They are comparable across texts of one model, not with fastText's scores:
CCNet keeps a document whose fastText score is at least 0.5, FineWeb at least 0.65; calibrate the threshold
on labelled text (the synthetic crawl) before using either number here.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from llmarch._checks import check_text

from .quality import FilterResult

__all__ = ["identify_language", "language_decision", "language_filter"]


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify_language(text: str) -> tuple[str, float]:
    """``(language, probability)``: the most probable ISO 639-1 code of ``text`` and its probability.

    A text without a letter (empty, digits, punctuation) gets ``("und", 0.0)``: undetermined.

    Book: Pretraining data, "Language identification"
    """
    check_text("text", text)
    if not any(c.isalpha() for c in text):
        return "und", 0.0
    lang, prob = _identifier().classify(text)
    return str(lang), float(prob)


def language_decision(language: str, probability: float, languages: Iterable[str] = ("en",),
                      min_probability: float = 0.5) -> FilterResult:
    """The language filter's decision for a text identified as ``(language, probability)``: kept when
    ``language`` is one of ``languages`` with ``probability >= min_probability``; reasons
    ``language:<code>`` (another language) or ``language:low_confidence``. ``text`` of the result is empty.

    Book: Pretraining data, "Language identification"
    """
    wanted = {languages} if isinstance(languages, str) else set(languages)
    if not wanted:
        raise ValueError("languages must name at least one language")
    if not 0.0 <= min_probability <= 1.0:
        raise ValueError(f"min_probability must lie in [0, 1], got {min_probability!r}")
    if language not in wanted:
        return FilterResult(False, (f"language:{language}",), "")
    if probability < min_probability:
        return FilterResult(False, ("language:low_confidence",), "")
    return FilterResult(True, (), "")


def language_filter(text: str, languages: Iterable[str] = ("en",), min_probability: float = 0.5) -> FilterResult:
    """Keep ``text`` when its most probable language is one of ``languages`` with probability at least
    ``min_probability`` (:func:`language_decision` on :func:`identify_language`).

    Book: Pretraining data, "Language identification"
    """
    result = language_decision(*identify_language(text), languages, min_probability)
    return FilterResult(result.keep, result.reasons, text)
