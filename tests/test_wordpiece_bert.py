"""llmarch's WordPiece against BERT's tokenizer in ``transformers`` (its Python ``BertTokenizerLegacy`` and its
Rust-backed ``BertTokenizer``) and Hugging Face ``tokenizers``' ``WordPiece`` model, built from the same vocab.

The first tests port a subset of transformers' own BERT tokenizer tests (huggingface/transformers,
``tests/models/bert/test_tokenization_bert.py`` at commit c8dfc84e, Apache-2.0), with their vocabulary and
expected values: ``test_full_tokenizer``, ``test_chinese``, the seven ``test_basic_tokenizer_*`` cases,
``test_wordpiece_tokenizer``, ``test_is_whitespace`` / ``test_is_control`` / ``test_is_punctuation``,
``test_clean_text`` and ``test_change_tokenize_chinese_chars``. Upstream's ``BasicTokenizer`` is
``llmarch.tokenizers.wordpiece._bert_pretokenize`` here; its ``never_split`` is llmarch's ``special_tokens``
(kept whole wherever they appear in the text). Not ported: offsets, pretrained checkpoints (no hub), and the
pair/special-token builders (llmarch adds no [CLS]/[SEP]).
"""

import random
import warnings

import pytest

from llmarch.tokenizers import WordPieceTokenizer
from llmarch.tokenizers.wordpiece import _bert_clean, _bert_is_whitespace, _bert_pretokenize, _is_punctuation

transformers = pytest.importorskip("transformers", reason="transformers (the test extra) is not installed")
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers  # noqa: E402
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy  # noqa: E402

UPSTREAM_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "want", "##want", "##ed", "wa", "un", "runn",
                  "##ing", ",", "low", "lowest"]
SPECIALS = ["[CLS]", "[SEP]", "[PAD]", "[MASK]"]
MESSY = " \tHäLLo!how  \n Are yoU?  "


# ---- ported from transformers' tests/models/bert/test_tokenization_bert.py


def test_full_tokenizer():
    tok = WordPieceTokenizer(UPSTREAM_VOCAB, lowercase=True)
    tokens = tok.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert [tok.vocab[t] for t in tokens] == [9, 6, 7, 12, 10, 11]


def test_chinese():
    assert _bert_pretokenize("ah\u535a\u63a8zz", lowercase=True) == ["ah", "\u535a", "\u63a8", "zz"]


@pytest.mark.parametrize("lowercase,strip_accents,expected,hello", [
    (True, None, ["hallo", "!", "how", "are", "you", "?"], "hello"),  # lower / lower_strip_accents_default
    (True, True, ["hallo", "!", "how", "are", "you", "?"], "hello"),
    (True, False, ["hällo", "!", "how", "are", "you", "?"], "h\u00e9llo"),
    (False, None, ["HäLLo", "!", "how", "Are", "yoU", "?"], "H\u00e9llo"),  # no_lower
    (False, False, ["HäLLo", "!", "how", "Are", "yoU", "?"], "H\u00e9llo"),
    (False, True, ["HaLLo", "!", "how", "Are", "yoU", "?"], "Hello"),
])
def test_basic_tokenizer(lowercase, strip_accents, expected, hello):
    assert _bert_pretokenize(MESSY, lowercase, strip_accents) == expected
    assert _bert_pretokenize("H\u00e9llo", lowercase, strip_accents) == [hello]


def test_basic_tokenizer_respects_never_split_tokens():
    words = ["HeLLo", "!", "how", "Are", "yoU", "?"]
    tok = WordPieceTokenizer(["[UNK]", *words])
    assert tok.tokenize(" \tHeLLo!how  \n Are yoU? [UNK]") == [*words, "[UNK]"]


def test_basic_tokenizer_splits_on_punctuation():
    expected = ["a", "'", "ll", "!", "!", "to", "?", "'", "d", "of", ",", "can", "'", "t", "."]
    assert _bert_pretokenize("a\n'll !!to?'d of, can't.", lowercase=True) == expected


def test_wordpiece_tokenizer():
    tok = WordPieceTokenizer(["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing"])
    assert tok.tokenize("") == []
    assert tok.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert tok.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]


def test_is_whitespace_control_punctuation():
    assert all(_bert_is_whitespace(ch) for ch in " \t\r\n\u00a0")
    assert not any(_bert_is_whitespace(ch) for ch in "A-")
    assert _bert_clean("\u0005") == "" and _bert_clean("A \t\r") == "A   "  # a control character is dropped
    assert all(_is_punctuation(ch) for ch in "-$`.") and not any(_is_punctuation(ch) for ch in "A ")


