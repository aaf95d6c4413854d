"""llmarch.tokenizers' tiktoken interface (Encoding, get_encoding, encoding_for_model) against tiktoken itself.

Every encoding tiktoken 0.14 ships is compared, method by method, with tiktoken's own ``Encoding`` built offline
from the same files (see ``tiktoken_oracles`` in test_tokenizers_openai.py: tiktoken's constructors, its
downloads redirected to the installed files, the sha256 it pins checked). tiktoken's own test suite runs in
tests/tiktoken_suite/.
"""

import base64
import hashlib
import pickle
import random

import pytest

from test_tokenizers_openai import TEXTS, tiktoken, tiktoken_oracles  # noqa: F401  (skips without tiktoken)

import llmarch.tokenizers as ours  # noqa: E402
from tiktoken import model as tiktoken_model  # noqa: E402

NAMES = ours.list_encoding_names()
PINNED_SHA256 = {  # tiktoken_ext/openai_public.py of tiktoken 0.14
    "r50k_base": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "p50k_base": "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
}


@pytest.fixture(scope="module")
def oracles(tmp_path_factory):
    return tiktoken_oracles(NAMES, tmp_path_factory.mktemp("tiktoken-files"))


def test_every_tiktoken_encoding_is_listed():
    from tiktoken_ext import openai_public

    assert sorted(NAMES) == sorted(openai_public.ENCODING_CONSTRUCTORS)


@pytest.mark.parametrize("name", sorted(PINNED_SHA256))
def test_derived_rank_files_have_tiktoken_pinned_hash(name):
    """r50k's ranks (GPT-2's encoder.json) and p50k's (plus the runs of 2 to 25 spaces), written in tiktoken's
    format, are byte for byte the files tiktoken downloads."""
    ranks = sorted(ours.encoding_spec(name)["mergeable_ranks"].items(), key=lambda item: item[1])
    data = b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks)
    assert hashlib.sha256(data).hexdigest() == PINNED_SHA256[name]


@pytest.mark.parametrize("name", NAMES)
def test_vocabulary_attributes_equal_tiktoken(oracles, name):
    enc, ref = ours.get_encoding(name), oracles[name]
    assert ours.get_encoding(name) is enc and repr(enc) == repr(ref)
    assert (enc.name, enc.n_vocab, enc.max_token_value, enc.eot_token) == (
        ref.name, ref.n_vocab, ref.max_token_value, ref.eot_token)
    assert enc.special_tokens_set == ref.special_tokens_set and enc._special_tokens == ref._special_tokens
    assert enc._mergeable_ranks == ref._mergeable_ranks and enc._pat_str == ref._pat_str
    assert enc.token_byte_values() == ref.token_byte_values()
    for special, i in ref._special_tokens.items():
        assert enc.encode_single_token(special) == i and enc.is_special_token(i) and not enc.is_special_token(0)
        assert enc.decode_single_token_bytes(i) == ref.decode_single_token_bytes(i)  # 200018: two names


@pytest.mark.parametrize("name", NAMES)
def test_encode_and_decode_equal_tiktoken(oracles, name):
    enc, ref = ours.get_encoding(name), oracles[name]
    texts = TEXTS["scripts"] + TEXTS["stress"] + TEXTS["stdlib"][:4]
    assert enc.encode_ordinary_batch(texts) == ref.encode_ordinary_batch(texts)
    assert enc.encode_batch(texts, disallowed_special=()) == ref.encode_batch(texts, disallowed_special=())
    specials = sorted(ref.special_tokens_set)[:3]
    text = f"a{specials[0]}b {specials[-1]}\n<|endof {specials[0]}"
    for allowed in ("all", set(), {specials[-1]}):
        for disallowed in ((), "all", {specials[0]}):
            try:
                expected = ref.encode(text, allowed_special=allowed, disallowed_special=disallowed)
            except ValueError:
                with pytest.raises(ValueError):
                    enc.encode(text, allowed_special=allowed, disallowed_special=disallowed)
                continue
            assert enc.encode(text, allowed_special=allowed, disallowed_special=disallowed) == expected
            assert enc.encode_to_numpy(text, allowed_special=allowed, disallowed_special=disallowed).tolist() == \
                expected
    ids = ref.encode(texts[3] + text, allowed_special="all")
    assert enc.decode(ids) == ref.decode(ids) and enc.decode_bytes(ids) == ref.decode_bytes(ids)
    assert enc.decode_tokens_bytes(ids) == ref.decode_tokens_bytes(ids)
    assert enc.decode_batch([ids, ids[:7]]) == ref.decode_batch([ids, ids[:7]])
    assert enc.decode_bytes_batch([ids[:5]]) == ref.decode_bytes_batch([ids[:5]])


