"""The pipeline: WARC files in, clean deduplicated text out, as a Dask graph that runs in-process or on a
cluster with the same result.

Book: Pretraining data, "The pipeline".

Stages, in order (each keeps its own counts, and gives a reason for every document it removes):

- ``extract``: read the record, keep HTTP 2xx HTML responses and HTML resources, decode them as browsers do
  and extract the main text (trafilatura); WET ``conversion`` records are text already. It runs while the
  file is read, so that a worker holds the text of a file's pages, not its records;
- ``url``: a domain blocklist and URL word scores (:mod:`.urlfilter`; passes everything unless configured);
- ``language``: keep the ``languages`` (default English) with probability >= ``min_language_probability``
  (py3langid); the later filters use the rules of the language found (:mod:`.languages`);
- ``gopher_quality``: Gopher's quality rules (length, word length, symbols, bullets, stop words), linear in
  the text and run first: an 8 MB one-line page fails its word count before the repetition statistics
  spend seconds on it (the two filters change no text, so their order changes which stage names a page
  that fails both, never what is kept);
- ``gopher_repetition``: Gopher's repetition rules (duplicate lines, paragraphs and n-grams);
- ``c4``: C4's line rules (lines dropped) and page rules (page removed);
- ``quality_model``: a hashed n-gram classifier and its threshold (:mod:`.classifier`; off unless configured);
- ``pii``: e-mail addresses, phone numbers and IPv4 addresses replaced (a transform: it removes nothing);
- ``decontamination``: the spans around a benchmark's 13-grams cut out (:mod:`.decontaminate`; off unless
  configured);
- ``exact_dedup``: one document per hash of the normalised text, across all inputs;
- ``near_dedup``: one document per cluster of near duplicates (MinHash LSH), across all inputs;
- ``substring_dedup``: every span of >= ``substring_min_words`` words that occurs twice in the corpus is cut
  out (Lee et al. 2022's ExactSubstr); documents left with fewer than ``min_words`` words are removed.

**Order and "the first".** Documents are ordered by (position of their file among the inputs, offset of the
record in the file). The deduplication stages keep the first document of each group in this order, so a
page's first appearance in the crawl survives its copies, whatever the partitioning.

**Scale-out.** ``extract`` runs in one task per input file; the other per-document stages (``url`` to
``decontamination``, :mod:`.stages`) are a ``map`` over a ``dask.bag`` of documents, split into ``partitions``
partitions. Each deduplication stage is global and needs a shuffle, not a per-partition pass (which would
miss duplicates in different partitions):

- exact: a ``groupby`` (task-based shuffle) on the hash of the normalised text; in each group the first
  document stays and the others name it as ``duplicate_of``;
- near: each document's MinHash signature gives ``bands`` keys; a ``groupby`` on the keys (the global
  shuffle of band buckets) gathers the documents that share a bucket, every pair in a bucket is a candidate,
  candidates are verified by the exact Jaccard similarity of their shingle sets (>= ``near_threshold``),
  and the connected components of the verified pairs (union-find) are the clusters: the first document of
  each stays;
- substring: one suffix array over the word tokens of all remaining documents (:func:`repeated_spans_across`);
  by default it removes **every** occurrence of a repeated span, the first one included, as the
  ``repeated_spans`` of the library define them: text that the corpus repeats verbatim (licences,
  boilerplate, quoted passages) is removed from all documents, while the documents themselves stay unless
  too little is left. With ``substring_keep_first`` the first occurrence stays (one copy of each
  boilerplate passage, in whichever document came first): on real pages, where near dedup misses edited
  copies, the default cuts the shared text out of the original too.

Between the stages the driver (this process) receives the decisions: the duplicates of each group, the
candidate pairs and the shingle hashes of their documents (verified and clustered here); the repeated spans
are found in one task that holds the tokens of the whole corpus (at web scale, Lee et al. build the suffix
array in pieces and merge them). At the end the driver gathers the documents and writes them in order. The
same graph runs with the synchronous scheduler (default), on a local cluster of processes, or on a
``dask.distributed`` cluster given by its scheduler address; the outputs are byte-identical, because every
function is deterministic and every decision depends only on the document order, never on which partition
or worker saw a document.

**Outputs** (written atomically: a temporary file, then a rename; rows in document order):

- ``kept.jsonl``: ``{"id", "url", "source", "offset", "charset", "text"}`` per kept document;
- ``removed.jsonl``: ``{"id", "url", "source", "offset", "charset", "stage", "reasons", "duplicate_of",
  "excerpt"}``
  per removed document (``excerpt``: the first 300 characters of its text when removed);
- ``stats.json``: the inputs, record counts, read errors and, per stage, the documents and bytes (UTF-8 text;
  the HTML payload for ``extract``'s input) in and out, the removal reasons and the number of documents a
  stage modified: the waterfall. Every response record is in exactly one of kept and removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import itemgetter
from pathlib import Path

import dask
import dask.bag as db
import numpy as np
from dask.callbacks import Callback
from tqdm import tqdm

from .minhash import (
    band_keys,
    connected_components,
    hash_items,
    jaccard,
    minhash_signature,
    shingles,
    words,
)
from .languages import language_words
from .stages import STAGES, Document, PipelineConfig, _passed, _removed, document_stages, read_input
from .suffix import repeated_spans_across
from .warc import PAGE_RECORD_TYPES, ReadError

__all__ = ["STAGES", "PipelineConfig", "Document", "PipelineResult", "run_pipeline", "write_outputs",
           "pipeline_stats"]

EXCERPT_CHARS = 300
_TOKEN = re.compile(r"\S+")


@dataclass
class PipelineResult:
    """What :func:`run_pipeline` computed: the documents in order, the read errors, the number of records of
    each WARC type, and per input the number of records read.

    Book: Pretraining data, "The pipeline"
    """

    documents: list[Document]
    read_errors: list[ReadError]
    record_types: dict[str, int]
    inputs: list[dict] = field(default_factory=list)


def _process_partition(documents: list[Document], config: PipelineConfig) -> list[Document]:
    return [document_stages(doc, config) for doc in documents]


# -- Exact deduplication ----------------------------------------------------------------------------------------

def normalised_text_hash(text: str) -> str:
    """The key of exact deduplication: BLAKE2b (16 bytes, hex) of the text's words (lower-cased ``\\w+`` runs,
    see :func:`llmarch.webdata.words`) joined by single spaces, so case, punctuation and spacing do not count.

    Book: Pretraining data, "The pipeline"
    """
    return hashlib.blake2b(" ".join(words(text)).encode("utf-8"), digest_size=16).hexdigest()


def _exact_entry(doc: Document) -> tuple[str, tuple[int, int], str]:
    return normalised_text_hash(doc.text), doc.order, doc.id


def _first_of_group(group: tuple) -> list[tuple[tuple[int, int], str]]:
    """``(key, members)`` -> ``(order, id of the first member)`` for every member after the first."""
    _, entries = group
    members = sorted((order, doc_id) for _, order, doc_id in entries)
    first_id = members[0][1]
    return [(order, first_id) for order, _ in members[1:]]


def _apply_duplicates(doc: Document, stage: str, reason: str, duplicates: dict) -> Document:
    if not doc.kept:
        return doc
    if doc.order in duplicates:
        return _removed(doc, stage, (reason,), duplicate_of=duplicates[doc.order])
    return _passed(doc, stage, doc.text)


# -- Near deduplication -----------------------------------------------------------------------------------------

def _band_entries(doc: Document, config: PipelineConfig) -> list[tuple[tuple[int, bytes], tuple[int, int]]]:
    signature = minhash_signature(shingles(doc.text, config.ngram), config.num_perm, config.minhash_seed)
    return [(key, doc.order) for key in band_keys(signature, config.bands, config.rows)]


def _bucket_pairs(bucket: tuple) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    members = sorted({order for _, order in bucket[1]})
    return [(members[i], members[j]) for i in range(len(members)) for j in range(i + 1, len(members))]


def _shingle_hashes(doc: Document, config: PipelineConfig) -> tuple[tuple[int, int], str, list[int]]:
    return doc.order, doc.id, hash_items(shingles(doc.text, config.ngram)).tolist()


def near_duplicate_decisions(pairs, shingle_sets: dict, threshold: float) -> dict:
    """Verify candidate pairs (exact Jaccard of the shingle hash sets >= ``threshold``), cluster them with
    union-find, and map every document after the first of its cluster to the first's id.

    ``pairs``: ``(order_a, order_b)`` candidates; ``shingle_sets``: ``order -> (id, shingle hashes)`` for every
    document in a pair. Returns ``{order: id of the first document of its cluster}``.

    Book: Pretraining data, "The pipeline"
    """
    nodes = sorted(shingle_sets)
    index = {order: i for i, order in enumerate(nodes)}
    verified = [(index[a], index[b]) for a, b in pairs
                if jaccard(shingle_sets[a][1], shingle_sets[b][1]) >= threshold]
    labels = connected_components(len(nodes), verified)  # label = smallest index = first in document order
    return {order: shingle_sets[nodes[labels[i]]][0] for i, order in enumerate(nodes) if labels[i] != i}


# -- Exact-substring deduplication -------------------------------------------------------------------------------

def _token_ids(doc: Document) -> tuple[tuple[int, int], np.ndarray]:
    """Whitespace-separated tokens as 62-bit BLAKE2b ids (equal tokens, equal ids, in every process)."""
    ids = [int.from_bytes(hashlib.blake2b(m.group().encode("utf-8"), digest_size=8).digest(), "little") >> 2
           for m in _TOKEN.finditer(doc.text)]
    return doc.order, np.array(ids, dtype=np.int64)


def repeated_word_spans(token_arrays: list[tuple[tuple[int, int], np.ndarray]], min_words: int,
                        keep_first: bool = False) -> dict:
    """``{order: [(start, end), ...]}``: the token ranges of each document covered by a span of at least
    ``min_words`` tokens that occurs twice in the collection (:func:`repeated_spans_across`; with
    ``keep_first``, only the occurrences after the first in document order); documents without such a span
    are left out.

    Book: Pretraining data, "The pipeline"
    """
    token_arrays = sorted(token_arrays, key=itemgetter(0))
    spans = repeated_spans_across([tokens for _, tokens in token_arrays], min_words, keep_first=keep_first)
    return {order: s for (order, _), s in zip(token_arrays, spans) if s}


def cut_spans(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` without the given whitespace-token ranges; line breaks inside a cut are kept, then each line is
    stripped and empty lines dropped.

    ``cut_spans("a b c\\nd e", [(1, 4)]) == "a\\ne"``.

    Book: Pretraining data, "The pipeline"
    """
    tokens = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    pieces, last = [], 0
    for start, end in spans:
        if not 0 <= start < end <= len(tokens):
            raise ValueError(f"span ({start}, {end}) lies outside the {len(tokens)} tokens of the text")
        cut_from, cut_to = tokens[start][0], tokens[end - 1][1]
        pieces.append(text[last:cut_from])
        pieces.append("\n" * text.count("\n", cut_from, cut_to))
        last = cut_to
    pieces.append(text[last:])
    lines = (line.strip() for line in "".join(pieces).splitlines())
    return "\n".join(line for line in lines if line)


