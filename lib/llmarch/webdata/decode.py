"""Turning an HTML payload into text: the charset a browser would use, then the main text (``trafilatura``).

Book: Pretraining data, "From a crawl to text".

:func:`detect_charset` follows the order of the WHATWG encoding-sniffing algorithm that browsers implement
(HTML Living Standard, section 13.2.3.2), with a detector where a browser would guess:

1. a byte-order mark (UTF-8, UTF-16 LE/BE) wins over everything, as in browsers;
2. the ``charset`` of the HTTP ``Content-Type``;
3. a ``<meta charset=...>`` or ``<meta http-equiv="Content-Type" content="...; charset=...">`` in the first
   1024 bytes, outside HTML comments (the prescan skips ``<!-- ... -->``, so a commented-out declaration
   does not count; a declared UTF-16 there means UTF-8: the bytes were readable as ASCII);
4. a detector: the payload if it is valid UTF-8 with at least one non-ASCII byte, otherwise
   ``charset-normalizer``'s best guess for a payload with non-ASCII bytes (UTF-16 and UTF-32 only when
   the payload has NUL bytes; a tie between its best guesses goes to windows-1252, the default of
   browsers in most locales: short Western texts fit several single-byte code pages equally well);
5. windows-1252, the default of browsers in most locales (pure ASCII decodes identically in it and UTF-8).

Labels are resolved with the WHATWG Encoding Standard's label table (the ``webencodings`` package): every
label browsers accept, case-insensitive, e.g. ``x-sjis`` and ``windows-31j`` mean Shift_JIS, ``latin1``,
``iso-8859-1`` and ``ascii`` mean windows-1252. Each encoding is decoded with the Python codec closest to
the WHATWG decoder: Shift_JIS with Microsoft's cp932, EUC-KR with cp949, GBK with GB18030 (its superset).
Two WHATWG encodings have no Python codec and their labels are ignored (detection goes on): ``replacement``
(labels such as ``iso-2022-kr``, kept out of the web on purpose) and ``x-user-defined``. Undecodable bytes
become U+FFFD (Python's cp1252 leaves 0x81, 0x8D, 0x8F, 0x90 and 0x9D undefined, which browsers map to C1
controls).

:func:`html_to_text` calls ``trafilatura.extract`` without comments and tables, and without trafilatura's
own (stateful, cross-document) deduplication: deduplication is a later stage of the pipeline, and each page
is extracted independently of the others, so the result does not depend on the order or the partition.
"""

from __future__ import annotations

import codecs
import re

import trafilatura
import webencodings

__all__ = ["CHARSET_SOURCES", "is_html", "detect_charset", "decode_payload", "decode_html", "html_to_text",
           "extract_text"]

CHARSET_SOURCES = ("bom", "http", "meta", "detector", "default")
"""Where :func:`detect_charset` found a page's charset, in the order it looks."""