def test_clean_text():
    tok = WordPieceTokenizer(UPSTREAM_VOCAB, lowercase=True)
    assert [tok.tokenize(t) for t in ["Test", "\xad", "test"]] == [["[UNK]"], [], ["[UNK]"]]


def test_change_tokenize_chinese_chars():
    chars = ["的", "人", "有"]
    vocab = ["[UNK]", *chars, *(f"##{c}" for c in chars)]
    assert WordPieceTokenizer(vocab).tokenize("".join(chars)) == chars
    split_off = WordPieceTokenizer(vocab, tokenize_chinese_chars=False)
    assert split_off.tokenize("".join(chars)) == ["的", "##人", "##有"]


# ---- differential: the same vocab file in transformers and tokenizers


@pytest.fixture(scope="module")
def bert_vocab(tmp_path_factory):
    """A 1,500-token vocabulary trained by llmarch on the Python documentation, written as BERT's vocab.txt."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))[:100_000]
    tokens = WordPieceTokenizer().train(text, 1500, special_tokens=["[UNK]", *SPECIALS])._id_to_token
    path = tmp_path_factory.mktemp("bert") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return tokens, path


def _texts(n: int, seed: int) -> list[str]:
    """Random and adversarial text: cased letters, punctuation, whitespace and control characters, soft hyphen,
    zero-width space, U+FFFD, combining accents, ß, dotted/dotless i, CJK, emoji, a ligature, special tokens
    inside words, words over 100 characters."""
    alphabet = list("etaoinshrdlu ETAOIN") * 3 + list(" .,!?'-$`\t\n\r\x00\x05\xad\u200b\ufffd\u00a0\u3000"
                                                       "éÉe\u0301ßİı日本語🙂ﬁ")
    rng = random.Random(seed)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(n)]
    return texts + [MESSY, "UNwant\u00e9d,running", "x[CLS]y [MASK]z", "a" * 150, "Ab" * 60 + " ok"]


@pytest.mark.parametrize("lowercase,strip_accents,chinese", [
    (True, None, True), (False, None, True), (True, False, True), (False, True, False)])
def test_tokens_and_ids_equal_transformers_bert(bert_vocab, lowercase, strip_accents, chinese):
    """transformers' Python and Rust BERT tokenizers agree with each other here, and llmarch with both."""
    tokens, path = bert_vocab
    options = dict(do_lower_case=lowercase, strip_accents=strip_accents, tokenize_chinese_chars=chinese)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        python_bert = BertTokenizerLegacy(str(path), **options)
        rust_bert = transformers.BertTokenizer(str(path), **options)
    ours = WordPieceTokenizer(tokens, lowercase=lowercase, special_tokens=SPECIALS, strip_accents=strip_accents,
                              tokenize_chinese_chars=chinese)
    for text in _texts(700, seed=int(lowercase) + 2 * int(chinese)):
        expected = python_bert.tokenize(text)
        assert rust_bert.tokenize(text) == expected, repr(text)
        assert ours.tokenize(text) == expected, repr(text)
        assert ours.encode(text) == rust_bert.encode(text, add_special_tokens=False), repr(text)


def test_max_input_chars_per_word_equals_tokenizers_wordpiece(bert_vocab):
    """``tokenizers``' WordPiece model with BERT's normaliser and pre-tokeniser and a 6-character limit."""
    tokens, _ = bert_vocab
    rust = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                      max_input_chars_per_word=6))
    rust.normalizer = normalizers.BertNormalizer(lowercase=True)
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    ours = WordPieceTokenizer(tokens, lowercase=True, max_input_chars_per_word=6)
    for text in _texts(300, seed=9):
        assert ours.encode(text) == rust.encode(text).ids, repr(text)


def test_options_survive_save_and_load(bert_vocab, tmp_path):
    tokens, _ = bert_vocab
    tok = WordPieceTokenizer(tokens, lowercase=True, strip_accents=False, tokenize_chinese_chars=False)
    tok.save(tmp_path / "wp.json")
    again = WordPieceTokenizer.load(tmp_path / "wp.json")
    assert (again.strip_accents, again.tokenize_chinese_chars) == (False, False)
    for text in _texts(50, seed=3):
        assert again.tokenize(text) == tok.tokenize(text)
    with pytest.raises(TypeError, match="strip_accents"):
        WordPieceTokenizer(tokens, strip_accents="yes")
