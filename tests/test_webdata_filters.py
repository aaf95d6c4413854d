"""llmarch.webdata's filters beyond the English defaults: per-language rules, FineWeb's C4 variant,
ExactSubstr keeping the first copy, the order of the Gopher stages, and the new stages (quality
classifier, decontamination, URL filtering), each against brute force or labelled examples."""

from __future__ import annotations

import numpy as np
import pytest

from llmarch.webdata.languages import LANGUAGE_RULES, language_words
from llmarch.webdata.pipeline import PipelineConfig
from llmarch.webdata.quality import (
    c4_filter,
    count_sentences,
    gopher_quality_filter,
    gopher_statistics,
)
from llmarch.webdata.suffix import repeated_spans_across


def _later_windows_brute_force(docs, length):
    """Ranges covered by a window that occurred earlier in the collection, by a set of seen windows."""
    seen, result = set(), []
    for doc in docs:
        covered = [False] * len(doc)
        for i in range(len(doc) - length + 1):
            window = tuple(doc[i:i + length])
            if window in seen:
                covered[i:i + length] = [True] * length
            seen.add(window)
        spans, i = [], 0
        while i < len(doc):
            if covered[i]:
                j = i
                while j < len(doc) and covered[j]:
                    j += 1
                spans.append((i, j))
                i = j
            else:
                i += 1
        result.append(spans)
    return result


def test_keep_first_cuts_only_later_copies_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(60):
        docs = [rng.integers(0, 3, size=int(rng.integers(0, 30))).tolist() for _ in range(int(rng.integers(1, 5)))]
        length = int(rng.integers(1, 5))
        assert repeated_spans_across(docs, length, keep_first=True) == _later_windows_brute_force(docs, length)
    original = list(range(100))
    edited = list(range(60)) + [999] + list(range(61, 100))
    first, second = repeated_spans_across([original, edited], 50, keep_first=True)
    assert first == [] and second == [(0, 60)]  # the original keeps all its text
    assert repeated_spans_across([original, edited], 50) == [[(0, 60)], [(0, 60)]]


GERMAN = ("Die Stadt liegt am Ufer des Flusses und ist seit dem Mittelalter ein wichtiger Ort für den Handel. "
          "Viele Menschen kommen jedes Jahr zu dem großen Markt, der im Herbst auf dem Platz vor der Kirche "
          "stattfindet. Das Rathaus wurde im sechzehnten Jahrhundert gebaut und ist heute ein Museum mit "
          "einer Sammlung von alten Karten und Bildern aus der Region.")
FRENCH = ("La ville se trouve au bord du fleuve et elle est depuis le Moyen Âge un lieu important pour le "
          "commerce. Beaucoup de gens viennent chaque année au grand marché qui a lieu en automne sur la "
          "place devant l'église. L'hôtel de ville a été construit au seizième siècle et il est aujourd'hui "
          "un musée avec une collection de cartes anciennes et de tableaux de la région.")
SPANISH = ("La ciudad está a orillas del río y es desde la Edad Media un lugar importante para el comercio. "
           "Muchas personas vienen cada año al gran mercado que se celebra en otoño en la plaza delante de "
           "la iglesia. El ayuntamiento fue construido en el siglo dieciséis y hoy es un museo con una "
           "colección de mapas antiguos y de cuadros de la región.")
JAPANESE = ("この町は川のほとりにあり、中世から商業の重要な場所でした。毎年秋には教会の前の広場で大きな市場が開かれ、"
            "多くの人が訪れます。市役所は十六世紀に建てられ、今では古い地図や絵を集めた博物館になっています。")
CHINESE = ("这座城市位于河边，从中世纪起就是重要的商业中心。每年秋天，教堂前的广场上都会举行大型集市，"
           "许多人来到这里。市政厅建于十六世纪，现在是一座博物馆，收藏了这个地区的古老地图和绘画。")


@pytest.mark.parametrize("language, text", [("de", GERMAN), ("fr", FRENCH), ("es", SPANISH),
                                            ("ja", JAPANESE), ("zh", CHINESE)])
def test_a_good_page_in_each_language_passes_its_own_rules_and_fails_the_english_ones(language, text):
    assert gopher_quality_filter(text, min_words=50, language=language).keep
    assert c4_filter(text.replace("。", "。\n").replace(". ", ".\n"), language=language).keep
    english = gopher_quality_filter(text, language="en")
    assert not english.keep and "gopher:stop_words" in english.reasons or language in ("ja", "zh")
    assert count_sentences(text, language) == 3


