"""llmarch's Unigram against SentencePiece itself: models trained here by ``sentencepiece`` are loaded with
``UnigramTokenizer.from_sentencepiece`` and must give SentencePiece's ids and text.

The last tests port a subset of SentencePiece's own Python tests (google/sentencepiece,
``python/test/sentencepiece_test.py`` at commit 362d1c2e, Apache-2.0): ``test_load`` (the id layout, and every
id's piece maps back to it), ``test_roundtrip`` (``"I saw a girl with a telescope."`` decodes back from its
ids and from 100 sampled segmentations at alpha 0.5) and ``test_train`` (every training line). Upstream runs
them on models it ships, trained with the ``nmt_nfkc`` normaliser, which llmarch does not implement; here
the same cases run on models trained in the test with the ``identity`` normaliser. Not ported: n-best lists,
serialized and immutable protos, offsets, user-defined symbols (llmarch has none of them).
"""

import random
from collections import Counter

import pytest

spm = pytest.importorskip("sentencepiece", reason="sentencepiece (the test extra) is not installed")

from llmarch.tokenizers import UnigramTokenizer  # noqa: E402

SETTINGS = {  # name -> trainer options beyond the shared ones
    "keeps spaces": {"remove_extra_whitespaces": False},
    "sentencepiece's defaults": {},
    "no dummy prefix, pieces across spaces": {"add_dummy_prefix": False, "split_by_whitespace": False},
}
ADVERSARIAL = [
    "", " ", "   ", "a", " leading", "trailing  ", "two  spaces   three", "\ttab\tand\nnewline", "x\u00a0y",
    "--------------------", "====== ====== ======", "1234567890 3.14159 0x1F", "日本語のテキスト QQQ",
    "🙂🙂 emoji 🙂",
    "a\u2581b \u2581\u2581", "\u2581\u2581a", "a \u2581 b", " \u2581 ", "supercalifragilisticexpialidocious" * 3,
    "Zzzzzzz ZZZZ zz", "é e\u0301 ß",
    "I saw a girl with a telescope.",
]