def _apply_substring(doc: Document, spans: dict, min_words: int) -> Document:
    if not doc.kept:
        return doc
    text = cut_spans(doc.text, spans[doc.order]) if doc.order in spans else doc.text
    if len(language_words(text, doc.language or "en")) < min_words:
        return _removed(doc, "substring_dedup", ("substring_dedup:too_short",), text=text)
    return _passed(doc, "substring_dedup", text)


# -- Running the graph ------------------------------------------------------------------------------------------

class _Progress:
    """A tqdm bar per computation on stderr (off with ``show=False``, and off when stderr is not a TTY)."""

    def __init__(self, client, show: bool):
        self.client, self.show = client, show

    def _bar(self, desc: str, total: int):
        return tqdm(total=total, desc=desc, unit="task", file=sys.stderr, disable=None if self.show else True,
                    leave=False)

    def persist(self, desc: str, *collections):
        if self.client is None:
            bar = None

            def start(dsk, state):
                nonlocal bar
                bar = self._bar(desc, sum(len(state[k]) for k in ("ready", "waiting", "running", "finished")))

            def posttask(key, result, dsk, state, worker_id):
                bar.update(1)

            with Callback(start_state=start, posttask=posttask):
                result = dask.persist(*collections, scheduler="sync")
            if bar is not None:
                bar.close()
            return result
        from dask.distributed import as_completed, futures_of

        result = self.client.persist(list(collections))
        futures = futures_of(result)
        with self._bar(desc, len(futures)) as bar:
            for future in as_completed(futures):
                bar.update(1)
        for future in futures:
            if future.status == "error":
                future.result()  # raises the task's exception here
        return tuple(result)

    def compute(self, desc: str, collection):
        (persisted,) = self.persist(desc, collection)
        if self.client is None:
            return persisted.compute(scheduler="sync")
        return self.client.compute(persisted, sync=True)