def test_cjk_words_are_characters_and_counts_follow_by_hand():
    assert language_words("東京は sunny です。", "ja") == ["東", "京", "は", "sunny", "で", "す", "。"]
    stats = gopher_statistics(JAPANESE, "ja")
    by_hand = sum(1 for c in JAPANESE if not c.isspace())  # no spaces, every character a word
    assert stats["words"] == by_hand
    assert stats["stop_words"] == len(LANGUAGE_RULES["ja"].stop_words & set(JAPANESE))


def test_a_language_without_rules_is_refused_clearly():
    with pytest.raises(ValueError, match="no quality-filter rules.*'ru'"):
        PipelineConfig(languages=("en", "ru"))
    with pytest.raises(ValueError, match="languages with rules: de, en, es, fr, ja, zh"):
        gopher_statistics("text", "xx")


def test_fineweb_c4_variant_keeps_lines_without_an_end_mark_and_nothing_else_changes():
    page = "\n".join(["Install the package with pip and import it.", "pip install the example-package now",
                      "Then call the main function with your data.", "It returns a list of results.",
                      "See the documentation for details"])
    strict, fineweb = c4_filter(page), c4_filter(page, terminal_punctuation=False)
    assert strict.text.splitlines() == [page.splitlines()[i] for i in (0, 2, 3)]
    assert fineweb.text == page
    assert c4_filter("Short line\n" + page, terminal_punctuation=False).text == page  # 2 words: still dropped


def test_the_cheap_gopher_rules_run_first_and_the_costly_ones_never_see_a_huge_page(monkeypatch):
    from llmarch.webdata import pipeline, stages

    def costly(*args, **kwargs):
        raise AssertionError("the repetition statistics ran on a page the word count rejects")

    monkeypatch.setattr(stages, "gopher_repetition_filter", costly)
    sentence = ("The town lies on the bank of the river and has been a place for trade since the middle "
                "ages, with a market in the square every autumn. ")
    huge = sentence * 4000  # 104k words on one line
    doc = pipeline.Document("id", "u", "s", 0, (0, 0), text=huge)
    out = pipeline.document_stages(doc, PipelineConfig(min_language_probability=0.0))
    assert (out.removed_by, out.reasons) == ("gopher_quality", ("gopher:word_count",))
    assert pipeline.STAGES.index("gopher_quality") < pipeline.STAGES.index("gopher_repetition")


# -- The quality classifier ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crawl_texts(tmp_path_factory):
    """(text, label) of the synthetic crawl's pages with text: True for clean articles and their copies,
    False for spam and low-quality pages (the crawl's hidden labels)."""
    from warcio.archiveiterator import ArchiveIterator

    from llmarch.webdata.crawl import read_labels, write_synthetic_crawl
    from llmarch.webdata.decode import extract_text

    crawl = write_synthetic_crawl(tmp_path_factory.mktemp("crawl"), n_pages=240, seed=3)
    kinds = {label["id"]: label["kind"] for label in read_labels(crawl.labels)}
    good, bad = ("clean", "exact-duplicate", "near-duplicate"), ("spam", "low-quality")
    rows = []
    for path in crawl.warc_files:
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                kind = kinds.get(record.rec_headers.get_header("WARC-Record-ID"))
                if kind in good + bad:
                    text = extract_text(record.content_stream().read(), "text/html")
                    if text:
                        rows.append((text, kind in good))
    return rows


def _dense_features(texts, buckets):
    """The classifier's features rebuilt independently: CRC-32 buckets of unigrams and bigrams, L2-normed."""
    import re
    import zlib

    matrix = np.zeros((len(texts), buckets))
    for i, text in enumerate(texts):
        words = re.findall(r"\w+", text.lower())
        for gram in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            matrix[i, zlib.crc32(gram.encode()) % buckets] += 1
        matrix[i] /= np.linalg.norm(matrix[i]) or 1.0
    return matrix


def test_the_classifier_reaches_the_logistic_regression_optimum_found_by_newton():
    from llmarch.webdata.classifier import train_quality_classifier

    good = ["the cat sat on the mat and purred", "a long essay on the history of the river town",
            "notes on pruning roses in early spring"]
    bad = ["buy cheap pills now click here", "casino bonus casino bonus win win", "login register cart"]
    buckets, l2 = 32, 0.01
    model = train_quality_classifier(good, bad, buckets=buckets, l2=l2, steps=3000, lr=0.05)
    x = np.hstack([_dense_features(good + bad, buckets), np.ones((6, 1))])
    y = np.array([1.0] * 3 + [0.0] * 3)
    w = np.zeros(buckets + 1)
    reg = np.diag([l2] * buckets + [0.0])
    for _ in range(50):  # Newton's method on the same loss: classes weighted 1/2 each, mean within a class
        p = 1 / (1 + np.exp(-x @ w))
        s = np.full(6, 1 / 6)
        grad = x.T @ (s * (p - y)) + reg @ w
        hess = x.T @ (x * (s * p * (1 - p))[:, None]) + reg + 1e-12 * np.eye(buckets + 1)
        w -= np.linalg.solve(hess, grad)
    assert np.allclose(model.weights, w[:-1], atol=2e-3) and abs(model.bias - w[-1]) < 2e-3


