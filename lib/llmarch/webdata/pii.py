"""Personal information: e-mail addresses, phone numbers and IPv4 addresses found by regular expressions and
replaced by ``<EMAIL>``, ``<PHONE>`` and ``<IP_ADDRESS>``.

Book: Pretraining data, "Personal information".

What counts (and what does not):
- **E-mail**: ``local@domain.tld``, the local part of letters, digits and ``. _ % + -``, the domain of one or
  more dot-separated labels and a top-level domain of two or more letters. Obfuscated forms
  (``jane [at] example [dot] org``) are not found.
- **IPv4**: four dot-separated decimal octets 0-255 without leading zeros, not part of a longer dotted
  number (so the version ``3.11.2`` and ``1.2.3.4.5`` stay, but a four-part version such as ``2.0.1.3`` is
  taken for an address).
- **Phone**: (a) international numbers starting with ``+`` and a country code, 8 to 15 digits in all
  (E.164's maximum), in groups separated by a space, dot or hyphen, with an optional parenthesised area
  code (``+1 (555) 014-2233``, ``+49 (0)30 1234567``);
  (b) North American numbers ``(555) 123-4567``, ``555-123-4567``, ``555.123.4567``, ``555 123 4567``
  (the same separator twice), optionally after ``1-`` or ``1 ``; (c) national numbers with a trunk prefix 0
  in at least two groups, 9 to 12 digits (``020 7946 0958``, ``030 1234567``, ``01 23 45 67 89``).
  Seven-digit local numbers (``555-0199``) are not found: too many ordinary numbers look the same.
- Ordinary numbers stay: years, prices, counts with thousands separators, dates, times, versions, ISBNs,
  postcodes.

:data:`llmarch.webdata.pii_examples.PII_EXAMPLES` is a labelled set; :func:`pii_scores` measures precision and
recall on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from llmarch._checks import check_text

__all__ = ["PII_PLACEHOLDERS", "PIISpan", "find_pii", "redact_pii", "pii_scores"]

PII_PLACEHOLDERS = {"EMAIL": "<EMAIL>", "PHONE": "<PHONE>", "IP_ADDRESS": "<IP_ADDRESS>"}
"""The replacement of each kind of personal information."""

_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+'-]*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}(?![\w-])"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)")
_PHONE_PATTERNS = (
    # international: +CC then groups, optional (area) group
    re.compile(r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(\d{1,4}\)[ .-]?\d{1,10})?(?:[ .-]\d{1,10}){0,5}+(?![\w]|[.-]\d)"),
    # North American: (555) 123-4567 or 555-123-4567 with one separator kind, optional leading 1
    re.compile(r"(?<![\w+.-])(?:1[ -])?\(\d{3}\) ?\d{3}[ .-]\d{4}(?![\w]|[.-]\d)"),
    re.compile(r"(?<![\w+.-])(?:1[ -])?\d{3}([ .-])\d{3}\1\d{4}(?![\w]|[.-]\d)"),
    # national with trunk prefix 0
    re.compile(r"(?<![\w+.-])(?:\(0\d{1,4}\)|0\d{1,4})(?:[ .-]\d{2,8}){1,4}+(?![\w]|[.-]\d)"),
)
_PHONE_DIGITS = {0: (8, 15), 1: (10, 11), 2: (10, 11), 3: (9, 12)}


class PIISpan(NamedTuple):
    """A piece of personal information: ``text[start:end]`` of the given ``kind`` (a key of
    :data:`PII_PLACEHOLDERS`)."""

    start: int
    end: int
    kind: str


def find_pii(text: str) -> list[PIISpan]:
    """The e-mail addresses, IPv4 addresses and phone numbers of ``text``, sorted, not overlapping.

    Matches are taken in the order e-mail, IPv4, phone; a later match that overlaps an earlier one is dropped
    (the digits of an address are not a phone number).

    Book: Pretraining data, "Personal information"
    """
    check_text("text", text)
    found: list[PIISpan] = []

    def claim(start: int, end: int, kind: str) -> None:
        if all(end <= s.start or start >= s.end for s in found):
            found.append(PIISpan(start, end, kind))

    for m in _EMAIL.finditer(text):
        claim(m.start(), m.end(), "EMAIL")
    for m in _IPV4.finditer(text):
        claim(m.start(), m.end(), "IP_ADDRESS")
    for index, pattern in enumerate(_PHONE_PATTERNS):
        low, high = _PHONE_DIGITS[index]
        for m in pattern.finditer(text):
            digits = sum(c.isdigit() for c in m.group())
            if low <= digits <= high:
                claim(m.start(), m.end(), "PHONE")
    return sorted(found)


def redact_pii(text: str) -> str:
    """``text`` with each e-mail address, phone number and IPv4 address replaced by ``<EMAIL>``, ``<PHONE>``
    or ``<IP_ADDRESS>`` (see the module docstring for what is found); everything else is unchanged.

    ``redact_pii("Mail ann@example.org or call +44 20 7946 0958 (since 1998).") ==
    "Mail <EMAIL> or call <PHONE> (since 1998)."``

    Book: Pretraining data, "Personal information"
    """
    pieces, last = [], 0
    for span in find_pii(text):
        pieces.extend([text[last : span.start], PII_PLACEHOLDERS[span.kind]])
        last = span.end
    pieces.append(text[last:])
    return "".join(pieces)


def pii_scores(examples: Iterable[tuple[str, list[tuple[str, str]]]]) -> dict[str, dict[str, float]]:
    """Span-level precision and recall of :func:`find_pii` on labelled examples.

    ``examples``: pairs ``(text, [(kind, substring), ...])`` listing the true pieces of personal information
    in order of appearance (a substring that occurs twice is listed twice). A found span is correct when a
    true span has the same kind, start and end. Returns ``{kind or "all": {"precision", "recall", "tp",
    "fp", "fn"}}``; precision is 1 when nothing is found and recall is 1 when nothing is to be found.

    Book: Pretraining data, "Personal information"
    """
    counts = {kind: [0, 0, 0] for kind in [*PII_PLACEHOLDERS, "all"]}  # tp, fp, fn
    for text, labels in examples:
        truth, cursor = set(), {}
        for kind, piece in labels:
            if kind not in PII_PLACEHOLDERS:
                raise ValueError(f"unknown kind {kind!r} in the labels of {text!r}")
            start = text.find(piece, cursor.get(piece, 0))
            if start < 0:
                raise ValueError(f"{piece!r} is not in {text!r} (after the previous occurrence)")
            cursor[piece] = start + len(piece)
            truth.add(PIISpan(start, start + len(piece), kind))
        found = set(find_pii(text))
        for kind in PII_PLACEHOLDERS:
            t = {s for s in truth if s.kind == kind}
            f = {s for s in found if s.kind == kind}
            for key in (kind, "all"):
                counts[key][0] += len(t & f)
                counts[key][1] += len(f - t)
                counts[key][2] += len(t - f)
    return {
        key: {
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
            "tp": tp,
            "fp": fp,
            "fn": fn,
        }
        for key, (tp, fp, fn) in counts.items()
    }