@pytest.mark.parametrize("name", ["r50k_base", "p50k_edit", "cl100k_base", "o200k_base"])
def test_bytes_and_single_pieces_equal_tiktoken(oracles, name):
    """``_encode_bytes`` on bytes with an invalid UTF-8 tail (after words, after whitespace runs), the
    unsplit ``_encode_single_piece`` and the Python-split ``_encode_only_native_bpe``."""
    enc, ref = ours.get_encoding(name), oracles[name]
    rng = random.Random(5)
    heads = [b"", b"hello world", b"hello   ", b"x\n\n  \t", "caf\u00e9 \u65e5\u672c".encode(), b"a  \n  b "]
    tails = [b"", b"\x80", b"\xe6\x97", b"\xff\xfe", b"\xf0\x9f\x99", b" \x80abc", b"\xec\x8b\xa4\xed"]
    for head in heads:
        for tail in tails:
            assert enc._encode_bytes(head + tail) == ref._encode_bytes(head + tail), head + tail
    for _ in range(300):
        data = bytes(rng.choice(b" \n\tab\x80\xc3\xa9\xe6\x97\xa5\xff") for _ in range(rng.randint(1, 12)))
        assert enc._encode_bytes(data) == ref._encode_bytes(data), data
        assert enc._encode_single_piece(data) == ref._encode_single_piece(data), data
    text = TEXTS["stdlib"][2][:3000]
    assert enc._encode_only_native_bpe(text) == ref._encode_only_native_bpe(text)


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_harmony"])
def test_offsets_and_errors_equal_tiktoken(oracles, name):
    enc, ref = ours.get_encoding(name), oracles[name]
    for text in TEXTS["scripts"]:
        ids = ref.encode(text)
        assert enc.decode_with_offsets(ids) == ref.decode_with_offsets(ids)
    # an id no token has: KeyError; one that is not an unsigned 32-bit integer: OverflowError (tiktoken's Rust)
    for unknown, error in ((ref.n_vocab + 5, KeyError), (-1, OverflowError), (2**32 + 1, OverflowError)):
        for call in ("decode", "decode_bytes", "decode_single_token_bytes", "decode_tokens_bytes"):
            arg = unknown if call == "decode_single_token_bytes" else [15, unknown]
            with pytest.raises(error):
                getattr(ref, call)(arg)
            with pytest.raises(error):
                getattr(enc, call)(arg)
    for not_a_token in ("hello world and more", b"\xff\xfe\xfd", "<|not special|>"):
        with pytest.raises(KeyError):
            ref.encode_single_token(not_a_token)
        with pytest.raises(KeyError):
            enc.encode_single_token(not_a_token)
    broken = [ref.encode_single_token(b"\xe6"), *ref.encode("a")]  # half a character
    with pytest.raises(UnicodeDecodeError):
        ref.decode_with_offsets(broken)
    with pytest.raises(UnicodeDecodeError):
        enc.decode_with_offsets(broken)


def _outcome(call):
    try:
        result = call()
    except Exception as err:  # the exception's type is what must agree
        return type(err)
    return result.tolist() if hasattr(result, "tolist") else result


@pytest.mark.parametrize("text", ["a\ud800b", "\ud83d\ude00 x", "x\udfff"])
def test_surrogates_are_repaired_or_refused_as_in_tiktoken(oracles, text):
    """A lone surrogate or a surrogate pair: ``encode``/``encode_ordinary`` (and their batches) repair it,
    the methods tiktoken hands straight to Rust (``encode_to_numpy``, ``encode_with_unstable``,
    ``encode_single_token``) raise ``UnicodeEncodeError``."""
    enc, ref = ours.get_encoding("cl100k_base"), oracles["cl100k_base"]
    for method in ("encode", "encode_ordinary", "encode_to_numpy", "encode_with_unstable", "encode_single_token",
                   "encode_batch", "encode_ordinary_batch"):
        arg = [text, "ok"] if method.endswith("batch") else text
        expected = _outcome(lambda: getattr(ref, method)(arg))
        got = _outcome(lambda: getattr(enc, method)(arg))
        if method == "encode_with_unstable" and expected is not UnicodeEncodeError:
            expected, got = (expected[0], sorted(expected[1])), (got[0], sorted(got[1]))
        assert got == expected, method


def test_model_names_map_as_in_tiktoken():
    models = [*tiktoken_model.MODEL_TO_ENCODING, *(p + "x-2025" for p in tiktoken_model.MODEL_PREFIX_TO_ENCODING),
              "gpt-4o-mini", "ft:gpt-4o-mini:org", "ft:gpt-4:org", "gpt-5.1-codex", "gpt-oss-20b"]
    for model in models:
        assert ours.encoding_name_for_model(model) == tiktoken_model.encoding_name_for_model(model), model
    assert ours.encoding_for_model("gpt-4o") is ours.get_encoding("o200k_base")
    for unknown in ("llama-3", "", "GPT-4"):
        with pytest.raises(KeyError):
            tiktoken_model.encoding_name_for_model(unknown)
        with pytest.raises(KeyError):
            ours.encoding_name_for_model(unknown)
    with pytest.raises(ValueError):
        ours.get_encoding("cl200k_base")