def test_the_classifier_separates_held_out_clean_pages_from_spam(crawl_texts):
    from llmarch.webdata.classifier import precision_recall, quality_classifier_filter, train_quality_classifier

    train, test = crawl_texts[0::2], crawl_texts[1::2]
    model = train_quality_classifier([t for t, good in train if good], [t for t, good in train if not good])
    scores = model.score([t for t, _ in test])
    precision, recall = precision_recall(scores, [good for _, good in test], 0.5)
    assert sum(not good for _, good in test) >= 10
    assert precision >= 0.95 and recall >= 0.9, (precision, recall)
    text, good = next(row for row in test if not row[1])
    assert quality_classifier_filter(text, model, 0.5).reasons == (
        () if model.score([text])[0] >= 0.5 else ("quality_model:low_score",))


# -- Decontamination -----------------------------------------------------------------------------------------

QUESTION = ("Which planet in the solar system has the longest day, measured from one sunrise to the next "
            "sunrise as seen from its surface?")


def test_decontamination_cuts_every_benchmark_13_gram_and_reports_the_spans(tmp_path):
    import json

    from llmarch.webdata.decontaminate import decontaminate, decontamination_filter, load_benchmark

    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question": QUESTION, "answer": "Venus"}) + "\n")
    ngrams = load_benchmark(bench)
    before, after = "A" * 300 + " some words here. ", " and then more text follows. " + "B" * 300
    text = before + QUESTION.upper().replace(",", " ;") + after  # case and punctuation do not hide it
    result = decontaminate(text, ngrams)
    start, end = text.index("WHICH PLANET"), text.index("SURFACE") + len("SURFACE")  # first and last word
    assert result.removed == ((start - 200, end + 200),)
    assert len(result.ngrams) == len(QUESTION.split()) - 12 and result.pieces == 2
    words = result.text.lower().split()
    assert not any(tuple(words[i:i + 13]) in ngrams for i in range(len(words)))
    clean = "Venus rotates slowly. " * 20
    assert decontaminate(clean, ngrams).text == clean  # no 13-gram in common: untouched
    many = (QUESTION + " " + "x" * 450 + " ") * 12
    assert decontamination_filter(many, ngrams).reasons == ("decontamination:too_many_pieces",)
    with pytest.raises(FileNotFoundError):
        load_benchmark(tmp_path / "missing.jsonl")


def _brute_words(text, rule):
    """Words by the definitions, character by character: ``w+`` runs of word characters; GPT-3's
    whitespace-delimited tokens with the punctuation characters deleted (empty ones dropped)."""
    import unicodedata
    out, current = [], ""
    if rule == "w+":
        for c in text.lower() + " ":
            if c.isalnum() or c == "_":
                current += c
            elif current:
                out, current = out + [current], ""
        return out
    for token in text.lower().split():
        word = "".join(c for c in token if not unicodedata.category(c).startswith("P"))
        out += [word] if word else []
    return out


TOY_BENCHMARK = ["The U.S. Senate's rules don't allow a filibuster on budget reconciliation bills, "
                 "as the parliamentarian ruled in 2021.",
                 "Which planet is hottest?",
                 "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
                 "software and associated documentation files."]


@pytest.mark.parametrize("rule", ["w+", "gpt3"])
def test_benchmark_ngrams_follow_each_word_rule(rule):
    from llmarch.webdata.decontaminate import benchmark_ngrams

    expected = set()
    for item in TOY_BENCHMARK:
        words = _brute_words(item, rule)
        expected |= {tuple(words[i:i + 13]) for i in range(len(words) - 12)}
    assert benchmark_ngrams(TOY_BENCHMARK, words=rule) == expected
    # the two rules disagree on "U.S." (u, s / us) and "don't" (don, t / dont): different 13-grams
    other = benchmark_ngrams(TOY_BENCHMARK, words="gpt3" if rule == "w+" else "w+")
    assert expected != other


def test_short_items_are_matched_whole():
    from llmarch.webdata.decontaminate import benchmark_ngrams, decontaminate

    default, whole = benchmark_ngrams(TOY_BENCHMARK), benchmark_ngrams(TOY_BENCHMARK, short_items=True)
    short = ("which", "planet", "is", "hottest")
    assert short not in default and whole - default == {short}       # 4 words: no 13-gram, matched whole
    page = "Filler text about astronomy. " * 15 + "Quiz: which planet is HOTTEST? Venus. " + "More filler. " * 20
    assert decontaminate(page, default).ngrams == ()                 # never found without the option
    result = decontaminate(page, whole)
    start = page.index("which")
    assert result.ngrams == (short,) and result.removed == ((start - 200, page.index("HOTTEST") + 7 + 200),)


