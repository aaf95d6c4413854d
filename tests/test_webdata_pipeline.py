"""The web-data pipeline on the synthetic crawl: the crawl is reproducible and readable by warcio, every stage
does what the hidden labels say, the deduplication agrees with single-process references and does not depend
on the partitioning, a real two-worker Dask cluster writes the same bytes as a local run, and damaged inputs
are reported and skipped without losing the rest."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from llmarch.webdata import near_duplicate_clusters
from llmarch.webdata.crawl import KIND_SHARES, read_labels, write_synthetic_crawl
from llmarch.webdata.crawl_text import LICENCE_PASSAGE, QUOTED_PASSAGE
from llmarch.webdata.pipeline import (
    STAGES,
    PipelineConfig,
    cut_spans,
    normalised_text_hash,
    run_pipeline,
    write_outputs,
)
from llmarch.webdata.__main__ import main as webdata_main
from llmarch.webdata.decode import decode_html, extract_text
from llmarch.webdata.warc import ReadError, iter_warc

N_PAGES, SEED = 120, 1
OUTPUTS = ("kept.jsonl", "removed.jsonl", "stats.json")


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    return write_synthetic_crawl(tmp_path_factory.mktemp("crawl"), N_PAGES, SEED)


@pytest.fixture(scope="module")
def labels(crawl):
    return {label["id"]: label for label in read_labels(crawl.labels)}


def run_to(out: Path, paths, **config) -> dict:
    cfg = PipelineConfig(**config)
    write_outputs(out, run_pipeline(paths, cfg), cfg)
    return read_outputs(out)


def read_outputs(out: Path) -> dict:
    return {
        "kept": [json.loads(line) for line in (out / "kept.jsonl").read_text().splitlines()],
        "removed": [json.loads(line) for line in (out / "removed.jsonl").read_text().splitlines()],
        "stats": json.loads((out / "stats.json").read_text()),
        "bytes": {name: (out / name).read_bytes() for name in OUTPUTS},
    }


@pytest.fixture(scope="module")
def outputs(crawl, tmp_path_factory):
    return run_to(tmp_path_factory.mktemp("out5"), crawl.warc_files, partitions=5)


@pytest.fixture(scope="module")
def fate(outputs):
    """id -> ("kept", None, None) or (stage, reasons, duplicate_of)."""
    result = {doc["id"]: ("kept", (), None) for doc in outputs["kept"]}
    for doc in outputs["removed"]:
        result[doc["id"]] = (doc["stage"], tuple(doc["reasons"]), doc["duplicate_of"])
    return result


# -- The synthetic crawl ---------------------------------------------------------------------------------------

def test_the_same_seed_writes_the_same_bytes_and_another_seed_does_not(crawl, tmp_path):
    again = write_synthetic_crawl(tmp_path / "again", N_PAGES, SEED)
    other = write_synthetic_crawl(tmp_path / "other", N_PAGES, SEED + 1)
    for a, b, c in zip(crawl.warc_files + [crawl.labels], again.warc_files + [again.labels],
                       other.warc_files + [other.labels]):
        assert a.read_bytes() == b.read_bytes(), a.name
        assert a.read_bytes() != c.read_bytes(), a.name
    assert [p.name for p in crawl.warc_files] == ["crawl-000.warc.gz", "crawl-001.warc.gz", "crawl-002.warc"]
    assert gzip.decompress(crawl.warc_files[0].read_bytes()).startswith(b"WARC/1.0")  # all members readable
    assert crawl.warc_files[2].read_bytes().startswith(b"WARC/1.0")  # the plain one


def test_warcio_reads_every_record_where_the_labels_say(crawl, labels):
    found = []
    for path in crawl.warc_files:
        with open(path, "rb") as fh:
            it = ArchiveIterator(fh, check_digests="raise")
            types = []
            for record in it:
                types.append(record.rec_type)
                if record.rec_type == "response":
                    record.content_stream().read()
                    found.append((record.rec_headers.get_header("WARC-Record-ID"),
                                  record.rec_headers.get_header("WARC-Target-URI"), path.name, it.get_record_offset()))
            assert types[0] == "warcinfo" and set(types[1:]) == {"response"}
    assert found == [(lab["id"], lab["url"], lab["file"], lab["offset"]) for lab in labels.values()]


def test_label_counts_follow_the_shares_and_duplicates_follow_clean_originals(labels):
    counts = Counter(label["kind"] for label in labels.values())
    expected = {kind: max(1, round(share * N_PAGES)) for kind, share in KIND_SHARES.items()}
    assert {k: counts[k] for k in expected} == expected
    assert counts["clean"] == N_PAGES - sum(expected.values())
    position = {doc_id: i for i, doc_id in enumerate(labels)}
    for label in labels.values():
        if label["kind"] in ("exact-duplicate", "near-duplicate"):
            original = labels[label["duplicate_of"]]
            assert original["kind"] == "clean" and not original["traits"]
            assert position[original["id"]] < position[label["id"]]
        else:
            assert label["duplicate_of"] is None
    languages = {label["language"] for label in labels.values() if label["kind"] == "foreign"}
    assert languages <= {"de", "fr", "es", "it"} and len(languages) >= 3
    assert sum(bool(label["pii"]) for label in labels.values() if label["kind"] == "clean") >= 5
    assert any("licence" in label["shared_passages"] for label in labels.values())
    assert len({label["url"] for label in labels.values()}) == N_PAGES


@pytest.mark.parametrize("kwargs", [{"n_pages": 5}, {"n_pages": 50, "seed": -1}, {"n_pages": 50, "n_files": 0},
                                    {"n_pages": 50.0}])
def test_bad_crawl_arguments_are_refused(tmp_path, kwargs):
    with pytest.raises(ValueError):
        write_synthetic_crawl(tmp_path, **kwargs)


# -- Extraction ------------------------------------------------------------------------------------------------

def test_extraction_keeps_the_article_and_drops_the_boilerplate():
    html = ("<html><head><meta charset='utf-8'><title>t</title></head><body>"
            "<nav><ul><li><a href='/'>Home</a></li><li><a href='/about'>About us</a></li></ul></nav>"
            "<div class='cookie-banner'>This website uses cookies. Accept all cookies?</div>"
            "<article><h1>Pruning roses</h1><p>Prune the roses in early spring, just above an outward-facing "
            "bud, and remove any dead or crossing stems first.</p><p>Feed them afterwards with a little "
            "compost and water well during the first dry spell of the year.</p></article>"
            "<footer>Copyright 2024 Example. All rights reserved.</footer></body></html>").encode()
    text = extract_text(html, "text/html; charset=utf-8")
    assert "Prune the roses in early spring" in text and "Feed them afterwards" in text
    for boilerplate in ("About us", "cookies", "All rights reserved"):
        assert boilerplate not in text
    assert decode_html("Größe".encode("latin-1"), "text/html; charset=ISO-8859-1") == "Größe"
    assert decode_html("Größe".encode("utf-8"), "text/html") == "Größe"  # no charset, valid UTF-8: UTF-8
    # an unknown label falls through to the detector
    russian = "Привет! Это тестовая страница на русском языке, в кодировке windows-1251."
    assert decode_html(russian.encode("cp1251"), "text/html; charset=no-such-codec") == russian
    with pytest.raises(ValueError):
        extract_text("not bytes")


@pytest.mark.parametrize("label", ["x-sjis", "windows-31j", "Shift_JIS", "ms_kanji", "csShiftJIS"])
def test_every_whatwg_label_of_shift_jis_decodes_the_page(label):
    """A tiny stand-in for the crawled page whose <meta charset="x-sjis"> was unknown: the detector then read
    it as another code page (464 U+FFFD on the real page; this one came out as Korean cp949)."""
    from llmarch.webdata.decode import decode_payload

    page = (f'<html><head><meta charset="{label}"><title>t</title></head><body><p>ﾃｽﾄﾍﾟｰｼﾞ ｶﾀｶﾅ</p>'
            "<p>Copyright 2003 Example Inc.</p></body></html>")
    text, codec, source = decode_payload(page.encode("cp932"))
    assert (codec, source) == ("cp932", "meta") and text == page
    text, codec, source = decode_payload(page.encode("cp932"), f"text/html; charset={label.upper()}")
    assert (codec, source) == ("cp932", "http") and text == page


def test_whatwg_labels_resolve_as_browsers_resolve_them():
    from llmarch.webdata.decode import detect_charset

    # label -> the Python codec of the WHATWG encoding (from the Encoding Standard's table, written out here)
    expected = {"latin1": "cp1252", "ISO-8859-1": "cp1252", "us-ascii": "cp1252", "iso-8859-9": "cp1254",
                "gb2312": "gb18030", "GBK": "gb18030", "x-gbk": "gb18030", "ks_c_5601-1987": "cp949",
                "euc-kr": "cp949", "tis-620": "cp874", "koi8-u": "koi8-u", "x-mac-cyrillic": "mac-cyrillic",
                "cp1251": "cp1251", "x-euc-jp": "euc_jp", " utf8 ": "utf-8"}
    for label, codec in expected.items():
        assert detect_charset(b"<p>x</p>", f"text/html; charset={label}") == (codec, "http"), label
    # labels without a Python decoder are ignored: detection goes on to the <meta>
    assert detect_charset(b'<meta charset="koi8-r">', "text/html; charset=iso-2022-kr") == ("koi8-r", "meta")


def test_a_meta_inside_an_html_comment_is_ignored():
    from llmarch.webdata.decode import detect_charset

    russian = "Привет! Это тестовая страница на русском языке.".encode("cp1251")
    commented = b'<html><head><!-- <meta charset="utf-8"> --><meta charset="windows-1251"></head><p>' + russian
    assert detect_charset(commented) == ("cp1251", "meta")
    assert detect_charset(b'<!--> <meta charset="koi8-r">') == ("koi8-r", "meta")    # "<!-->" closes at once
    assert detect_charset(b'<!-- unclosed <meta charset="koi8-r">')[1] != "meta"
    assert detect_charset(b'<meta charset="koi8-r"><!-- x -->') == ("koi8-r", "meta")


def test_windows_1252_is_the_fallback_when_nothing_matches():
    from llmarch.webdata.decode import decode_payload, detect_charset

    assert detect_charset(b"<html><body>plain ASCII</body></html>") == ("cp1252", "default")
    assert decode_payload(b"caf\xe9 cr\xe8me", "text/html; charset=no-such-label")[0] == "café crème"


# -- The stages against the labels -----------------------------------------------------------------------------

def test_every_response_record_is_kept_or_removed_exactly_once(outputs, labels):
    kept = [doc["id"] for doc in outputs["kept"]]
    removed = [doc["id"] for doc in outputs["removed"]]
    assert len(set(kept)) == len(kept) and len(set(removed)) == len(removed)
    assert not set(kept) & set(removed)
    assert set(kept) | set(removed) == set(labels)
    assert outputs["stats"]["read_errors"] == []
    assert outputs["stats"]["record_types"] == {"response": N_PAGES, "warcinfo": 3}
    order = list(labels)  # crawl order: file, then offset
    assert kept == [i for i in order if i in set(kept)] and removed == [i for i in order if i in set(removed)]
    for doc in outputs["kept"]:
        assert (doc["url"], Path(doc["source"]).name, doc["offset"]) == (
            labels[doc["id"]]["url"], labels[doc["id"]]["file"], labels[doc["id"]]["offset"])


def test_exact_and_near_duplicates_are_removed_and_their_originals_kept(fate, labels):
    for kind, stage in (("exact-duplicate", "exact_dedup"), ("near-duplicate", "near_dedup")):
        dups = [label for label in labels.values() if label["kind"] == kind]
        assert dups
        for label in dups:
            assert fate[label["id"]] == (stage, (f"{stage}:{'duplicate' if kind[0] == 'e' else 'near_duplicate'}",),
                                         label["duplicate_of"]), label
            assert fate[label["duplicate_of"]][0] == "kept"
    removed_as_dups = {i for i, (stage, _, _) in fate.items() if stage in ("exact_dedup", "near_dedup")}
    assert all(labels[i]["kind"] in ("exact-duplicate", "near-duplicate") for i in removed_as_dups)


def test_foreign_spam_low_quality_and_non_pages_are_removed_by_the_right_stage(fate, labels):
    for label in labels.values():
        stage, reasons, _ = fate[label["id"]]
        kind = label["kind"]
        if kind == "foreign":
            assert (stage, reasons) == ("language", (f"language:{label['language']}",)), label
        elif kind in ("spam", "low-quality"):
            assert stage in ("extract", "language", "gopher_repetition", "gopher_quality", "c4"), label
        elif kind == "http-error":
            assert (stage, reasons) == ("extract", ("extract:http_status:404",))
        elif kind == "empty":
            assert (stage, reasons) == ("extract", ("extract:empty_payload",))
        elif kind == "non-html":
            media = {"pdf": "application/pdf", "png": "image/png", "json": "application/json"}[label["variant"]]
            assert (stage, reasons) == ("extract", (f"extract:not_html:{media}",))
        elif kind == "clean" and "short" in label["traits"]:
            assert stage == "gopher_quality" and "gopher:word_count" in reasons
        elif kind == "clean" and "code" in label["traits"]:
            assert (stage, reasons) == ("c4", ("c4:curly_bracket",))
        elif kind == "clean":
            assert stage == "kept", label


def test_personal_information_is_redacted_in_kept_text(outputs, labels, fate):
    kept = {doc["id"]: doc["text"] for doc in outputs["kept"]}
    with_pii = [label for label in labels.values() if label["pii"] and label["id"] in kept]
    assert len(with_pii) >= 3
    for label in with_pii:
        for item in label["pii"]:
            assert item["value"] not in kept[label["id"]]
            assert {"EMAIL": "<EMAIL>", "PHONE": "<PHONE>", "IP_ADDRESS": "<IP_ADDRESS>"}[item["kind"]] in kept[label["id"]]
    reached = [label for label in labels.values()
               if fate[label["id"]][0] in ("kept", "exact_dedup", "near_dedup", "substring_dedup")]
    expected = Counter(item["kind"] for label in reached for item in label["pii"])
    stats = {s["stage"]: s for s in outputs["stats"]["stages"]}
    assert stats["pii"]["replacements"] == dict(sorted(expected.items()))
    assert stats["pii"]["documents_modified"] == sum(bool(label["pii"]) for label in reached)


def test_shared_passages_are_cut_from_every_page_and_the_pages_stay(outputs, labels):
    kept = {doc["id"]: doc["text"] for doc in outputs["kept"]}
    sharing = [label for label in labels.values() if label["shared_passages"] and label["id"] in kept]
    assert len(sharing) >= 3
    for passage in (LICENCE_PASSAGE, QUOTED_PASSAGE):
        probe = " ".join(passage.split()[10:22])
        assert not any(probe in text for text in kept.values())
    for label in labels.values():
        if label["kind"] == "clean" and not label["traits"]:
            assert label["id"] in kept


def test_no_span_of_min_words_repeats_across_kept_text(outputs):
    """Brute force: every window of 50 whitespace tokens in the kept texts occurs once."""
    seen = Counter()
    for doc in outputs["kept"]:
        tokens = doc["text"].split()
        seen.update({tuple(tokens[i:i + 50]) for i in range(len(tokens) - 49)})
        assert len(tokens) >= 50
    assert seen and max(seen.values()) == 1


def test_near_dedup_agrees_with_the_single_process_clusters(crawl):
    """The shuffle of band buckets over partitions finds the clusters of near_duplicate_clusters on the same texts."""
    config = PipelineConfig(partitions=4, substring_min_words=10**6, min_words=0)
    docs = run_pipeline(crawl.warc_files, config).documents
    entering = [d for d in docs if any(stage == "near_dedup" for stage, *_ in d.trace)]
    clusters = near_duplicate_clusters([d.text for d in entering], threshold=config.near_threshold,
                                       num_perm=config.num_perm, ngram=config.ngram, seed=config.minhash_seed,
                                       bands=config.bands, rows=config.rows)
    expected = {d.id: entering[c].id for d, c in zip(entering, clusters) if entering[c] is not d}
    assert expected
    assert {d.id: d.duplicate_of for d in entering if d.removed_by == "near_dedup"} == expected
    first_of_hash = {}
    for d in docs:
        if any(stage == "exact_dedup" for stage, *_ in d.trace):
            first_of_hash.setdefault(normalised_text_hash(d.text), d.id)
    exact = {d.id: d.duplicate_of for d in docs if d.removed_by == "exact_dedup"}
    assert exact and exact == {d.id: first_of_hash[normalised_text_hash(d.text)] for d in docs
                               if d.removed_by == "exact_dedup"}
    assert set(first_of_hash.values()).isdisjoint(exact)


def test_stats_are_a_consistent_waterfall(outputs):
    stats = outputs["stats"]
    stages = stats["stages"]
    assert [s["stage"] for s in stages] == list(STAGES)
    assert stages[0]["documents_in"] == N_PAGES == stats["documents"]["in"]
    for s in stages:
        assert s["documents_in"] == s["documents_out"] + s["documents_removed"]
        assert sum(Counter(s["reasons"]).values()) >= s["documents_removed"]  # a page may fail several rules
        assert s["bytes_out"] <= s["bytes_in"]
    for before, after in zip(stages, stages[1:]):
        assert before["documents_out"] == after["documents_in"]
        assert before["bytes_out"] == after["bytes_in"]
    assert stages[-1]["documents_out"] == len(outputs["kept"]) == stats["documents"]["kept"]
    assert stages[-1]["bytes_out"] == sum(len(d["text"].encode()) for d in outputs["kept"])
    assert Counter(d["stage"] for d in outputs["removed"]) == {
        s["stage"]: s["documents_removed"] for s in stages if s["documents_removed"]}
    assert stages[-1]["kept_fraction"] == round(len(outputs["kept"]) / N_PAGES, 6)


def test_one_partition_and_five_give_the_same_bytes(crawl, outputs, tmp_path):
    one = run_to(tmp_path, crawl.warc_files, partitions=1)
    assert one["bytes"] == outputs["bytes"]


def test_a_partition_per_record_gives_the_same_bytes(crawl, outputs, tmp_path):
    """Every duplicate and its original now sit in different partitions: the shuffles still find them."""
    split = run_to(tmp_path, crawl.warc_files, partitions=N_PAGES)
    assert split["bytes"] == outputs["bytes"]


# -- Helpers ----------------------------------------------------------------------------------------------------

def test_cut_spans_and_the_exact_dedup_key():
    assert cut_spans("a b c\nd e", [(1, 4)]) == "a\ne"
    assert cut_spans("one two three", []) == "one two three"
    with pytest.raises(ValueError):
        cut_spans("one two", [(1, 3)])
    assert normalised_text_hash("The  cat, sat!") == normalised_text_hash("the cat sat")
    assert normalised_text_hash("the cat sat") != normalised_text_hash("the cat sat down")


@pytest.mark.parametrize("kwargs", [{"near_threshold": 1.5}, {"partitions": 0}, {"languages": "en"},
                                    {"bands": 4}, {"bands": 20, "rows": 10}, {"min_language_probability": 2.0}])
def test_bad_configurations_are_refused(kwargs):
    with pytest.raises(ValueError):
        PipelineConfig(**kwargs)


def test_bad_input_lists_are_refused(crawl):
    for paths in ([], "a.warc", [crawl.warc_files[0], str(crawl.warc_files[0])], [3]):
        with pytest.raises(ValueError):
            run_pipeline(paths)


# -- Damaged inputs -------------------------------------------------------------------------------------------

def _damage(crawl, labels, tmp_path):
    """Damaged copies of the crawl's files, and the ids of the records each damage destroys."""
    gz = [label for label in labels.values() if label["file"] == "crawl-000.warc.gz"]
    plain = [label for label in labels.values() if label["file"] == "crawl-002.warc"]
    data_gz = crawl.warc_files[0].read_bytes()
    data_plain = crawl.warc_files[2].read_bytes()
    cases = {}
    flipped = bytearray(data_gz)
    start = gz[5]["offset"]
    flipped[start + 150:start + 160] = bytes(10)
    cases["corrupt-member.warc.gz"] = (bytes(flipped), {gz[5]["id"]}, [start])
    cut = gz[-3]["offset"] + 200
    cases["truncated.warc.gz"] = (data_gz[:cut], {label["id"] for label in gz[-3:]}, [gz[-3]["offset"]])
    header = bytearray(data_plain)
    start = plain[4]["offset"]
    header[start:start + 8] = b"GARBAGE!"
    cases["bad-header.warc"] = (bytes(header), {plain[4]["id"]}, [start])
    digest = bytearray(data_plain)
    start = plain[7]["offset"]
    digest[start + 900] ^= 0x20
    cases["bad-digest.warc"] = (bytes(digest), {plain[7]["id"]}, [start])
    cases["truncated.warc"] = (data_plain[:plain[-2]["offset"] + 700], {label["id"] for label in plain[-2:]},
                               [plain[-2]["offset"]])
    cases["not-a-warc.warc"] = (b"this is a text file\nnot a crawl\n", set(), [0])
    paths = {}
    for name, (data, _, _) in cases.items():
        (tmp_path / name).write_bytes(data)
        paths[name] = tmp_path / name
    source_ids = {"gz": {label["id"] for label in gz}, "plain": {label["id"] for label in plain}}
    return cases, paths, source_ids