def _validate_paths(paths) -> list[str]:
    if isinstance(paths, (str, Path)) or not isinstance(paths, Sequence) or not paths:
        raise ValueError("paths must be a non-empty list of WARC files")
    names = []
    for p in paths:
        if not isinstance(p, (str, Path)):
            raise ValueError(f"paths must hold str or Path, got {type(p).__name__}")
        names.append(str(p))
    seen = Counter(os.path.abspath(n) for n in names)
    repeated = sorted(n for n, c in seen.items() if c > 1)
    if repeated:
        raise ValueError(f"these inputs are given more than once: {repeated}")
    return names


def run_pipeline(paths, config: PipelineConfig | None = None, client=None, progress: bool = False) -> PipelineResult:
    """Run every stage on the WARC files ``paths`` and return the documents (kept and removed, in order).

    ``client``: a ``dask.distributed.Client`` to run on a cluster; ``None`` runs in this process with the
    synchronous scheduler. ``progress``: tqdm bars on stderr (when it is a TTY).

    Book: Pretraining data, "The pipeline"
    """
    names = _validate_paths(paths)
    config = PipelineConfig() if config is None else config
    if not isinstance(config, PipelineConfig):
        raise ValueError(f"config must be a PipelineConfig, got {type(config).__name__}")
    run = _Progress(client, progress)
    delayed_cfg = dask.delayed(config, traverse=False)

    reads = [dask.delayed(read_input, nout=3, pure=True)(name, i) for i, name in enumerate(names)]
    extracted = db.from_delayed([r[0] for r in reads]).repartition(config.partitions)
    docs = extracted.map_partitions(_process_partition, delayed_cfg)
    meta = dask.delayed(list)([dask.delayed(tuple)([r[1], r[2]]) for r in reads])
    docs, meta = run.persist("extract and filter", docs, meta)
    meta = meta.compute(scheduler="sync") if client is None else client.compute(meta, sync=True)

    # exact deduplication: a shuffle on the hash of the normalised text
    groups = docs.filter(lambda d: d.kept).map(_exact_entry).groupby(itemgetter(0), shuffle="tasks")
    exact = dict(run.compute("exact dedup", groups.map(_first_of_group).flatten()))
    docs = docs.map(_apply_duplicates, "exact_dedup", "exact_dedup:duplicate", dask.delayed(exact, traverse=False))

    # near deduplication: a shuffle of band buckets, candidate pairs, verification, union-find
    buckets = docs.filter(lambda d: d.kept).map(_band_entries, delayed_cfg).flatten().groupby(
        itemgetter(0), shuffle="tasks")
    pairs = sorted(set(run.compute("near dedup: band buckets", buckets.map(_bucket_pairs).flatten())))
    involved = {order for pair in pairs for order in pair}
    sets = run.compute("near dedup: verify", docs.filter(lambda d: d.kept and d.order in involved).map(
        _shingle_hashes, delayed_cfg))
    near = near_duplicate_decisions(pairs, {order: (doc_id, h) for order, doc_id, h in sets}, config.near_threshold)
    docs = docs.map(_apply_duplicates, "near_dedup", "near_dedup:near_duplicate", dask.delayed(near, traverse=False))

    # exact-substring deduplication: one suffix array over the tokens of the whole corpus
    tokens = docs.filter(lambda d: d.kept).map(_token_ids)
    spans = dask.delayed(repeated_word_spans, pure=True)(tokens, config.substring_min_words,
                                                         config.substring_keep_first)
    docs = docs.map(_apply_substring, spans, config.min_words)
    documents = sorted(run.compute("substring dedup", docs), key=lambda d: d.order)

    errors = [e for read_errors, _ in meta for e in read_errors]
    types = Counter()
    inputs = []
    for name, (read_errors, counts) in zip(names, meta):
        types.update(counts)
        pages = sum(counts.get(kind, 0) for kind in PAGE_RECORD_TYPES)
        entry = {"source": name, "records": sum(counts.values()), "responses": counts.get("response", 0),
                 "pages": pages, "read_errors": len(read_errors)}
        if not pages:
            entry["warning"] = "no page record (response, resource or conversion) in this file"
        inputs.append(entry)
    return PipelineResult(documents, errors, dict(sorted(types.items())), inputs)