def test_ngrams_of_more_than_ten_training_documents_are_ignored():
    from llmarch.webdata.decontaminate import benchmark_ngrams, decontaminate, drop_frequent_ngrams

    ngrams = benchmark_ngrams(TOY_BENCHMARK)
    licence = TOY_BENCHMARK[2]
    senate = TOY_BENCHMARK[0]
    documents = [f"Project {i}. {licence} The software is provided as is." for i in range(11)]
    documents += [f"News {i}: {senate}" for i in range(3)]
    kept = drop_frequent_ngrams(ngrams, documents)
    # brute force: a gram is dropped iff more than 10 documents contain it as consecutive words
    def in_doc(gram, doc):
        words = _brute_words(doc, "w+")
        return any(tuple(words[i:i + len(gram)]) == gram for i in range(len(words)))
    assert kept == {g for g in ngrams if sum(in_doc(g, d) for d in documents) <= 10}
    assert not any(in_doc(g, licence) for g in kept) and any(in_doc(g, senate) for g in kept)
    assert decontaminate(documents[0], kept).ngrams == ()               # the licence no longer cuts a page
    assert drop_frequent_ngrams(ngrams, documents, max_documents=11) == ngrams


# -- URL filtering -------------------------------------------------------------------------------------------

def test_url_filter_on_labelled_urls(tmp_path):
    from llmarch.webdata.urlfilter import UrlFilter, load_domain_list

    (tmp_path / "block.txt").write_text("# adult and malware\nbad-site.example\n*.malware.test\n")
    url_filter = UrlFilter(load_domain_list(tmp_path / "block.txt"), hard_words={"xxx"},
                           soft_words={"cheap": 1, "pills": 1, "casino": 2})
    labelled = {
        "https://www.bad-site.example/page": "url:blocked_domain",
        "http://cdn.malware.test/x.js": "url:blocked_domain",
        "https://not-bad-site.example/": None,  # a suffix of the name, not a parent domain
        "https://example.org/xxx-videos": "url:hard_word",
        "https://example.org/xxxl-shirts": None,  # a word, not a substring
        "https://shop.example/cheap-pills": "url:soft_words",
        "https://shop.example/cheap-flights": None,  # one soft word is not enough
        "https://casino.example/rules": "url:soft_words",  # weight 2
    }
    for url, reason in labelled.items():
        assert url_filter(url).reason == reason, url


def test_the_pipeline_runs_the_new_stages_on_labelled_pages(tmp_path, crawl_texts):
    from llmarch.webdata.classifier import train_quality_classifier
    from llmarch.webdata.crawl import read_labels, write_synthetic_crawl
    from llmarch.webdata.decontaminate import benchmark_ngrams
    from llmarch.webdata.pipeline import run_pipeline
    from llmarch.webdata.urlfilter import UrlFilter

    crawl = write_synthetic_crawl(tmp_path, n_pages=60, seed=4)
    labels = read_labels(crawl.labels)
    site = next(label["url"].split("/")[2] for label in labels if label["kind"] == "clean")
    model = train_quality_classifier([t for t, good in crawl_texts if good], [t for t, good in crawl_texts
                                                                                 if not good])
    config = PipelineConfig(url_filter=UrlFilter({site}), quality_model=model, quality_threshold=0.5,
                            benchmark_ngrams=benchmark_ngrams([QUESTION]))
    docs = {d.id: d for d in run_pipeline([str(p) for p in crawl.warc_files], config).documents}
    on_site = {label["id"] for label in labels if label["url"].split("/")[2] == site}
    removed_by_url = {i for i, d in docs.items() if d.removed_by == "url"}
    extracted = {i for i, d in docs.items() if d.removed_by != "extract"}
    assert removed_by_url == on_site & extracted and removed_by_url
    spam = [d for i, d in docs.items() if d.removed_by == "quality_model"]
    kinds = {label["id"]: label["kind"] for label in labels}
    assert all(kinds[d.id] in ("spam", "low-quality") for d in spam)


def test_the_cli_refuses_a_language_without_rules_and_a_missing_list(tmp_path, capsys):
    from llmarch.webdata.__main__ import main

    for extra in (["--languages", "en", "ru"], ["--url-blocklist", str(tmp_path / "none.txt")],
                  ["--benchmark", str(tmp_path / "none.jsonl")]):
        with pytest.raises(SystemExit):
            main(["run", str(tmp_path / "x.warc"), "--out", str(tmp_path / "o"), *extra])
        err = capsys.readouterr().err
        assert "'ru'" in err or "not found" in err, err
