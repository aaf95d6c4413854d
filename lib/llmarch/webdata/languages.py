"""Per-language rules of the quality filters: what a word is, the stop words Gopher's rule counts, and the
marks that end a sentence or a line for C4's rules.

Book: Pretraining data, "Quality filters beyond English".

Gopher (Rae et al. 2021) and C4 (Raffel et al. 2020) wrote their rules for English: words are separated by
spaces, eight English stop words must occur, a line must end in ``. ! ? "``. Applied as they are to German
or Japanese text, they remove it for being German or Japanese. Datatrove (the library behind FineWeb) gives
each language its own word tokenizer; here, more simply:

- in ``en``, ``de``, ``fr``, ``es`` a word is a whitespace-separated token, as in Gopher;
- in ``ja`` and ``zh``, which do not separate words by spaces, every CJK character (Han, kana, and the
  full-width marks) is a word of its own and any other run of non-space characters is one word: word
  counts are character counts there, and Gopher's mean-word-length rule (3 to 10 characters) does not
  apply (a character is not a word; the rule would remove every page);
- stop words: eight very frequent function words per language (Gopher's own eight for English; for the
  others, articles, prepositions, conjunctions, particles and copulas of the language), of which a page
  needs two;
- sentence ends: ``. ! ?`` in the European languages, ``。 ！ ？`` in Japanese and Chinese; a C4 line may
  also end in the closing quotation marks of the language.

A language missing here has no rule: the pipeline refuses it (``--languages``) rather than filter it with
English rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LanguageRules", "LANGUAGE_RULES", "language_rules", "language_words"]


@dataclass(frozen=True)
class LanguageRules:
    """The rules of one language: ``stop_words``; ``spaced`` (words are separated by whitespace);
    ``sentence_end`` (a regex matching one sentence end); ``line_ends`` (the characters a line may end with
    under C4's terminal-punctuation rule).

    Book: Pretraining data, "Quality filters beyond English"
    """

    stop_words: frozenset[str]
    spaced: bool
    sentence_end: re.Pattern
    line_ends: tuple[str, ...]


_EUROPEAN_END = re.compile(r"[.!?]+[\"'”’»)\]]*(?=\s|$)")
_CJK_END = re.compile(r"[。！？!?]+[」』”）)]*")

LANGUAGE_RULES = {
    "en": LanguageRules(frozenset("the be to of and that have with".split()), True, _EUROPEAN_END,
                        (".", "!", "?", '"')),
    "de": LanguageRules(frozenset("der die das und zu von mit ist".split()), True, _EUROPEAN_END,
                        (".", "!", "?", '"', "“", "«")),
    "fr": LanguageRules(frozenset("le la les de et à un est".split()), True, _EUROPEAN_END,
                        (".", "!", "?", '"', "»")),
    "es": LanguageRules(frozenset("el la de que y en los es".split()), True, _EUROPEAN_END,
                        (".", "!", "?", '"', "»")),
    "ja": LanguageRules(frozenset("のにはをがでとた"), False, _CJK_END, ("。", "！", "？", "」", "』")),
    "zh": LanguageRules(frozenset("的是了在和有我不"), False, _CJK_END, ("。", "！", "？", "”", "」")),
}
"""The languages the quality filters have rules for (module docstring)."""

_CJK_OR_RUN = re.compile(r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]|"
                         r"[^\s\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]+")


def language_rules(language: str) -> LanguageRules:
    """The rules of ``language`` (an ISO 639-1 code), or a ``ValueError`` naming the languages that have
    rules.

    Book: Pretraining data, "Quality filters beyond English"
    """
    if language not in LANGUAGE_RULES:
        raise ValueError(f"no quality-filter rules (Gopher stop words, C4 sentence ends) for language "
                         f"{language!r}; languages with rules: {', '.join(sorted(LANGUAGE_RULES))}")
    return LANGUAGE_RULES[language]


def language_words(text: str, language: str = "en") -> list[str]:
    """The words of ``text`` in ``language``: whitespace-separated tokens, or for ``ja``/``zh`` each CJK
    character and each run of other non-space characters.

    ``language_words("東京は sunny です", "ja") == ["東", "京", "は", "sunny", "で", "す"]``.

    Book: Pretraining data, "Quality filters beyond English"
    """
    if language_rules(language).spaced:
        return text.split()
    return _CJK_OR_RUN.findall(text)
