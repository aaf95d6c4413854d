"""The per-document stages of the pipeline: the configuration, the document record, reading a file into
extracted documents, and the filters from ``language`` to ``pii``.

Book: Pretraining data, "The pipeline".

See :mod:`.pipeline` for the stages in order and how they run; this module holds what one worker does to one
document, with no Dask in it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .classifier import QualityClassifier, quality_classifier_filter
from .decode import decode_payload, html_to_text, is_html
from .decontaminate import decontamination_filter
from .langid import identify_language, language_decision
from .languages import language_rules
from .minhash import choose_bands
from .pii import find_pii, redact_pii
from .quality import FilterResult, c4_filter, gopher_quality_filter, gopher_repetition_filter
from .urlfilter import UrlFilter
from .warc import PAGE_RECORD_TYPES, ReadError, WarcRecord, iter_warc

__all__ = ["STAGES", "PipelineConfig", "Document", "read_input", "extract_stage", "document_stages"]

STAGES = ("extract", "url", "language", "gopher_quality", "gopher_repetition", "c4", "quality_model", "pii",
          "decontamination", "exact_dedup", "near_dedup", "substring_dedup")
"""The stages in the order they run; the names used in ``stats.json`` and ``removed.jsonl``. ``url``,
``quality_model`` and ``decontamination`` pass every document unless configured."""

@dataclass(frozen=True)
class PipelineConfig:
    """The pipeline's parameters (defaults in brackets).

    ``languages`` (``("en",)``) and ``min_language_probability`` (0.5): the language filter; each language
    must have filter rules (:data:`~llmarch.webdata.languages.LANGUAGE_RULES`).
    ``c4_terminal_punctuation`` (True): C4's rule that drops lines without an end mark; False is FineWeb's
    variant. ``substring_keep_first`` (False): exact-substring dedup cuts every occurrence of a repeated
    span (as the chapter's ``repeated_spans``); True keeps its first occurrence in document order and cuts
    the later ones, so that an original keeps its text when near dedup missed an edited copy of it.
    ``url_filter`` (None): a :class:`~llmarch.webdata.urlfilter.UrlFilter` (blocklist, URL words).
    ``quality_model`` (None) and ``quality_threshold`` (0.5): a
    :class:`~llmarch.webdata.classifier.QualityClassifier` and the score a page needs.
    ``benchmark_ngrams`` (None): the 13-grams of a benchmark (:func:`~llmarch.webdata.decontaminate.load_benchmark`)
    whose spans are cut from every page (GPT-3's decontamination).
    ``near_threshold`` (0.8), ``num_perm`` (128), ``ngram`` (5), ``minhash_seed`` (0): near deduplication on word
    5-gram shingles; ``bands``/``rows`` default to ``choose_bands(near_threshold, num_perm, 0.05, 0.95)``, a
    band choice that favours recall ((16, 8) at 0.8: a pair at the threshold becomes a candidate with
    probability 0.95) because every candidate is verified exactly, so a false candidate only costs a check.
    ``substring_min_words`` (50): the shortest repeated span cut out, in whitespace-separated words (Lee et
    al. used 50 BPE tokens); ``min_words`` (50, Gopher's minimum): a document shorter after the cut is removed.
    ``partitions`` (8): the number of partitions of the per-document stages.

    Book: Pretraining data, "The pipeline"
    """

    languages: tuple[str, ...] = ("en",)
    min_language_probability: float = 0.5
    c4_terminal_punctuation: bool = True
    substring_keep_first: bool = False
    url_filter: UrlFilter | None = None
    quality_model: QualityClassifier | None = None
    quality_threshold: float = 0.5
    benchmark_ngrams: frozenset | None = None
    near_threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 5
    minhash_seed: int = 0
    bands: int | None = None
    rows: int | None = None
    substring_min_words: int = 50
    min_words: int = 50
    partitions: int = 8

    def __post_init__(self):
        if isinstance(self.languages, str) or not self.languages or not all(
                isinstance(x, str) and x for x in self.languages):
            raise ValueError(f"languages must be a non-empty tuple of language codes, got {self.languages!r}")
        object.__setattr__(self, "languages", tuple(self.languages))
        for language in self.languages:
            language_rules(language)  # a language without filter rules is refused, not filtered as English
        for name, kind in (("url_filter", UrlFilter), ("quality_model", QualityClassifier),
                           ("benchmark_ngrams", frozenset)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"{name} must be a {kind.__name__} or None, got {type(value).__name__}")
        if not 0.0 <= self.quality_threshold <= 1.0:
            raise ValueError(f"quality_threshold must lie in [0, 1], got {self.quality_threshold!r}")
        if not 0.0 <= self.min_language_probability <= 1.0:
            raise ValueError(f"min_language_probability must lie in [0, 1], got {self.min_language_probability!r}")
        if not 0.0 < self.near_threshold < 1.0:
            raise ValueError(f"near_threshold must lie in (0, 1), got {self.near_threshold!r}")
        for name in ("num_perm", "ngram", "substring_min_words", "partitions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.min_words, bool) or not isinstance(self.min_words, int) or self.min_words < 0:
            raise ValueError(f"min_words must be a non-negative integer, got {self.min_words!r}")
        if isinstance(self.minhash_seed, bool) or not isinstance(self.minhash_seed, int) or self.minhash_seed < 0:
            raise ValueError(f"minhash_seed must be a non-negative integer, got {self.minhash_seed!r}")
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither")
        if self.bands is None:
            bands, rows = choose_bands(self.near_threshold, self.num_perm, 0.05, 0.95)
            object.__setattr__(self, "bands", bands)
            object.__setattr__(self, "rows", rows)
        elif self.bands < 1 or self.rows < 1 or self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands * rows must be at most num_perm = {self.num_perm}, got {self.bands} * {self.rows}")


@dataclass(frozen=True)
class Document:
    """A response record on its way through the stages.

    ``order`` is ``(input index, offset)``; ``text`` the current text; ``removed_by`` the stage that removed it
    (``None`` while kept) with its ``reasons`` and, for a duplicate, the ``id`` it duplicates; ``trace`` has one
    ``(stage, bytes in, bytes out, modified)`` per stage the document entered (bytes out 0 when removed);
    ``pii`` counts the replacements of each kind; ``charset`` is the codec the page was decoded with and where
    it was found (``"cp1251 (meta)"``, see :func:`llmarch.webdata.decode.detect_charset`).

    Book: Pretraining data, "The pipeline"
    """

    id: str
    url: str
    source: str
    offset: int
    order: tuple[int, int]
    text: str = ""
    removed_by: str | None = None
    reasons: tuple[str, ...] = ()
    duplicate_of: str | None = None
    trace: tuple[tuple[str, int, int, bool], ...] = ()
    pii: tuple[tuple[str, int], ...] = ()
    charset: str = ""
    language: str = ""

    @property
    def kept(self) -> bool:
        return self.removed_by is None


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _passed(doc: Document, stage: str, text: str, **changes) -> Document:
    step = (stage, _nbytes(doc.text), _nbytes(text), text != doc.text)
    return replace(doc, text=text, trace=doc.trace + (step,), **changes)


def _removed(doc: Document, stage: str, reasons: Sequence[str], duplicate_of: str | None = None,
             text: str | None = None) -> Document:
    """``doc`` removed by ``stage``; ``text`` (default: unchanged) is what the stage left, kept for the excerpt."""
    step = (stage, _nbytes(doc.text), 0, False)
    return replace(doc, text=doc.text if text is None else text, removed_by=stage, reasons=tuple(reasons),
                   duplicate_of=duplicate_of, trace=doc.trace + (step,))


# -- Reading and the per-document stages ------------------------------------------------------------------------

def read_input(path: str, index: int) -> tuple[list[Document], list[ReadError], dict[str, int]]:
    """Read one WARC or ARC file record by record: the documents of its page records
    (:data:`~llmarch.webdata.warc.PAGE_RECORD_TYPES`) after the ``extract`` stage (so that only their text
    is held, never the file), its read errors, and the number of records of each type.

    Book: Pretraining data, "The pipeline"
    """
    documents, errors, types = [], [], Counter()
    for item in iter_warc(path):
        if isinstance(item, ReadError):
            errors.append(item)
            continue
        types[item.rec_type] += 1
        if item.rec_type in PAGE_RECORD_TYPES:
            documents.append(extract_stage(index, item))
    return documents, errors, dict(types)


def _page_text(record: WarcRecord) -> tuple[str | None, str, str]:
    """``(reason or None, text, charset)`` of a page record (see :func:`extract_stage`)."""
    media = record.content_type.split(";")[0].strip().lower() or "unknown"
    if record.rec_type == "response" and (record.status is None or not 200 <= record.status < 300):
        return f"extract:http_status:{record.status}", "", ""
    if record.rec_type == "conversion":  # a WET record: the text was already extracted, in UTF-8
        if media != "text/plain":
            return f"extract:not_text:{media}", "", ""
        return None, record.payload.decode("utf-8", errors="replace").strip(), "utf-8 (wet)"
    if not is_html(record.content_type):
        return f"extract:not_html:{media}", "", ""
    if not record.payload.strip():
        return "extract:empty_payload", "", ""
    html, codec, source = decode_payload(record.payload, record.content_type)
    try:
        return None, html_to_text(html, record.url or None), f"{codec} ({source})"
    except Exception as exc:  # noqa: BLE001 - one page the extractor cannot parse must not stop the run
        return f"extract:extractor_error:{type(exc).__name__}", "", f"{codec} ({source})"


def extract_stage(index: int, record: WarcRecord) -> Document:
    """Stage ``extract``: a Document from a page record. A ``response`` must be a 2xx HTML page, a
    ``resource`` an HTML document (no HTTP status), a ``conversion`` (WET) record plain text, which is kept
    as it is. Reasons: ``extract:http_status:<code>``, ``extract:not_html:<media type>``,
    ``extract:not_text:<media type>``, ``extract:empty_payload``, ``extract:no_text``, or
    ``extract:extractor_error:<exception>`` when the extractor fails on the page.

    Book: Pretraining data, "The pipeline"
    """
    doc = Document(record.id, record.url, record.source, record.offset, (index, record.offset))
    step_in = len(record.payload)
    reason, text, charset = _page_text(record)
    if reason is None and not text:
        reason = "extract:no_text"
    if reason:
        return replace(doc, removed_by="extract", reasons=(reason,), charset=charset,
                       trace=(("extract", step_in, 0, False),))
    return replace(doc, text=text, charset=charset, trace=(("extract", step_in, _nbytes(text), True),))


def _filter(doc: Document, stage: str, result: FilterResult) -> Document:
    return _passed(doc, stage, result.text) if result.keep else _removed(doc, stage, result.reasons)


def _keep(text: str) -> FilterResult:
    return FilterResult(True, (), text)


def document_stages(doc: Document, config: PipelineConfig) -> Document:
    """Stages ``url`` to ``decontamination`` on one document (each skipped once the document is removed).

    Book: Pretraining data, "The pipeline"
    """
    if not doc.kept:
        return doc
    url = config.url_filter(doc.url) if config.url_filter is not None else _keep(doc.url)
    doc = _filter(doc, "url", replace(url, text=doc.text))
    if not doc.kept:
        return doc
    language, probability = identify_language(doc.text)
    decision = language_decision(language, probability, config.languages, config.min_language_probability)
    doc = _filter(replace(doc, language=language), "language", replace(decision, text=doc.text))
    steps = (
        ("gopher_quality", lambda t: gopher_quality_filter(t, language=language)),
        ("gopher_repetition", lambda t: gopher_repetition_filter(t, language=language)),
        ("c4", lambda t: c4_filter(t, language=language, terminal_punctuation=config.c4_terminal_punctuation)),
        ("quality_model", lambda t: _keep(t) if config.quality_model is None else
         quality_classifier_filter(t, config.quality_model, config.quality_threshold)),
    )
    for stage, check in steps:
        if not doc.kept:
            return doc
        doc = _filter(doc, stage, check(doc.text))
    if not doc.kept:
        return doc
    found = Counter(span.kind for span in find_pii(doc.text))
    doc = _passed(doc, "pii", redact_pii(doc.text), pii=tuple(sorted(found.items())))
    if config.benchmark_ngrams is None:
        return _filter(doc, "decontamination", _keep(doc.text))
    return _filter(doc, "decontamination", decontamination_filter(doc.text, config.benchmark_ngrams))
