"""Quality filters: C4's line and page rules (Raffel et al. 2020, section 2.2) and Gopher's quality and
repetition heuristics (Rae et al. 2021, appendix A, "MassiveWeb").

Book: Pretraining data, "Quality filters".

Every filter returns a :class:`FilterResult`: ``keep``, the ``reasons`` a document was removed (empty when it
is kept; each a short ``"filter:rule"`` string, e.g. ``"gopher:stop_words"``) and the ``text`` to pass on
(C4 removes lines, so its text may be shorter). A pipeline records the reasons so nothing is lost silently.

C4 (as in the paper and TFDS's ``c4_utils.clean_page``, the code that built the data set). Each line is
stripped; then, in this order:
  a line with a word longer than 1000 characters is dropped; citation markers ``[1]``, ``[edit]``,
  ``[citation needed]`` are removed (and the line stripped again: TFDS does not, so there a line ending in
  ``"... baked! [1]"`` fails the next rule); a line that does not end in ``. ! ? "`` or that ends in ``...`` is
  dropped; a line with fewer than ``min_words_per_line`` (5) whitespace-separated words is dropped; a
  surviving line that contains "lorem ipsum" removes the page; a line that contains "javascript" is dropped;
  a surviving line that contains ``{`` removes the page; a line with a policy phrase ("terms of use",
  "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies") is dropped; a surviving
  line with a bad word removes the page. A page with fewer than ``min_sentences`` (3) sentences in its kept
  lines is removed. The arXiv text of the paper (v4) and the TFDS code agree on 3 sentences and 5 words;
  the JMLR print says 5 sentences and 3 words. TFDS counts sentences with NLTK's Punkt model; we count
  sentence ends (``. ! ?`` runs, optionally followed by closing quotes or brackets, before whitespace or the
  end). C4 used the "List of Dirty, Naughty, Obscene or Otherwise Bad Words" (LDNOOBW, about 400 English
  entries); we do not ship it: pass your list as ``bad_words`` (default: none).

Gopher (Rae et al. 2021, appendix A.1.1): a document is removed when it has fewer than 50 or more than
100,000 words; a mean word length outside 3-10 characters; a symbol-to-word ratio above 0.1 for the hash
``#`` or the ellipsis (``...`` or ``…``); more than 90% of its lines starting with a bullet; more than 30% of
its lines ending with an ellipsis; fewer than 80% of its words containing an alphabetic character; fewer than
2 of the stop words "the, be, to, of, and, that, have, with". Repetition (Table A1): more than 30% duplicate
lines or paragraphs, more than 20% of the characters in duplicate lines or paragraphs, the most frequent word
2-, 3-, 4-gram covering more than 20%, 18%, 16% of the characters, or the duplicate word 5- to 10-grams
covering more than 15%, 14%, 13%, 12%, 11%, 10% of them.

Other languages (:mod:`.languages`): every filter takes ``language`` (default ``"en"``), which sets what a
word is, the stop words and the sentence and line ends; an unknown language is a ``ValueError``. C4's
terminal-punctuation rule can be turned off (``terminal_punctuation=False``), as FineWeb did (Penedo et al.
2024): it drops every line without an end mark, code and list items included.

Our reading of what the appendix leaves open: words are whitespace-separated; word length is counted on
words that contain a letter or digit, with surrounding punctuation stripped; stop words are matched on the
lower-cased words stripped of punctuation (``"The,"`` counts as "the"); bullets are ``• ‣ ▪ ◦ - * –``;
paragraphs are separated by blank lines; a "duplicate" line or paragraph is every occurrence after the first
of the same (stripped) text; the characters of an n-gram are the characters of its words (spaces excluded),
and a character covered by several occurrences or n-grams counts once.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from llmarch._checks import check_int, check_text

from .languages import LANGUAGE_RULES, language_rules, language_words

__all__ = [
    "FilterResult",
    "C4_POLICY_PHRASES",
    "c4_line_filter",
    "c4_filter",
    "count_sentences",
    "GOPHER_STOP_WORDS",
    "gopher_statistics",
    "gopher_quality_filter",
    "GOPHER_REPETITION_THRESHOLDS",
    "gopher_repetition_statistics",
    "gopher_repetition_filter",
]


@dataclass(frozen=True)
class FilterResult:
    """The decision of one filter: ``keep``; ``reasons`` (why it was removed, empty when kept); ``text`` (the
    text to pass on, possibly cleaned).

    Book: Pretraining data, "Quality filters"
    """

    keep: bool
    reasons: tuple[str, ...]
    text: str

    @property
    def reason(self) -> str | None:
        """The first reason, or ``None`` when kept."""
        return self.reasons[0] if self.reasons else None


# ---------------------------------------------------------------------------------------------------------
# C4
# ---------------------------------------------------------------------------------------------------------

C4_POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
"""Lines containing one of these (lower-cased) are boilerplate notices (Raffel et al. 2020, section 2.2)."""

_C4_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
_C4_MAX_WORD_LENGTH = 1000


def count_sentences(text: str, language: str = "en") -> int:
    """Number of sentence ends in ``text``: runs of ``. ! ?``, optionally followed by closing quotes or
    brackets, before whitespace or the end of the text (a stand-in for NLTK's Punkt that C4 used; it also
    counts abbreviations such as "Dr." as ends); in ``ja`` and ``zh``, runs of ``。 ！ ？``.

    Book: Pretraining data, "Quality filters"
    """
    check_text("text", text)
    return len(language_rules(language).sentence_end.findall(text))


def _bad_word_pattern(bad_words: Iterable[str]) -> re.Pattern | None:
    words = sorted({w.lower() for w in bad_words}, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?<![a-z])(?:" + "|".join(map(re.escape, words)) + r")(?![a-z])")


def _c4_line(line: str, min_words_per_line: int, bad: re.Pattern | None, language: str,
             terminal_punctuation: bool) -> FilterResult:
    line = line.strip()
    if any(len(word) > _C4_MAX_WORD_LENGTH for word in line.split()):
        return FilterResult(False, ("c4:word_too_long",), line)
    line = _C4_CITATION.sub("", line).strip()
    if terminal_punctuation and (not line.endswith(LANGUAGE_RULES[language].line_ends) or line.endswith("...")):
        return FilterResult(False, ("c4:no_terminal_punctuation",), line)
    if len(language_words(line, language)) < min_words_per_line:
        return FilterResult(False, ("c4:too_few_words",), line)
    lower = line.lower()
    if "lorem ipsum" in lower:
        return FilterResult(False, ("c4:lorem_ipsum",), line)
    if "javascript" in lower:
        return FilterResult(False, ("c4:javascript",), line)
    if "{" in line:
        return FilterResult(False, ("c4:curly_bracket",), line)
    if any(p in lower for p in C4_POLICY_PHRASES):
        return FilterResult(False, ("c4:policy",), line)
    if bad is not None and bad.search(lower):
        return FilterResult(False, ("c4:bad_word",), line)
    return FilterResult(True, (), line)


_C4_PAGE_RULES = ("c4:lorem_ipsum", "c4:curly_bracket", "c4:bad_word")


def c4_line_filter(line: str, min_words_per_line: int = 5, bad_words: Iterable[str] = (), language: str = "en",
                   terminal_punctuation: bool = True) -> FilterResult:
    """C4's rules for one line, in TFDS's order (module docstring): ``text`` is the stripped line without
    citation markers; ``reasons`` is one of ``c4:word_too_long``, ``c4:no_terminal_punctuation``,
    ``c4:too_few_words``, ``c4:javascript``, ``c4:policy`` (the line is dropped) or ``c4:lorem_ipsum``,
    ``c4:curly_bracket``, ``c4:bad_word`` (the whole page is removed).

    ``c4_line_filter("Enable JavaScript to view this site.").reasons == ("c4:javascript",)``

    Book: Pretraining data, "Quality filters"
    """
    check_text("line", line)
    if "\n" in line.strip():
        raise ValueError("line contains a line break; pass one line (or use c4_filter for a page)")
    check_int("min_words_per_line", min_words_per_line)
    language_rules(language)
    return _c4_line(line, min_words_per_line, _bad_word_pattern(bad_words), language, terminal_punctuation)


def c4_filter(
    text: str, min_words_per_line: int = 5, min_sentences: int = 3, bad_words: Iterable[str] = (),
    language: str = "en", terminal_punctuation: bool = True,
) -> FilterResult:
    """C4's page cleaning: drop lines by :func:`c4_line_filter`, remove the page for a page-level rule
    (``c4:lorem_ipsum``, ``c4:curly_bracket``, ``c4:bad_word``) or when the kept lines have fewer than
    ``min_sentences`` sentences (``c4:too_few_sentences``). ``text`` is the kept lines joined by newlines.
    ``terminal_punctuation=False`` is FineWeb's variant, without the terminal-punctuation rule.

    Book: Pretraining data, "Quality filters"
    """
    check_text("text", text)
    check_int("min_words_per_line", min_words_per_line)
    check_int("min_sentences", min_sentences)
    language_rules(language)
    bad = _bad_word_pattern(bad_words)
    kept = []
    for line in text.splitlines():
        result = _c4_line(line, min_words_per_line, bad, language, terminal_punctuation)
        if result.reason in _C4_PAGE_RULES:
            return FilterResult(False, result.reasons, "")
        if result.keep:
            kept.append(result.text)
    cleaned = "\n".join(kept)
    if sum(count_sentences(line, language) for line in kept) < min_sentences:
        return FilterResult(False, ("c4:too_few_sentences",), cleaned)
    return FilterResult(True, (), cleaned)


# ---------------------------------------------------------------------------------------------------------
# Gopher
# ---------------------------------------------------------------------------------------------------------

GOPHER_STOP_WORDS = LANGUAGE_RULES["en"].stop_words
"""A document needs at least two of these (Rae et al. 2021, appendix A.1.1): the, be, to, of, and, that,
have, with."""

_BULLETS = ("•", "‣", "▪", "◦", "-", "*", "–")
_ELLIPSES = ("...", "…")
_PUNCT_EDGES = re.compile(r"^[\W_]+|[\W_]+$")


def gopher_statistics(text: str, language: str = "en") -> dict[str, float]:
    """The quantities Gopher's quality filter thresholds: ``words``, ``mean_word_length``,
    ``hash_ratio``, ``ellipsis_ratio`` (symbols per word), ``bullet_lines``, ``ellipsis_lines`` (fractions of
    non-empty lines), ``alphabetic_words`` (fraction of words with a letter), ``stop_words`` (how many distinct
    stop words of ``language`` occur).

    Book: Pretraining data, "Quality filters"
    """
    check_text("text", text)
    rules = language_rules(language)
    tokens = language_words(text, language)
    n = len(tokens)
    stripped = [_PUNCT_EDGES.sub("", t) for t in tokens]
    lengths = [len(s) for s in stripped if s]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return {
        "words": n,
        "mean_word_length": sum(lengths) / len(lengths) if lengths else 0.0,
        "hash_ratio": text.count("#") / n if n else 0.0,
        "ellipsis_ratio": (text.count("...") + text.count("…")) / n if n else 0.0,
        "bullet_lines": sum(line.startswith(_BULLETS) for line in lines) / len(lines) if lines else 0.0,
        "ellipsis_lines": sum(line.endswith(_ELLIPSES) for line in lines) / len(lines) if lines else 0.0,
        "alphabetic_words": sum(any(c.isalpha() for c in t) for t in tokens) / n if n else 0.0,
        "stop_words": len(rules.stop_words & {s.lower() for s in stripped}),
    }


def gopher_quality_filter(
    text: str,
    min_words: int = 50,
    max_words: int = 100_000,
    min_mean_word_length: float = 3.0,
    max_mean_word_length: float = 10.0,
    max_symbol_ratio: float = 0.1,
    max_bullet_lines: float = 0.9,
    max_ellipsis_lines: float = 0.3,
    min_alphabetic_words: float = 0.8,
    min_stop_words: int = 2,
    language: str = "en",
) -> FilterResult:
    """Gopher's quality heuristics (Rae et al. 2021, appendix A.1.1; defaults are the paper's). ``reasons``
    lists every failed rule: ``gopher:word_count``, ``gopher:mean_word_length``, ``gopher:hash_ratio``,
    ``gopher:ellipsis_ratio``, ``gopher:bullet_lines``, ``gopher:ellipsis_lines``,
    ``gopher:alphabetic_words``, ``gopher:stop_words``. Words are counted in ``language``; in ``ja`` and
    ``zh`` (a word is a character) the mean-word-length rule is not applied.

    Book: Pretraining data, "Quality filters"
    """
    s = gopher_statistics(text, language)
    spaced = LANGUAGE_RULES[language].spaced
    checks = [
        ("gopher:word_count", not min_words <= s["words"] <= max_words),
        ("gopher:mean_word_length",
         spaced and not min_mean_word_length <= s["mean_word_length"] <= max_mean_word_length),
        ("gopher:hash_ratio", s["hash_ratio"] > max_symbol_ratio),
        ("gopher:ellipsis_ratio", s["ellipsis_ratio"] > max_symbol_ratio),
        ("gopher:bullet_lines", s["bullet_lines"] > max_bullet_lines),
        ("gopher:ellipsis_lines", s["ellipsis_lines"] > max_ellipsis_lines),
        ("gopher:alphabetic_words", s["alphabetic_words"] < min_alphabetic_words),
        ("gopher:stop_words", s["stop_words"] < min_stop_words),
    ]
    reasons = tuple(name for name, failed in checks if failed)
    return FilterResult(not reasons, reasons, text)


GOPHER_REPETITION_THRESHOLDS = {
    "duplicate_lines": 0.30,
    "duplicate_paragraphs": 0.30,
    "duplicate_line_chars": 0.20,
    "duplicate_paragraph_chars": 0.20,
    "top_2gram_chars": 0.20,
    "top_3gram_chars": 0.18,
    "top_4gram_chars": 0.16,
    "duplicate_5gram_chars": 0.15,
    "duplicate_6gram_chars": 0.14,
    "duplicate_7gram_chars": 0.13,
    "duplicate_8gram_chars": 0.12,
    "duplicate_9gram_chars": 0.11,
    "duplicate_10gram_chars": 0.10,
}
"""Rae et al. (2021), Table A1: a document is removed when a statistic exceeds its threshold."""


def _duplicate_fractions(pieces: list[str]) -> tuple[float, float]:
    """(fraction of pieces that repeat an earlier one, fraction of their characters)."""
    if not pieces:
        return 0.0, 0.0
    seen, dup, dup_chars = set(), 0, 0
    for p in pieces:
        if p in seen:
            dup += 1
            dup_chars += len(p)
        seen.add(p)
    total_chars = sum(len(p) for p in pieces)
    return dup / len(pieces), dup_chars / total_chars if total_chars else 0.0


def _covered_chars(word_lengths: list[int], starts: Iterable[int], n: int) -> int:
    covered = [False] * len(word_lengths)
    for s in starts:
        covered[s : s + n] = [True] * n
    return sum(length for length, c in zip(word_lengths, covered) if c)


def gopher_repetition_statistics(text: str, language: str = "en") -> dict[str, float]:
    """The statistics of Gopher's repetition filter (keys of :data:`GOPHER_REPETITION_THRESHOLDS`), each a
    fraction in ``[0, 1]`` (reading of the module docstring), on the words of ``language``.

    Book: Pretraining data, "Quality filters"
    """
    check_text("text", text)
    language_rules(language)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    stats = {}
    stats["duplicate_lines"], stats["duplicate_line_chars"] = _duplicate_fractions(lines)
    stats["duplicate_paragraphs"], stats["duplicate_paragraph_chars"] = _duplicate_fractions(paragraphs)
    tokens = language_words(text, language)
    lengths = [len(t) for t in tokens]
    total = sum(lengths)
    for n in range(2, 11):
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        counts = Counter(grams)
        if n <= 4:
            key = f"top_{n}gram_chars"
            if not counts or counts.most_common(1)[0][1] < 2:
                stats[key] = 0.0
                continue
            top_count = counts.most_common(1)[0][1]
            top = min(g for g, c in counts.items() if c == top_count)  # ties: the lexicographically first
            starts = [i for i, g in enumerate(grams) if g == top]
        else:
            key = f"duplicate_{n}gram_chars"
            starts = [i for i, g in enumerate(grams) if counts[g] > 1]
        stats[key] = _covered_chars(lengths, starts, n) / total if total else 0.0
    return stats


def gopher_repetition_filter(text: str, thresholds: dict[str, float] | None = None,
                             language: str = "en") -> FilterResult:
    """Gopher's repetition filter (Rae et al. 2021, Table A1): ``reasons`` lists ``"gopher:<statistic>"`` for
    every statistic above its threshold (default :data:`GOPHER_REPETITION_THRESHOLDS`).

    Book: Pretraining data, "Quality filters"
    """
    limits = dict(GOPHER_REPETITION_THRESHOLDS)
    if thresholds is not None:
        unknown = set(thresholds) - set(limits)
        if unknown:
            raise ValueError(f"unknown repetition statistics {sorted(unknown)}; known: {sorted(limits)}")
        limits.update(thresholds)
    stats = gopher_repetition_statistics(text, language)
    reasons = tuple(f"gopher:{key}" for key, limit in limits.items() if stats[key] > limit)
    return FilterResult(not reasons, reasons, text)