# -- Outputs ----------------------------------------------------------------------------------------------------

def _config_summary(config: PipelineConfig) -> dict:
    """The configuration as JSON values, without ``partitions`` (the results do not depend on it); the
    URL filter, quality model and benchmark are described by their sizes."""
    summary = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "partitions"}
    if config.url_filter is not None:
        url = config.url_filter
        summary["url_filter"] = {"blocked_domains": len(url.blocked_domains), "hard_words": len(url.hard_words),
                                 "soft_words": len(url.soft_words), "soft_threshold": url.soft_threshold}
    if config.quality_model is not None:
        summary["quality_model"] = {"buckets": len(config.quality_model.weights)}
    if config.benchmark_ngrams is not None:
        summary["benchmark_ngrams"] = len(config.benchmark_ngrams)
    return summary


def pipeline_stats(result: PipelineResult, config: PipelineConfig) -> dict:
    """The content of ``stats.json``: inputs, record types, read errors, and per stage the documents and bytes in
    and out, the documents removed with their reasons and the documents modified (the waterfall).
    ``kept_fraction`` is the share of the ``extract`` stage's input documents still present after the stage.

    Book: Pretraining data, "The pipeline"
    """
    stages = {s: {"stage": s, "documents_in": 0, "documents_out": 0, "documents_removed": 0, "bytes_in": 0,
                  "bytes_out": 0, "documents_modified": 0, "reasons": Counter()} for s in STAGES}
    pii = Counter()
    for doc in result.documents:
        for stage, bytes_in, bytes_out, modified in doc.trace:
            entry = stages[stage]
            entry["documents_in"] += 1
            entry["bytes_in"] += bytes_in
            if doc.removed_by == stage:
                entry["documents_removed"] += 1
                entry["reasons"].update(doc.reasons)
            else:
                entry["documents_out"] += 1
                entry["bytes_out"] += bytes_out
                entry["documents_modified"] += int(modified and stage != "extract")
        pii.update(dict(doc.pii))
    total = stages["extract"]["documents_in"]
    waterfall = []
    for entry in stages.values():
        entry["reasons"] = dict(sorted(entry["reasons"].items()))
        entry["kept_fraction"] = round(entry["documents_out"] / total, 6) if total else 0.0
        waterfall.append(entry)
    stages["pii"]["replacements"] = dict(sorted(pii.items()))
    kept = sum(doc.kept for doc in result.documents)
    return {
        "inputs": result.inputs,
        "record_types": result.record_types,
        "read_errors": [e.as_dict() for e in result.read_errors],
        "documents": {"in": len(result.documents), "kept": kept, "removed": len(result.documents) - kept},
        "stages": waterfall,
        "config": _config_summary(config),
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def write_outputs(out_dir, result: PipelineResult, config: PipelineConfig) -> dict:
    """Write ``kept.jsonl``, ``removed.jsonl`` and ``stats.json`` under ``out_dir`` (created if needed), each
    atomically; return the stats.

    Book: Pretraining data, "The pipeline"
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept, removed = [], []
    for doc in result.documents:
        base = {"id": doc.id, "url": doc.url, "source": doc.source, "offset": doc.offset}
        if doc.kept:
            kept.append(_json_line({**base, "charset": doc.charset, "text": doc.text}))
        else:
            removed.append(_json_line({**base, "charset": doc.charset, "stage": doc.removed_by,
                                       "reasons": list(doc.reasons),
                                       "duplicate_of": doc.duplicate_of, "excerpt": doc.text[:EXCERPT_CHARS]}))
    stats = pipeline_stats(result, config)
    _write_atomic(out / "kept.jsonl", "".join(kept))
    _write_atomic(out / "removed.jsonl", "".join(removed))
    _write_atomic(out / "stats.json", json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return stats
