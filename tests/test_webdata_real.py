"""llmarch.webdata on real inputs no one here wrote: the WARC and ARC files of warcio's and pywb's source
distributions, and the real pages of trafilatura's, fetched by `make` into _build/realdata (see the
Makefile target $(REALDATA)); the tests skip, saying so, when that cache is absent.

References: warcio itself (record by record, through a decompressor where the file is one gzip stream),
Python's codecs with the charset each case was written in, exact Jaccard similarity, and the labels of the
WARC built here from the real pages.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter

import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from llmarch.webdata.__main__ import main as webdata_main
from llmarch.webdata.decode import decode_payload, extract_text
from llmarch.webdata.minhash import jaccard, shingles
from llmarch.webdata.pipeline import PipelineConfig, run_pipeline
from llmarch.webdata.realdata import archive_files, real_pages, realdata_dir, write_real_page_warc
from llmarch.webdata.warc import PAGE_RECORD_TYPES, ReadError, iter_warc

pytestmark = pytest.mark.skipif(
    realdata_dir() is None,
    reason="real inputs not fetched: run `make _build/realdata/.fetched` (make test does it)")

# The damaged files among the originals, and what is wrong with each (their own test suites say so).
DAMAGED = {
    "bad.arc": "invalid length field",            # ARC records of length -1 and 'abc'
    "example-trunc.warc": "digest failed",        # a response cut short; its block digest no longer matches
    "example-extra.warc": "digest failed",        # a payload that does not match its payload digest
}


def _warcio_ids(path) -> list[tuple[str, str]]:
    """(record type, id or URI) of every record as warcio reads the file (through gzip.open when the file
    is one gzip stream, as warcio asks its users to do)."""
    def read(fh):
        out = []
        for record in ArchiveIterator(fh):
            key = record.rec_headers.get_header("WARC-Record-ID") or record.rec_headers.get_header("uri")
            out.append((record.rec_type, key))
        return out

    with open(path, "rb") as fh:
        try:
            return read(fh)
        except Exception:  # noqa: BLE001 - warcio refuses a file gzipped as one stream
            pass
    with gzip.open(path, "rb") as fh:
        return read(fh)


def _ours(items) -> list[tuple[str, str]]:
    return [(r.rec_type, r.url if r.format == "arc" else r.id) for r in items if not isinstance(r, ReadError)]


def test_every_original_file_is_read_record_for_record_as_warcio_reads_it():
    files = archive_files()
    assert len(files) >= 25
    for path in files:
        items = list(iter_warc(path))
        errors = [i for i in items if isinstance(i, ReadError)]
        if path.name in DAMAGED:
            assert errors and all(DAMAGED[path.name] in e.error for e in errors), (path.name, errors)
            assert all(e.record_id and e.url for e in errors), errors  # the header was readable
            continue
        assert not errors, (path.name, errors)
        assert _ours(items) == _warcio_ids(path), path.name


def test_a_warc_gzipped_as_one_stream_yields_every_record_once():
    path = next(p for p in archive_files() if p.name == "example-bad-non-chunked.warc.gz")
    with gzip.open(path, "rb") as fh, open(path, "rb") as raw:
        assert len(ArchiveIterator(fh).__iter__().__next__().rec_headers.headers) > 0
        assert raw.read(2) == b"\x1f\x8b"
    items = list(iter_warc(path))
    assert not any(isinstance(i, ReadError) for i in items)
    assert Counter(r.rec_type for r in items) == Counter(t for t, _ in _warcio_ids(path))
    assert len({r.id for r in items}) == len(items)


def test_the_pipeline_accounts_for_every_record_of_every_original_file(tmp_path):
    files = [str(p) for p in archive_files()]
    assert webdata_main(["run", *files, "--out", str(tmp_path), "--quiet", "--partitions", "1"]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    rows = [json.loads(line) for name in ("kept.jsonl", "removed.jsonl")
            for line in (tmp_path / name).read_text().splitlines()]
    pages = 0
    for path, entry in zip(files, stats["inputs"]):
        items = [i for i in iter_warc(path) if not isinstance(i, ReadError)]
        assert entry["records"] == len(items)
        n_pages = sum(r.rec_type in PAGE_RECORD_TYPES for r in items)
        assert entry["pages"] == n_pages
        assert ("warning" in entry) == (n_pages == 0)  # e.g. a file of revisits only
        pages += n_pages
    assert len(rows) == pages == stats["documents"]["in"]
    assert sum(stats["record_types"].values()) == sum(e["records"] for e in stats["inputs"])
    resources = [r for r in rows if "resource" in r["url"] or r["url"].endswith((".html", "/"))]
    assert resources  # HTML resource records (wget, wpull) are pages
    assert {e["source"].rsplit("/", 1)[1] for e in stats["read_errors"]} == set(DAMAGED)


def _response(writer, url, payload: bytes, content_type: str, digest: bool = True):
    http = StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")
    record = writer.create_warc_record(url, "response", payload=io.BytesIO(payload), http_headers=http)
    if not digest:
        for name in ("WARC-Block-Digest", "WARC-Payload-Digest"):
            record.rec_headers.remove_header(name)
    writer.write_record(record)


PARAGRAPH = {
    "cp1251": "Москва — столица России. Это тестовая страница, написанная в кодировке windows-1251.",
    "cp932": "東京は日本の首都です。このページはシフトJISで書かれたテスト用のページです。",
    "gb18030": "北京是中国的首都。这个网页是用国标码写的测试页面，用于检查编码的识别。",
    "cp1252": "Le café où l'on mange une crème brûlée coûte très cher à Noël, dit-on.",
}


@pytest.mark.parametrize("codec", sorted(PARAGRAPH))
@pytest.mark.parametrize("where", ["http", "meta", "bom", "none"])
def test_each_charset_declaration_decodes_the_page_as_written(codec, where):
    text = PARAGRAPH[codec]
    if where == "bom":
        codec = "utf-8"
    label = {"cp932": "shift_jis"}.get(codec, codec)  # Python's cp932 is not a WHATWG label; Shift_JIS is
    head = f'<meta charset="{label}">' if where == "meta" else ""
    html = (f"<html><head>{head}<title>t</title></head><body><p>{text}</p><p>{text}</p></body></html>")
    payload = (b"\xef\xbb\xbf" if where == "bom" else b"") + html.encode(codec)
    content_type = f"text/html; charset={label}" if where == "http" else "text/html"
    decoded, used, source = decode_payload(payload, content_type)
    assert decoded == html and source == {"none": "detector"}.get(where, where), (used, source)


def test_a_browser_order_bom_beats_a_wrong_header_and_real_pages_decode_cleanly():
    payload = b"\xef\xbb\xbf<p>" + "Größe".encode() + b"</p>"
    assert decode_payload(payload, "text/html; charset=iso-8859-1")[1:] == ("utf-8", "bom")
    for page in real_pages():
        text, _, source = decode_payload(page.html, "text/html")
        assert "\ufffd" not in text, page.name  # no page of the set loses a character
        assert source in ("meta", "detector", "default")


def _wet(path, texts: list[str]):
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        writer.write_record(writer.create_warcinfo_record("x.warc.wet.gz", {"software": "test"}))
        for i, text in enumerate(texts):
            writer.write_record(writer.create_warc_record(
                f"http://wet.example/{i}", "conversion", payload=io.BytesIO(text.encode("utf-8")),
                warc_content_type="text/plain"))


def test_wet_files_are_read_as_text_records_and_wat_like_files_warned_about(tmp_path):
    pages = real_pages()[:6]
    texts = [extract_text(p.html, "text/html", p.url) for p in pages]
    _wet(tmp_path / "crawl.warc.wet.gz", texts)
    with open(tmp_path / "meta.warc.wat.gz", "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        writer.write_record(writer.create_warc_record("http://wat.example/", "metadata",
                                                      payload=io.BytesIO(b'{"Envelope": {}}'),
                                                      warc_content_type="application/json"))
    (tmp_path / "page.warc.gz").write_bytes(pages[0].html)  # an HTML page under a WARC name
    inputs = [str(tmp_path / n) for n in ("crawl.warc.wet.gz", "meta.warc.wat.gz", "page.warc.gz")]
    result = run_pipeline(inputs, PipelineConfig(languages=("en", "de", "fr"), partitions=2))
    docs = result.documents
    assert [d.url for d in docs] == [f"http://wet.example/{i}" for i in range(6)]
    extracted = [d.trace[0] for d in docs]
    assert all(step[2] == len(t.encode()) for step, t in zip(extracted, texts))  # the WET text itself
    assert [e.get("warning") is not None for e in result.inputs] == [False, True, True]
    assert [e.source for e in result.read_errors] == [inputs[2]]
    assert "neither a WARC nor an ARC file" in result.read_errors[0].error


def test_a_truncated_download_is_reported_with_its_record_with_or_without_a_digest(tmp_path):
    pages = real_pages()[:4]
    for digest in (True, False):
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=False)
        for page in pages:
            _response(writer, page.url, page.html, "text/html", digest=digest)
        data = buf.getvalue()
        starts = [r.offset for r in iter_warc_bytes(tmp_path / "full.warc", data)]
        cut = starts[-1] + 2000
        path = tmp_path / f"cut-{digest}.warc"
        path.write_bytes(data[:cut])
        items = list(iter_warc(path))
        records = [i for i in items if not isinstance(i, ReadError)]
        errors = [i for i in items if isinstance(i, ReadError)]
        assert [r.url for r in records] == [p.url for p in pages[:3]]
        assert len(errors) == 1 and errors[0].url == pages[3].url and errors[0].offset == starts[-1], errors
    big = next(p for p in archive_files() if p.name == "iana.warc.gz")
    data = big.read_bytes()
    (tmp_path / "iana-cut.warc.gz").write_bytes(data[: len(data) // 2])
    items = list(iter_warc(tmp_path / "iana-cut.warc.gz"))
    assert isinstance(items[-1], ReadError) and not any(isinstance(i, ReadError) for i in items[:-1])
    assert _ours(items[:-1]) == _warcio_ids(big)[: len(items) - 1]


def iter_warc_bytes(path, data: bytes):
    path.write_bytes(data)
    return [i for i in iter_warc(path) if not isinstance(i, ReadError)]


FILTER_STAGES = ("extract", "language", "gopher_quality", "gopher_repetition", "c4", "pii")


@pytest.fixture(scope="module")
def real_crawl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("realcrawl")
    path = folder / "real.warc.gz"
    labels = write_real_page_warc(path, real_pages()[:24], copies=8, seed=1)
    with open(path, "rb") as fh:  # the payloads, as warcio reads them back
        payloads = {r.rec_headers.get_header("WARC-Record-ID"): r.content_stream().read()
                    for r in ArchiveIterator(fh)}
    config = PipelineConfig(languages=("en", "de", "fr"), partitions=2)
    result = run_pipeline([str(path)], config)
    return labels, payloads, {d.id: d for d in result.documents}


def _text_at_dedup(payload: bytes, url: str) -> str:
    """The text a page has when it reaches deduplication, recomputed from its payload: extraction, C4's
    line filter and PII redaction (the Gopher and language stages change no text)."""
    from llmarch.webdata.pii import redact_pii
    from llmarch.webdata.quality import c4_filter

    return redact_pii(c4_filter(extract_text(payload, "text/html", url)).text)


def test_the_real_page_warc_copies_are_removed_as_duplicates_of_their_originals(real_crawl):
    labels, payloads, docs = real_crawl
    copies = [(rid, lab) for rid, lab in labels.items() if lab["kind"] != "original"]
    assert len(copies) == 32 and len(docs) == len(labels) == len(payloads)
    checked = Counter()
    for rid, label in copies:
        copy, original = docs[rid], docs[label["copy_of"]]
        if original.removed_by in FILTER_STAGES or copy.removed_by in FILTER_STAGES:
            continue  # never reached deduplication
        checked[label["kind"]] += 1
        if label["kind"] == "exact-copy":
            assert (copy.removed_by, copy.duplicate_of) == ("exact_dedup", label["copy_of"]), label
            continue
        similar = jaccard(shingles(_text_at_dedup(payloads[rid], label["url"])),
                          shingles(_text_at_dedup(payloads[label["copy_of"]], labels[label["copy_of"]]["url"])))
        if similar >= 0.8:
            assert copy.removed_by in ("exact_dedup", "near_dedup"), (label, similar)
            assert copy.duplicate_of == label["copy_of"], (label, similar)
        else:
            assert copy.removed_by not in ("exact_dedup", "near_dedup"), (label, similar)
    assert sum(checked.values()) >= 10 and len(checked) == 4, checked


def test_the_real_page_warc_records_every_page_once_with_its_charset(real_crawl):
    labels, payloads, docs = real_crawl
    assert set(docs) == set(labels)
    charsets = Counter(d.charset.split(" ")[0] for d in docs.values() if d.charset)
    assert charsets["utf-8"] > 0 and charsets["cp1252"] >= 2, charsets
