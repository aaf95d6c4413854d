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
    gopher_repetition_filter,
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
    for _ in range(200):
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
    from llmarch.webdata import pipeline

    def costly(*args, **kwargs):
        raise AssertionError("the repetition statistics ran on a page the word count rejects")

    monkeypatch.setattr(pipeline, "gopher_repetition_filter", costly)
    sentence = ("The town lies on the bank of the river and has been a place for trade since the middle "
                "ages, with a market in the square every autumn. ")
    huge = sentence * 4000  # 104k words on one line
    doc = pipeline.Document("id", "u", "s", 0, (0, 0), text=huge)
    out = pipeline.document_stages(doc, PipelineConfig(min_language_probability=0.0))
    assert (out.removed_by, out.reasons) == ("gopher_quality", ("gopher:word_count",))
    assert pipeline.STAGES.index("gopher_quality") < pipeline.STAGES.index("gopher_repetition")