def test_pickle_and_custom_encodings():
    enc = ours.get_encoding("p50k_base")
    assert len(pickle.dumps(enc)) < 200  # a registered encoding is pickled by its name
    assert pickle.loads(pickle.dumps(enc)).encode("x" + " " * 9) == enc.encode("x" + " " * 9) == [87, 50264]
    custom = ours.Encoding("custom", pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks,
                           special_tokens={"<|x|>": 60000})
    copy = pickle.loads(pickle.dumps(custom))
    assert copy.encode("a <|x|>", allowed_special="all") == custom.encode("a <|x|>", allowed_special="all")
    assert copy.encode("a <|x|>", allowed_special="all")[-1] == 60000 and copy.n_vocab == 60001
    with pytest.raises(ValueError, match="explicit_n_vocab"):
        ours.Encoding("bad", pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks, special_tokens={},
                      explicit_n_vocab=50281)


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_base"])
def test_encode_with_unstable_equals_tiktoken(oracles, name):
    """The stable ids and the set of completions (tiktoken returns them in a hash set's order)."""
    enc, ref = ours.get_encoding(name), oracles[name]
    texts = ["hello fanta", "def f(x):\n    ret", "x = 1\n\n", "trailing   ", "a\n \n", "naïve caf", "日本",
             "<|endoftext|>", "word<|endoftext|>", "12345", "he said 'we'l"]
    for text in texts:
        for allowed in (set(), "all") if "<|" in text else (set(),):
            stable, completions = enc.encode_with_unstable(text, allowed_special=allowed, disallowed_special=())
            ref_stable, ref_completions = ref.encode_with_unstable(text, allowed_special=allowed,
                                                                   disallowed_special=())
            assert stable == ref_stable, (text, allowed)
            assert sorted(map(tuple, completions)) == sorted(map(tuple, ref_completions)), (text, allowed)
    with pytest.raises(ValueError):
        enc.encode_with_unstable("a <|endoftext|>")


@pytest.mark.parametrize("name", ["gpt2", "o200k_harmony"])
def test_encoding_encode_iterable_equals_tiktoken_encode(oracles, name):
    """``Encoding.encode_iterable`` (llmarch's addition) on random chunkings equals tiktoken's ``encode`` of
    the whole text, special-token rules included (a disallowed special token split across chunks raises)."""
    enc, ref = ours.get_encoding(name), oracles[name]
    rng = random.Random(5)
    pieces = ["ab", " ", "  ", "\n", "\t", "'ll", "12345", "é", "🙂", "<|endoftext|>", "<|endo", "ftext|>", "\r\n"]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        for allowed, disallowed in (("all", "all"), (set(), ()), (set(), "all")):
            expected = _outcome(lambda: ref.encode(text, allowed_special=allowed, disallowed_special=disallowed))
            got = _outcome(lambda: list(enc.encode_iterable(iter(chunks), allowed_special=allowed,
                                                            disallowed_special=disallowed)))
            assert got == expected, (chunks, allowed, disallowed)


def test_wrong_argument_types_raise_as_in_tiktoken(oracles):
    """Ids are read through ``__index__`` (a float or str id: ``TypeError``; numpy ints and bools pass), and
    ``allowed_special`` must be ``"all"`` or a set: a list or tuple raises ``TypeError`` as in tiktoken, where
    code that passes one under a lenient library would break."""
    import numpy as np

    enc, ref = ours.get_encoding("cl100k_base"), oracles["cl100k_base"]
    for ids in ([1.0], ["a"], [True, 2], (1, 2), np.array([1, 2]), [np.int64(5)], [np.float32(3)]):
        for method in ("decode", "decode_bytes", "decode_tokens_bytes", "decode_with_offsets"):
            assert _outcome(lambda: getattr(enc, method)(ids)) == _outcome(lambda: getattr(ref, method)(ids))
        one = ids[0]
        assert _outcome(lambda: enc.decode_single_token_bytes(one)) == _outcome(
            lambda: ref.decode_single_token_bytes(one))
    text = "<|endoftext|> x"
    for allowed in (["<|endoftext|>"], ("<|endoftext|>",), {"<|endoftext|>"}, frozenset(), "all", "<|endoftext|>"):
        for disallowed in ("all", ()):
            for method in ("encode", "encode_to_numpy", "encode_with_unstable"):
                expected = _outcome(lambda: getattr(ref, method)(text, allowed_special=allowed,
                                                                 disallowed_special=disallowed))
                got = _outcome(lambda: getattr(enc, method)(text, allowed_special=allowed,
                                                            disallowed_special=disallowed))
                if method == "encode_with_unstable" and isinstance(expected, tuple):  # completions: a set
                    expected, got = (expected[0], sorted(expected[1])), (got[0], sorted(got[1]))
                assert got == expected, (method, allowed, disallowed)
