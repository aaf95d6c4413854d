"""Reading WARC files with ``warcio``, resiliently, and extracting the main text of HTML pages with
``trafilatura``.

Book: Pretraining data, "From a crawl to text".

A WARC file is a sequence of records (``warcinfo``, ``request``, ``response``, ``metadata``...), each a block
of WARC headers, then ``Content-Length`` bytes (for a response: the HTTP status line, HTTP headers and the
payload). A ``.warc.gz`` file compresses each record as its own gzip member, so a reader can start at any
record's offset.

:func:`iter_warc` yields every record of a file, plain or gzip, as a :class:`WarcRecord`, and every problem as
a :class:`ReadError` instead of raising, so that one bad record never loses the rest of the file:

- a record whose header cannot be parsed, whose gzip member is corrupt, whose digest
  (``WARC-Block-Digest``/``WARC-Payload-Digest``, checked when present) does not match, or whose block is
  shorter than its ``Content-Length`` (a truncated file) is reported with its offset;
- the reader then resynchronises on the next record start after that offset: the next gzip member header
  (``1f 8b 08``) in a gzip file, the next line starting ``WARC/1.`` in a plain file, and goes on from there.
  Resynchronisation may skip good records that lie inside a damaged gzip member; it never yields a record
  twice, and the offsets it reports are positions in the file;
- a missing, empty or unreadable file, or a file that is not a WARC file at all (ARC files included), is one
  :class:`ReadError`.

:func:`extract_text` turns an HTML payload into plain text: paragraphs on their own lines, without the
navigation, sidebars, footers and banners around the main content. It decodes the bytes with the charset of
the HTTP ``Content-Type`` (UTF-8 when there is none; undecodable bytes become U+FFFD) and calls
``trafilatura.extract`` without comments and tables, and without trafilatura's own (stateful, cross-document)
deduplication: deduplication is a later stage of the pipeline, and each page is extracted independently of the
others, so the result does not depend on the order or the partition the page is processed in.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trafilatura
from warcio.archiveiterator import ArchiveIterator

__all__ = ["WarcRecord", "ReadError", "iter_warc", "is_html", "decode_html", "extract_text"]

_GZIP_MAGIC = b"\x1f\x8b\x08"
_WARC_LINE = re.compile(rb"(?:^|\n)WARC/1\.[01]\r?\n")
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([\w.:-]+)", re.IGNORECASE)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class WarcRecord:
    """One WARC record: ``rec_type`` (``"response"``, ``"warcinfo"``...), ``id`` (``WARC-Record-ID``), ``url``
    (``WARC-Target-URI``, empty when absent), ``source`` (the file, as given), ``offset`` (of the record in
    the file: the start of its gzip member for ``.warc.gz``), and for a response the HTTP ``status`` code
    (``None`` when absent or unparsable), ``content_type`` (of the HTTP payload) and ``payload`` (the bytes
    after the HTTP headers, with HTTP transfer and content encodings removed).

    Book: Pretraining data, "From a crawl to text"
    """

    rec_type: str
    id: str
    url: str
    source: str
    offset: int
    status: int | None = None
    content_type: str = ""
    payload: bytes = b""


@dataclass(frozen=True)
class ReadError:
    """A part of a file that could not be read: ``source`` (the file), ``offset`` (where the problem starts;
    0 for a file that cannot be opened) and ``error`` (a readable description).

    Book: Pretraining data, "From a crawl to text"
    """

    source: str
    offset: int
    error: str

    def as_dict(self) -> dict:
        return {"source": self.source, "offset": self.offset, "error": self.error}


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(3) == _GZIP_MAGIC


def _next_record_start(path: Path, after: int, gzip: bool) -> int | None:
    """The offset of the first record start (gzip member header, or a ``WARC/1.x`` line) after ``after``."""
    with open(path, "rb") as fh:
        position = after + 1
        carry = b""
        while True:
            fh.seek(position)
            chunk = fh.read(_CHUNK)
            if not chunk:
                return None
            data = carry + chunk
            base = position - len(carry)
            if gzip:
                found = data.find(_GZIP_MAGIC)
                if found >= 0:
                    return base + found
            else:
                match = _WARC_LINE.search(data)
                if match:
                    start = match.start() + (1 if data[match.start() : match.start() + 1] == b"\n" else 0)
                    if base + start > after:
                        return base + start
            carry = data[-16:]
            position += len(chunk)


def _status(http_headers) -> int | None:
    if http_headers is None:
        return None
    code = http_headers.get_statuscode()
    return int(code) if code.isdigit() else None


def _read_record(record, it: ArchiveIterator, source: str) -> WarcRecord:
    """Read one record fully (checking its length and digests) and return it."""
    if record.format != "warc":  # warcio also reads the older ARC format, and takes some text lines for ARC
        raise ValueError(f"not a WARC record (warcio parsed it as {record.format!r})")
    headers = record.rec_headers
    payload = record.content_stream().read() if record.rec_type == "response" else b""
    record.raw_stream.read()  # the rest of the block, so that the digests are checked
    missing = getattr(record.raw_stream, "limit", 0)
    if missing:
        raise EOFError(f"record truncated: {missing} bytes of its Content-Length are missing")
    http = record.http_headers
    return WarcRecord(
        rec_type=record.rec_type or "",
        id=headers.get_header("WARC-Record-ID") or "",
        url=headers.get_header("WARC-Target-URI") or "",
        source=source,
        offset=it.get_record_offset(),
        status=_status(http) if record.rec_type == "response" else None,
        content_type=(http.get_header("Content-Type") or "") if http is not None else "",
        payload=payload,
    )


def iter_warc(path) -> Iterator[WarcRecord | ReadError]:
    """Every record of a WARC file (plain or gzip), in file order, as :class:`WarcRecord`; every problem as
    :class:`ReadError` (see the module docstring: the reader skips the bad part and goes on).

    Book: Pretraining data, "From a crawl to text"
    """
    if not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a str or Path, got {type(path).__name__}")
    source = str(path)
    path = Path(path)
    try:
        gzip = _is_gzip(path)
        empty = path.stat().st_size == 0
    except OSError as exc:
        yield ReadError(source, 0, f"cannot open: {exc.strerror or exc}")
        return
    if empty:
        yield ReadError(source, 0, "empty file: no WARC record")
        return
    start: int | None = 0
    seen_record = False
    while start is not None:
        with open(path, "rb") as fh:
            fh.seek(start)
            it = ArchiveIterator(fh, check_digests="raise")
            offset = start  # the start of the record being read
            try:
                for record in it:
                    offset = it.offset
                    yield _read_record(record, it, source)
                    seen_record = True
                    offset = it.offset
                start = None
                size = path.stat().st_size
                if it.offset < size:  # e.g. a gzip member cut off before its first record ended
                    yield ReadError(source, it.offset, f"unreadable data at the end of the file "
                                                       f"({size - it.offset} bytes): truncated or damaged")
            except Exception as exc:  # noqa: BLE001 - warcio, zlib and parsers raise many kinds; each is reported
                text = str(exc).strip()
                first_line = ascii(text.splitlines()[0])[1:-1][:160] if text else ""  # printable, bounded
                message = f"{type(exc).__name__}: {first_line}".rstrip(": ")
                if not seen_record and offset == 0:
                    message = f"not a WARC file, or its first record is damaged ({message})"
                yield ReadError(source, offset, message)
                start = _next_record_start(path, offset, gzip)


def is_html(content_type: str) -> bool:
    """Whether an HTTP ``Content-Type`` names an HTML (or XHTML) document.

    Book: Pretraining data, "From a crawl to text"
    """
    media = content_type.split(";")[0].strip().lower()
    return media in ("text/html", "application/xhtml+xml")


def decode_html(payload: bytes, content_type: str = "") -> str:
    """``payload`` decoded with the charset named in ``content_type`` (UTF-8 when none or unknown), undecodable
    bytes replaced by U+FFFD.

    Book: Pretraining data, "From a crawl to text"
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise ValueError(f"payload must be bytes, got {type(payload).__name__}")
    match = _CHARSET.search(content_type or "")
    encoding = "utf-8"
    if match:
        try:
            encoding = codecs.lookup(match.group(1)).name
        except LookupError:
            pass
    return bytes(payload).decode(encoding, errors="replace")


def extract_text(payload: bytes, content_type: str = "text/html", url: str | None = None) -> str:
    """The main text of an HTML page: trafilatura's plain-text output (one paragraph per line), or ``""``
    when it finds none.

    ``extract_text(b"<html><body><nav>Home</nav><article><p>Hello there, this is the text.</p></article>
    </body></html>")`` keeps the paragraph and drops the navigation.

    Book: Pretraining data, "From a crawl to text"
    """
    html = decode_html(payload, content_type)
    if not html.strip():
        return ""
    text = trafilatura.extract(html, url=url, include_comments=False, include_tables=False, deduplicate=False)
    return (text or "").strip()
