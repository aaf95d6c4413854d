"""Reading WARC and ARC files with ``warcio``, resiliently and record by record.

Book: Pretraining data, "From a crawl to text".

A WARC file is a sequence of records (``warcinfo``, ``request``, ``response``, ``resource``, ``conversion``,
``metadata``...), each a block of WARC headers, then ``Content-Length`` bytes (for a response: the HTTP
status line, HTTP headers and the payload). A ``.warc.gz`` file normally compresses each record as its own
gzip member, so that a reader can start at any record's offset; some tools compress the whole file as one
gzip stream instead. ARC is the older format (Common Crawl 2008-2012, the Internet Archive's early crawls):
one header line per record (``URL IP date content-type length``), after a ``filedesc://`` record.

:func:`iter_warc` streams the records of one file (plain, gzip per record, gzip as one stream; WARC or
ARC) as :class:`WarcRecord` objects, one at a time, so that memory holds one record, not the file. Every
problem is a :class:`ReadError` instead of an exception, so that one bad record never loses the rest of the
file, and one bad file never loses the others:

- a file that is missing, empty, unreadable, or neither WARC nor ARC (an HTML page named ``.warc.gz``) is
  one error that says what the file starts with;
- a record whose header cannot be parsed, whose gzip member is corrupt, whose digest
  (``WARC-Block-Digest``/``WARC-Payload-Digest``, checked when present) does not match, whose block is
  shorter than its ``Content-Length`` (a truncated download, with or without a digest), or an ARC record
  whose length field is not a number, is one error with its offset and, when its header could be read, its
  ``WARC-Record-ID`` and target URI;
- the reader then resynchronises on the next record start after that offset (the next gzip member header
  ``1f 8b 08`` in a per-record gzip file; otherwise the next line starting ``WARC/1.``, or the next ARC
  header line ``URL IP date type length``) and goes on.
  Resynchronisation may skip good records inside a damaged gzip member; it never yields a record twice.

Offsets are positions in the file, except for a file gzipped as one stream, where they are positions in
the uncompressed stream (the only positions a reader can seek to there, by decompressing from the start).
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

__all__ = ["WarcRecord", "ReadError", "PAGE_RECORD_TYPES", "iter_warc"]

PAGE_RECORD_TYPES = ("response", "resource", "conversion")
"""The record types that carry a document: HTTP responses, archived resources (``wget``'s and ``wpull``'s
pages, files captured without HTTP) and ``conversion`` records (the extracted text of a WET file)."""

_GZIP_MAGIC = b"\x1f\x8b\x08"
_WARC_LINE = re.compile(rb"\nWARC/1\.[01]\r?\n")
_ARC_LINE = re.compile(rb"\n[a-z][a-z0-9+.-]*://\S+ \S+ \d{12,18} \S+ \S+\r?\n")  # URL IP date type length
_CHUNK = 1 << 20
_SNIFF_BYTES = 1 << 16
_NON_CHUNKED = "non-chunked gzip"  # warcio's message for a WARC gzipped as one stream


@dataclass(frozen=True)
class WarcRecord:
    """One record: ``rec_type`` (``"response"``, ``"resource"``, ``"warcinfo"``...; ARC records are
    ``"response"``, and their file header ``"arc_header"``), ``id`` (``WARC-Record-ID``; for ARC records,
    made from the file name and offset), ``url`` (target URI, empty when absent), ``source`` (the file, as
    given), ``offset`` (of the record: the start of its gzip member in a per-record gzip file), ``format``
    (``"warc"`` or ``"arc"``), and for the records of :data:`PAGE_RECORD_TYPES` the HTTP ``status`` code
    (``None`` when there is no HTTP header: resources, conversions, unparsable status lines),
    ``content_type`` (of the HTTP payload, or the WARC ``Content-Type`` of a resource or conversion) and
    ``payload`` (the bytes after the HTTP headers, transfer and content encodings removed).

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
    format: str = "warc"


@dataclass(frozen=True)
class ReadError:
    """A part of a file that could not be read: ``source`` (the file), ``offset`` (where the problem starts;
    0 for a file that cannot be opened), ``error`` (a readable description), and ``record_id`` and ``url``
    of the damaged record when its header could be read (empty otherwise).

    Book: Pretraining data, "From a crawl to text"
    """

    source: str
    offset: int
    error: str
    record_id: str = ""
    url: str = ""

    def as_dict(self) -> dict:
        return {"source": self.source, "offset": self.offset, "error": self.error, "record_id": self.record_id,
                "url": self.url}


def _sniff(path: Path) -> tuple[bool, bytes]:
    """(whether the file is gzip, its first (decompressed) bytes, at most 64 KiB)."""
    with open(path, "rb") as fh:
        head = fh.read(_SNIFF_BYTES)
    if not head.startswith(_GZIP_MAGIC):
        return False, head
    try:
        return True, zlib.decompressobj(wbits=31).decompress(head, _SNIFF_BYTES)
    except zlib.error:
        return True, b""


def _describe(head: bytes) -> str:
    text = head.lstrip()[:40]
    return ascii(text.decode("latin-1"))[1:-1] if text else "(nothing readable)"