def _corpus() -> str:
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def _random_texts(n: int, seed: int) -> list[str]:
    """Short strings over letters, spaces, ``▁``, repeated symbols, digits and characters no model has."""
    alphabet = list("etaoinshrdlu") * 4 + list("  ") * 6 + list("\u2581--==..0123456789\t\nQZ日本🙂é\u0301")
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))) for _ in range(n)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``{setting: (model path, SentencePieceProcessor)}``, each trained on 120,000 characters."""
    folder = tmp_path_factory.mktemp("sentencepiece")
    (folder / "train.txt").write_text(_corpus()[:120_000], encoding="utf-8")
    out = {}
    for k, (name, options) in enumerate(SETTINGS.items()):
        prefix = folder / f"m{k}"
        spm.SentencePieceTrainer.train(input=str(folder / "train.txt"), model_prefix=str(prefix), vocab_size=600,
                                       model_type="unigram", normalization_rule_name="identity", num_threads=1,
                                       minloglevel=2, **options)
        out[name] = (prefix.with_suffix(".model"), spm.SentencePieceProcessor(model_file=str(prefix) + ".model"))
    return out


@pytest.fixture(scope="module")
def held_out_lines():
    return [line for line in _corpus()[200_000:260_000].split("\n") if line][:1500]


@pytest.mark.parametrize("setting", SETTINGS)
def test_ids_equal_sentencepiece(models, held_out_lines, setting):
    """Held-out lines and adversarial text (unknown characters and runs of them, spaces everywhere, ties
    between equal-scored segmentations such as runs of '-'): llmarch's ids are SentencePiece's."""
    path, sp = models[setting]
    tok = UnigramTokenizer.from_sentencepiece(path)
    for text in held_out_lines + ADVERSARIAL + _random_texts(400, seed=len(setting)):
        assert tok.encode(text) == sp.encode(text), repr(text)


@pytest.mark.parametrize("setting", SETTINGS)
def test_decode_equals_sentencepiece(models, held_out_lines, setting):
    """The text of encoded lines and of random id sequences (control and unknown ids included)."""
    path, sp = models[setting]
    tok = UnigramTokenizer.from_sentencepiece(path)
    for text in held_out_lines[:300] + ADVERSARIAL + _random_texts(200, seed=7):
        ids = sp.encode(text)
        assert tok.decode(ids) == sp.decode(ids), repr(text)
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.choice([0, 1, 2, rng.randrange(sp.get_piece_size())]) for _ in range(rng.randrange(1, 8))]
        assert tok.decode(ids) == sp.decode(ids), ids


def test_model_bytes_save_and_load(models, tmp_path):
    path, sp = models["sentencepiece's defaults"]
    tok = UnigramTokenizer.from_sentencepiece(sp.serialized_model_proto())
    tok.save(tmp_path / "u.json")
    again = UnigramTokenizer.load(tmp_path / "u.json")
    for text in ADVERSARIAL:
        assert tok.encode(text) == again.encode(text) == sp.encode(text), repr(text)


def test_sampling_follows_sentencepiece_distribution(models):
    """Subword regularisation: llmarch's draws and SentencePiece's (``enable_sampling``, all segmentations,
    the same alpha) have the same distribution over the segmentations of a short text (total variation
    distance of 4,000 draws each, below 0.06)."""
    path, sp = models["keeps spaces"]
    tok = UnigramTokenizer.from_sentencepiece(path)
    text, alpha, n = " variables", 0.2, 4000
    rng = random.Random(1)
    ours = Counter(tuple(tok.encode(text, alpha=alpha, seed=rng)) for _ in range(n))
    spm.set_random_generator_seed(1)
    theirs = Counter(tuple(sp.encode(text, enable_sampling=True, alpha=alpha, nbest_size=-1)) for _ in range(n))
    assert len(theirs) > 5
    distance = sum(abs(ours[s] - theirs[s]) for s in set(ours) | set(theirs)) / (2 * n)
    assert distance < 0.06, (distance, ours.most_common(5), theirs.most_common(5))


def test_unsupported_models_are_refused_by_name(tmp_path):
    (tmp_path / "train.txt").write_text(_corpus()[:60_000], encoding="utf-8")

    def train(name, **options):
        spm.SentencePieceTrainer.train(input=str(tmp_path / "train.txt"), model_prefix=str(tmp_path / name),
                                       vocab_size=400, num_threads=1, minloglevel=2, **options)
        return tmp_path / f"{name}.model"

    for options, message in [
        ({}, "normaliser is 'nmt_nfkc'"),
        ({"normalization_rule_name": "identity", "model_type": "bpe"}, "bpe model"),
        ({"normalization_rule_name": "identity", "byte_fallback": True}, "byte fallback"),
        ({"normalization_rule_name": "identity", "user_defined_symbols": ["foo"]}, "user-defined pieces"),
        ({"normalization_rule_name": "identity", "treat_whitespace_as_suffix": True}, "treat_whitespace_as_suffix"),
        ({"normalization_rule_name": "identity", "unk_id": 2, "eos_id": 0}, "<unk> at id 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            UnigramTokenizer.from_sentencepiece(train(f"m{len(message)}", **options))
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        UnigramTokenizer.from_sentencepiece(b"\x0a\x05hello\xff\xff")
    with pytest.raises(TypeError, match="path or bytes"):
        UnigramTokenizer.from_sentencepiece(None)
    with pytest.raises(FileNotFoundError, match="no SentencePiece model file"):
        UnigramTokenizer.from_sentencepiece(tmp_path / "missing.model")


# ---- ported from SentencePiece's python/test/sentencepiece_test.py


def test_load(models):
    path, sp = models["sentencepiece's defaults"]
    tok = UnigramTokenizer.from_sentencepiece(path)
    assert tok.vocab_size == sp.get_piece_size() == 600
    assert (tok.vocab["<unk>"], tok.vocab["<s>"], tok.vocab["</s>"]) == (0, 1, 2)
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    for i in range(sp.get_piece_size()):
        assert tok.vocab[sp.id_to_piece(i)] == i


def test_roundtrip(models):
    path, sp = models["sentencepiece's defaults"]
    tok = UnigramTokenizer.from_sentencepiece(path)
    text = "I saw a girl with a telescope."
    ids = tok.encode(text)
    assert ids == sp.encode(text) and tok.decode(ids) == text == sp.decode(ids)
    rng = random.Random(0)
    for _ in range(100):
        assert tok.decode(tok.encode(text, alpha=0.5, seed=rng)) == text


def test_train(models):
    path, sp = models["sentencepiece's defaults"]
    tok = UnigramTokenizer.from_sentencepiece(path)
    for line in _corpus()[:120_000].split("\n")[:400]:
        ids = tok.encode(line)
        assert ids == sp.encode(line) and tok.decode(ids) == sp.decode(ids), repr(line)


def test_training_uses_the_tokenizers_own_normaliser():
    """Trained with SentencePiece's whitespace rule and control tokens, llmarch keeps both: EM counts the words
    of the collapsed text (no word that is a lone ``▁``), ids 1 and 2 are the control tokens and never come
    out of ``encode``."""
    text = "  the cat   sat on  the mat  \n the  dog sat   on the log " * 40
    tok = UnigramTokenizer(control_tokens=["<s>", "</s>"], remove_extra_whitespaces=True)
    assert tok._word_counts(text) == Counter("\u2581" + w for w in text.split(" ") if w)
    tok.train(text, 40)
    assert tok.vocab["<s>"] == 1 and tok.vocab["</s>"] == 2
    ids = tok.encode("  the   cat sat  ")
    assert 1 not in ids and 2 not in ids and tok.decode(ids) == "the cat sat"