def test_each_kind_of_damage_is_reported_and_the_rest_of_the_file_read(crawl, labels, tmp_path):
    cases, paths, source_ids = _damage(crawl, labels, tmp_path)
    for name, (_, lost, offsets) in cases.items():
        items = list(iter_warc(paths[name]))
        errors = [i for i in items if isinstance(i, ReadError)]
        ids = {i.id for i in items if not isinstance(i, ReadError) and i.rec_type == "response"}
        assert [e.offset for e in errors] == offsets, (name, errors)
        assert all(e.source == str(paths[name]) and e.error for e in errors)
        if name != "not-a-warc.warc":
            full = source_ids["gz" if name.endswith(".gz") else "plain"]
            assert ids == full - lost, name
    missing = list(iter_warc(tmp_path / "missing.warc.gz"))
    assert len(missing) == 1 and isinstance(missing[0], ReadError) and "cannot open" in missing[0].error
    (tmp_path / "empty.warc").write_bytes(b"")
    assert [e.error for e in iter_warc(tmp_path / "empty.warc")] == ["empty file: no WARC record"]


def test_the_cli_warns_about_damaged_inputs_and_processes_the_rest(crawl, labels, tmp_path, capsys):
    cases, paths, _ = _damage(crawl, labels, tmp_path)
    names = ["corrupt-member.warc.gz", "bad-digest.warc", "not-a-warc.warc"]
    inputs = [str(paths[n]) for n in names] + [str(tmp_path / "missing.warc")]
    assert webdata_main(["run", *inputs, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    out = read_outputs(tmp_path / "out")
    errors = out["stats"]["read_errors"]
    assert [(Path(e["source"]).name, e["offset"]) for e in errors] == [
        (n, off) for n in names for off in cases[n][2]] + [("missing.warc", 0)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    no_pages = [e for e in out["stats"]["inputs"] if "warning" in e]
    assert [Path(e["source"]).name for e in no_pages] == ["not-a-warc.warc", "missing.warc"]
    assert len(warnings) == len(errors) + len(no_pages)
    read = {d["id"] for d in out["kept"]} | {d["id"] for d in out["removed"]}
    gz_ids = {i for i, lab in labels.items() if lab["file"] == "crawl-000.warc.gz"}
    plain_ids = {i for i, lab in labels.items() if lab["file"] == "crawl-002.warc"}
    assert read == (gz_ids - cases["corrupt-member.warc.gz"][1]) | (plain_ids - cases["bad-digest.warc"][1])
    assert webdata_main(["run", str(tmp_path / "missing.warc"), "--out", str(tmp_path / "none"), "--quiet"]) == 1


# -- The command line and a Dask cluster ------------------------------------------------------------------------

def test_the_cli_writes_the_crawl_and_no_progress_bar_off_a_tty(tmp_path, capsys):
    assert webdata_main(["crawl", "--out", str(tmp_path / "c"), "--pages", "40", "--seed", "2"]) == 0
    files = sorted(str(p) for p in (tmp_path / "c").glob("crawl-*"))
    assert len(files) == 3 and (tmp_path / "c" / "labels.jsonl").exists()
    capsys.readouterr()
    assert webdata_main(["run", *files, "--out", str(tmp_path / "o"), "--partitions", "3"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "task/s" not in err  # tqdm stays off when stderr is not a terminal
    assert re.fullmatch(r"kept \d+ of 40 documents \(0 read errors\); wrote .*\n", err)
    with pytest.raises(SystemExit):
        webdata_main(["run", *files, "--out", str(tmp_path / "o"), "--near-threshold", "2"])




def test_a_two_worker_cluster_writes_the_same_bytes_as_a_local_run(crawl, outputs, tmp_path, dask_cluster):
    files = [str(p) for p in crawl.warc_files]
    assert webdata_main(["run", *files, "--out", str(tmp_path / "cluster"), "--scheduler", dask_cluster,
                         "--partitions", "6", "--quiet"]) == 0
    assert read_outputs(tmp_path / "cluster")["bytes"] == outputs["bytes"]
    from dask.distributed import Client

    with Client(dask_cluster, timeout="30s") as client:  # both workers ran tasks of the graph
        executed = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert len(executed) == 2 and min(executed.values()) > 0, executed


def test_the_reader_streams_records_so_memory_does_not_grow_with_the_file(tmp_path):
    import io
    import tracemalloc

    import numpy as np
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    rng = np.random.default_rng(0)
    with open(tmp_path / "big.warc.gz", "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for i in range(60):  # 60 records of 200 kB: 12 MB uncompressed
            payload = rng.integers(97, 123, size=200_000, dtype=np.uint8).tobytes()
            http = StatusAndHeaders("200 OK", [("Content-Type", "text/plain")], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(f"http://x.example/{i}", "response",
                                                          payload=io.BytesIO(payload), http_headers=http))
    tracemalloc.start()
    count = sum(1 for item in iter_warc(tmp_path / "big.warc.gz") if not isinstance(item, ReadError))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 60
    assert peak < 3_000_000, peak  # a few records' worth, not the 12 MB of the file