def _next_record_start(open_file, after: int, members: bool, pattern: re.Pattern) -> int | None:
    """The offset of the first record start after ``after``: a gzip member header, or a match of
    ``pattern`` (a ``WARC/1.x`` line, or an ARC header line)."""
    try:
        with open_file() as fh:
            # a gzip member after ``after`` starts at ``after + 1`` or later; a line after a line break there
            position = after + 1 if members else after
            fh.seek(position)
            carry = b""
            while True:
                chunk = fh.read(_CHUNK)
                if not chunk:
                    return None
                data = carry + chunk
                base = position - len(carry)
                if members:
                    found = data.find(_GZIP_MAGIC)
                    if found >= 0:  # base + found > after: the search began after it
                        return base + found
                else:
                    for match in pattern.finditer(data):
                        start = base + match.start() + 1
                        if start > after:
                            return start
                carry = data[-512:]
                position += len(chunk)
    except (OSError, EOFError, zlib.error):  # a damaged gzip stream: nothing after this point is readable
        return None


def _status(http_headers) -> int | None:
    if http_headers is None:
        return None
    code = http_headers.get_statuscode()
    return int(code) if code and code.isdigit() else None


def _identity(record, source: str, offset: int) -> tuple[str, str]:
    """(record id, target URI) of a record whose headers were parsed."""
    headers = record.rec_headers
    if record.format == "arc":
        return f"<arc:{Path(source).name}#{offset}>", headers.get_header("uri") or ""
    return headers.get_header("WARC-Record-ID") or "", headers.get_header("WARC-Target-URI") or ""


def _read_record(record, it: ArchiveIterator, source: str) -> WarcRecord:
    """Read one record fully (checking its length and digests) and return it."""
    if record.format not in ("warc", "arc"):
        raise ValueError(f"neither a WARC nor an ARC record (warcio parsed it as {record.format!r})")
    if record.format == "arc":
        length = record.rec_headers.get_header("length") or ""
        if not length.isdigit():
            raise ValueError(f"ARC record with an invalid length field {length!r}")
    page = record.rec_type in PAGE_RECORD_TYPES
    payload = record.content_stream().read() if page else b""
    record.raw_stream.read()  # the rest of the block, so that the digests are checked
    missing = getattr(record.raw_stream, "limit", 0)
    if missing:
        raise EOFError(f"record truncated: {missing} bytes of its declared length are missing")
    offset = it.get_record_offset()  # known once the record is read to its end
    record_id, url = _identity(record, source, offset)
    http = record.http_headers
    if http is not None:
        content_type = http.get_header("Content-Type") or ""
    elif record.format == "arc":
        content_type = record.rec_headers.get_header("content-type") or ""
    else:
        content_type = record.rec_headers.get_header("Content-Type") or ""
    return WarcRecord(
        rec_type=record.rec_type or "", id=record_id, url=url, source=source, offset=offset,
        status=_status(http) if page else None, content_type=content_type if page else "", payload=payload,
        format=record.format)


def _message(exc: Exception) -> str:
    text = str(exc).strip()
    first_line = ascii(text.splitlines()[0])[1:-1][:160] if text else ""  # printable, bounded
    return f"{type(exc).__name__}: {first_line}".rstrip(": ")


def iter_warc(path) -> Iterator[WarcRecord | ReadError]:
    """Every record of a WARC or ARC file (plain, gzip per record or as one stream), in file order, as
    :class:`WarcRecord`; every problem as :class:`ReadError` (see the module docstring: the reader skips
    the bad part and goes on). Records are read one at a time.

    Book: Pretraining data, "From a crawl to text"
    """
    if not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a str or Path, got {type(path).__name__}")
    source = str(path)
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            yield ReadError(source, 0, "empty file: no WARC record")
            return
        compressed, head = _sniff(path)
    except OSError as exc:
        yield ReadError(source, 0, f"cannot open: {exc.strerror or exc}")
        return
    if not head.lstrip(b"\r\n").startswith((b"WARC/", b"filedesc://")):
        yield ReadError(source, 0, f"neither a WARC nor an ARC file: it starts with {_describe(head)!r}")
        return
    record_line = _ARC_LINE if head.lstrip(b"\r\n").startswith(b"filedesc://") else _WARC_LINE
    open_file = lambda: open(path, "rb")  # noqa: E731 - switched to a decompressing reader below
    members = compressed  # gzip per record: offsets are member starts, resynchronise on gzip headers
    start: int | None = 0
    yielded = skip = 0
    while start is not None:
        with open_file() as fh:
            fh.seek(start)
            it = ArchiveIterator(fh, check_digests="raise")
            offset, record = start, None  # where the record being read starts
            try:
                for record in it:
                    item = _read_record(record, it, source)
                    record, offset = None, max(it.offset, offset)  # a failure from here on is in the next record
                    if skip:
                        skip -= 1
                        continue
                    yielded += 1
                    yield item
                start = None
                size = path.stat().st_size
                if (members or not compressed) and it.offset < size:  # e.g. a gzip member cut off early
                    yield ReadError(source, it.offset, f"unreadable data at the end of the file "
                                                       f"({size - it.offset} bytes): truncated or damaged")
            except Exception as exc:  # noqa: BLE001 - warcio, zlib and parsers raise many kinds; each is reported
                message = _message(exc)
                if members and _NON_CHUNKED in message:  # one gzip stream: read it through a decompressor
                    open_file, members, start, skip = (lambda: gzip.open(path, "rb")), False, 0, yielded
                    continue
                record_id, url = _identity(record, source, offset) if record is not None else ("", "")
                yield ReadError(source, offset, message, record_id, url)
                start = _next_record_start(open_file, offset, members, record_line)