_CHARSET = re.compile(r"charset\s*=\s*[\"']?([\w.:-]+)", re.IGNORECASE)
_META = re.compile(rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([\w.:-]+)", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_PYTHON_CODEC = {"gbk": "gb18030", "replacement": None, "x-user-defined": None}
_PRESCAN_BYTES = 1024


def is_html(content_type: str) -> bool:
    """Whether a ``Content-Type`` names an HTML (or XHTML) document.

    Book: Pretraining data, "From a crawl to text"
    """
    media = content_type.split(";")[0].strip().lower()
    return media in ("text/html", "application/xhtml+xml")


def _codec(label: str | None) -> str | None:
    """Python's codec for a charset label, resolved by the WHATWG label table; ``None`` when unknown."""
    if not label:
        return None
    encoding = webencodings.lookup(label.strip().strip("\"'"))
    if encoding is None:
        return None
    if encoding.name in _PYTHON_CODEC:
        return _PYTHON_CODEC[encoding.name]
    return codecs.lookup(encoding.codec_info.name).name


def _without_comments(head: bytes) -> bytes:
    """``head`` with its HTML comments removed as the WHATWG prescan skips them: from ``<!--`` to the first
    ``-->`` after the ``<!`` (so ``<!-->`` is a whole comment); an unclosed comment runs to the end."""
    out, position = [], 0
    while (start := head.find(b"<!--", position)) >= 0:
        out.append(head[position:start])
        end = head.find(b"-->", start + 2)
        if end < 0:
            return b"".join(out)
        position = end + 3
    out.append(head[position:])
    return b"".join(out)


def detect_charset(payload: bytes, content_type: str = "") -> tuple[str, str]:
    """``(codec, source)``: the Python codec to decode ``payload`` with, and where it came from (one of
    :data:`CHARSET_SOURCES`), in the order of the module docstring.

    ``detect_charset(b'<meta charset="windows-1251">...')  == ("cp1251", "meta")``.

    Book: Pretraining data, "From a crawl to text"
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise ValueError(f"payload must be bytes, got {type(payload).__name__}")
    payload = bytes(payload)
    for bom, name in _BOMS:
        if payload.startswith(bom):
            return name, "bom"
    match = _CHARSET.search(content_type or "")
    codec = _codec(match.group(1)) if match else None
    if codec:
        return codec, "http"
    match = _META.search(_without_comments(payload[:_PRESCAN_BYTES]))
    codec = _codec(match.group(1).decode("ascii", "replace")) if match else None
    if codec:
        return ("utf-8" if codec.startswith("utf-16") else codec), "meta"
    if not payload.isascii():
        try:
            payload.decode("utf-8")
            return "utf-8", "detector"
        except UnicodeDecodeError:
            from charset_normalizer import from_bytes

            nul = b"\x00" in payload  # UTF-16/32 without a BOM: HTML in them is full of NUL bytes
            # the detector names Python codecs (cp932, ...), not WHATWG labels: Python resolves them
            guesses = [(g, codecs.lookup(g.encoding).name) for g in from_bytes(payload)]
            guesses = [(g, c) for g, c in guesses if c and (nul or not c.startswith(("utf-16", "utf-32")))]
            if guesses:
                best = guesses[0][0]
                tied = [g for g, _ in guesses if (g.chaos, g.coherence) == (best.chaos, best.coherence)]
                if any("cp1252" in g.could_be_from_charset for g in tied):
                    return "cp1252", "detector"
                return guesses[0][1], "detector"
    return "cp1252", "default"


def decode_payload(payload: bytes, content_type: str = "") -> tuple[str, str, str]:
    """``(text, codec, source)``: ``payload`` decoded with :func:`detect_charset`'s codec, undecodable bytes
    replaced by U+FFFD and the byte-order mark dropped, with the codec and where it came from.

    Book: Pretraining data, "From a crawl to text"
    """
    codec, source = detect_charset(payload, content_type)
    text = bytes(payload).decode(codec, errors="replace")
    return (text[1:] if text.startswith("\ufeff") else text), codec, source


def decode_html(payload: bytes, content_type: str = "") -> str:
    """The text of :func:`decode_payload`.

    Book: Pretraining data, "From a crawl to text"
    """
    return decode_payload(payload, content_type)[0]


def html_to_text(html: str, url: str | None = None) -> str:
    """The main text of an HTML document (a ``str``): trafilatura's plain-text output (one paragraph per
    line), or ``""`` when it finds none.

    Book: Pretraining data, "From a crawl to text"
    """
    if not html.strip():
        return ""
    text = trafilatura.extract(html, url=url, include_comments=False, include_tables=False, deduplicate=False)
    return (text or "").strip()


def extract_text(payload: bytes, content_type: str = "text/html", url: str | None = None) -> str:
    """The main text of an HTML payload: :func:`decode_html`, then :func:`html_to_text`.

    ``extract_text(b"<html><body><nav>Home</nav><article><p>Hello there, this is the text.</p></article>
    </body></html>")`` keeps the paragraph and drops the navigation.

    Book: Pretraining data, "From a crawl to text"
    """
    return html_to_text(decode_html(payload, content_type), url)
