"""llmarch.tokenizers against the course notes' worked example, brute-force references written here, and properties.

Every reference below is independent of the code under test: the corrected listing of Sennrich et al. (2016),
a full recount of pair statistics at every merge (validates the incremental counts), merges replayed in rank
order, a greedy matcher that scans the vocabulary, and exhaustive enumeration of all segmentations.
"""

import collections
import itertools
import json
import math
import random
import re
from fractions import Fraction

import pytest

from llmarch.tokenizers import (
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    BPETokenizer,
    UnigramTokenizer,
    WordPieceTokenizer,
    bpe_segment_word,
    pretokenize,
    train_bpe_words,
)

# Strings that break naive tokenizers. (Lone surrogates such as "\ud800" are valid Python str but cannot be
# encoded as UTF-8, so no byte-level tokenizer can take them; they are left out.)
HARD_STRINGS = [
    "",
    " ",
    "hello world",
    "naïve café résumé",
    "cafe\u0301 (e + combining acute) vs caf\u00e9",
    "emoji 🙂 thumbs 👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 keycap 1️⃣",
    "日本語のテキスト、中文文本。한국어",
    "tabs\tand\nnewlines\r\nand\rcarriage",
    "many     spaces   and trailing   ",
    "   leading spaces",
    "nul\x00byte and \x1c\x1f controls \x7f",
    "\u00a0nbsp\u2003em-space\u3000ideographic\u2028line-sep",
    "I'll've DON'T they're we'd",
    "x² ½ Ⅻ 1234567 3.14159",
    "__init__ snake_case camelCase",
    "\U0001f600" * 7 + "\ufeff\u200b\u200d",
    "<|endoftext|> looks special but is not registered",
]


def _merge(seq, a, b, new):
    """Replace the pair (a, b) by new, left to right (written here independently of the library)."""
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def _toy_corpus(n_words=1500, seed=1234):
    """A deterministic corpus with repeated 'words', punctuation, digits, accents and emoji."""
    rng = random.Random(seed)
    syllables = ["lo", "w", "er", "est", "new", "wid", "the", "an", "re", "in", "é", "ß", "ing", "s", "🙂"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(120)]
    parts = []
    for _ in range(n_words):
        parts.append(rng.choice(words))
        parts.append(rng.choice([" ", " ", " ", ", ", ". ", "\n", "  ", " 42 ", "'s "]))
    return "".join(parts)


# --- classic BPE: the course notes' example -------------------------------------------------------------------

# The notes' Algorithm 1 (from Sennrich et al., 2016), with the two bugs of the printed listing fixed:
#   - the pattern started with the lookahead r'(?!\S)' instead of the lookbehind r'(?<!\S)', so it can never match
#     a pair that starts with a symbol (a non-space): nothing is ever merged;
#   - the replacement was ' '.join(pair) instead of ''.join(pair): even a match would put the space back.
# (And print(best) was outside the loop, so only the last pair would be printed.)


def _listing_get_stats(vocab):
    pairs = collections.defaultdict(int)
    for word, freq in vocab.items():
        symbols = word.split()
        for i in range(len(symbols) - 1):
            pairs[symbols[i], symbols[i + 1]] += freq
    return pairs


def _listing_merge_vocab(pair, v_in, lookbehind=True, join=""):
    v_out = {}
    bigram = re.escape(" ".join(pair))
    p = re.compile((r"(?<!\S)" if lookbehind else r"(?!\S)") + bigram + r"(?!\S)")
    for word in v_in:
        v_out[p.sub(join.join(pair), word)] = v_in[word]
    return v_out


def _run_listing(num_merges=10, **fixes):
    vocab = {"l o w </w>": 5, "l o w e r </w>": 2, "n e w e s t </w>": 6, "w i d e s t </w>": 3}
    merges = []
    for _ in range(num_merges):
        pairs = _listing_get_stats(vocab)
        best = max(pairs, key=pairs.get)
        vocab = _listing_merge_vocab(best, vocab, **fixes)
        merges.append(best)
    return merges, vocab


NOTES_MERGES = [
    ("e", "s"),
    ("es", "t"),
    ("est", "</w>"),
    ("l", "o"),
    ("lo", "w"),
    ("n", "e"),
    ("ne", "w"),
    ("new", "est</w>"),
    ("low", "</w>"),
    ("w", "i"),
]


def test_printed_listing_never_merges():
    """As printed in the notes, the listing runs but merges nothing: it picks ('e', 's') ten times."""
    merges, vocab = _run_listing(lookbehind=False, join=" ")
    assert merges == [("e", "s")] * 10
    assert vocab == {"l o w </w>": 5, "l o w e r </w>": 2, "n e w e s t </w>": 6, "w i d e s t </w>": 3}
    # either fix alone is not enough
    assert _run_listing(lookbehind=True, join=" ")[0] == [("e", "s")] * 10
    assert _run_listing(lookbehind=False, join="")[0] == [("e", "s")] * 10


def test_notes_example_reproduced_exactly():
    fixed_merges, fixed_vocab = _run_listing(lookbehind=True, join="")
    assert fixed_merges == NOTES_MERGES
    assert fixed_vocab == {"low</w>": 5, "low e r </w>": 2, "newest</w>": 6, "wi d est</w>": 3}
    ours = train_bpe_words({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 10)
    assert ours == NOTES_MERGES
    # the segmentations at the end of training
    assert bpe_segment_word("low", ours) == ["low</w>"]
    assert bpe_segment_word("lower", ours) == ["low", "e", "r", "</w>"]
    assert bpe_segment_word("newest", ours) == ["newest</w>"]
    assert bpe_segment_word("widest", ours) == ["wi", "d", "est</w>"]
    # an unseen word
    assert bpe_segment_word("lowest", ours) == ["low", "est</w>"]


def _replay_classic(word_counts, merges, tie_break, end_of_word):
    """Recount every pair before every merge and check the merge was a most frequent pair under the tie rule."""
    words = []
    for w, c in word_counts.items():
        symbols = list(w) + ["</w>"] if end_of_word == "separate" else list(w[:-1]) + [w[-1] + "</w>"]
        words.append((symbols, c))
    for k, merge in enumerate(merges):
        first_seen, counts = {}, collections.Counter()
        for symbols, c in words:
            for i in range(len(symbols) - 1):
                pair = (symbols[i], symbols[i + 1])
                counts[pair] += c
                first_seen.setdefault(pair, len(first_seen))
        top = max(counts.values())
        tied = [p for p in counts if counts[p] == top]
        expected = {
            "first": min(tied, key=first_seen.get),
            "smallest": min(tied),
            "largest": max(tied),
        }[tie_break]
        assert merge == expected, f"merge {k}: got {merge}, a most frequent pair under {tie_break!r} is {expected}"
        words = [(_merge(s, *merge, merge[0] + merge[1]), c) for s, c in words]


@pytest.mark.parametrize("tie_break", ["first", "smallest", "largest"])
@pytest.mark.parametrize("end_of_word", ["separate", "attached"])
def test_classic_bpe_merges_are_most_frequent(tie_break, end_of_word):
    rng = random.Random(7)
    word_counts = {"".join(rng.choice("abcde") for _ in range(rng.randint(1, 6))): rng.randint(1, 4) for _ in range(40)}
    merges = train_bpe_words(word_counts, 30, tie_break=tie_break, end_of_word=end_of_word)
    assert len(merges) == 30
    _replay_classic(word_counts, merges, tie_break, end_of_word)


def test_classic_tie_breaks_differ_where_the_notes_have_ties():
    counts = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
    # after 3 merges, ('l', 'o') and ('o', 'w') both occur 7 times
    assert train_bpe_words(counts, 4, tie_break="first")[3] == ("l", "o")
    assert train_bpe_words(counts, 4, tie_break="largest")[3] == ("o", "w")  # subword-nmt's learn_bpe.py rule
    # subword-nmt >= 0.2 glues </w> to the last character
    assert train_bpe_words(counts, 2, end_of_word="attached") == [("e", "s"), ("es", "t</w>")]
    assert bpe_segment_word("low", [("l", "o"), ("lo", "w</w>")], end_of_word="attached") == ["low</w>"]


def test_classic_bpe_stops_when_no_pair_is_left():
    assert train_bpe_words({"ab": 3}, 5) == [("a", "b"), ("ab", "</w>")]


def test_classic_bpe_validates_input():
    with pytest.raises(TypeError, match="word_counts"):
        train_bpe_words(["low", "lower"], 3)
    with pytest.raises(ValueError, match="positive"):
        train_bpe_words({"low": 0}, 3)
    with pytest.raises(ValueError, match="non-empty"):
        train_bpe_words({"": 2}, 3)
    with pytest.raises(ValueError, match="num_merges"):
        train_bpe_words({"low": 1}, -1)
    with pytest.raises(TypeError, match="num_merges"):
        train_bpe_words({"low": 1}, 2.0)
    with pytest.raises(ValueError, match="tie_break"):
        train_bpe_words({"low": 1}, 2, tie_break="random")
    with pytest.raises(ValueError, match="merges\\[0\\]"):
        bpe_segment_word("low", [("l",)])


# --- pre-tokenisation ---------------------------------------------------------------------------------------

# Expected splits produced by the `regex` module with the original patterns (GPT-2's encoder.py, tiktoken's
# cl100k_base), written out here; tests/test_tokenizers_openai.py checks the patterns against tiktoken itself.
GPT2_SPLITS = {
    "Hello world's 42  cats!!": ["Hello", " world", "'s", " 42", " ", " cats", "!!"],
    "I'll've DON'T they're": ["I", "'ll", "'ve", " DON", "'", "T", " they", "'re"],
    "x² ½ Ⅻ 1234567 3.14": ["x", "²", " ½", " Ⅻ", " 1234567", " 3", ".", "14"],
    "naïve café\u0301 日本語です": ["naïve", " café", "\u0301", " 日本語です"],
    "a\t\tb\n\n  c  ": ["a", "\t", "\t", "b", "\n\n ", " c", "  "],
    "\r\n\r\nfoo\r\n": ["\r\n\r", "\n", "foo", "\r\n"],
    "__init__ snake_case": ["__", "init", "__", " snake", "_", "case"],
    "a\x00b\x1c c": ["a", "\x00", "b", "\x1c", " c"],  # U+001C is not White_Space (re's \s says it is)
}
GPT4_SPLITS = {
    "Hello world's 42  cats!!": ["Hello", " world", "'s", " ", "42", " ", " cats", "!!"],
    "I'll've DON'T they're": ["I", "'ll", "'ve", " DON", "'T", " they", "'re"],
    "x² ½ Ⅻ 1234567 3.14": ["x", "²", " ", "½", " ", "Ⅻ", " ", "123", "456", "7", " ", "3", ".", "14"],
    "a\t\tb\n\n  c  ": ["a", "\t", "\tb", "\n\n", " ", " c", "  "],
    "\r\n\r\nfoo\r\n": ["\r\n\r\n", "foo", "\r\n"],
}


@pytest.mark.parametrize("text", sorted(GPT2_SPLITS))
def test_gpt2_pretokenization_matches_regex_module(text):
    assert pretokenize(text) == GPT2_SPLITS[text]


@pytest.mark.parametrize("text", sorted(GPT4_SPLITS))
def test_gpt4_pretokenization_matches_regex_module(text):
    assert pretokenize(text, GPT4_SPLIT_PATTERN) == GPT4_SPLITS[text]


@pytest.mark.parametrize("text", HARD_STRINGS)
def test_pretokens_concatenate_back(text):
    assert "".join(pretokenize(text)) == text
    assert "".join(pretokenize(text, GPT4_SPLIT_PATTERN)) == text


def test_pretokenize_rejects_a_pattern_that_loses_text():
    with pytest.raises(ValueError, match="skips"):
        pretokenize("a b", pattern=r"\w+")
    with pytest.raises(ValueError, match="does not match 'B'"):
        pretokenize("aB", pattern=r"\p{Ll}")
    with pytest.raises(ValueError, match="does not compile"):
        pretokenize("ab", pattern=r"(a")
    with pytest.raises(TypeError, match="text"):
        pretokenize(b"bytes")
    assert pretokenize("a b", pattern=None) == ["a b"]


# --- byte-level BPE -----------------------------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|pad|>"]


@pytest.fixture(scope="module")
def corpus():
    return _toy_corpus()


@pytest.fixture(scope="module")
def bpe(corpus):
    text = corpus[:3000] + "<|endoftext|>" + corpus[3000:] + "<|pad|><|endoftext|>"
    return BPETokenizer().train(text, 256 + 200 + len(SPECIALS), special_tokens=SPECIALS)


def test_bpe_vocabulary_layout(bpe):
    assert len(bpe.merges) == 200
    assert bpe.vocab_size == 256 + 200 + 2
    assert bpe.special_tokens == {"<|endoftext|>": 456, "<|pad|>": 457}
    for i in range(256):
        assert bpe.vocab[i] == bytes([i])
    for k, (a, b) in enumerate(bpe.merges):
        assert a < 256 + k and b < 256 + k  # a merge only uses tokens that exist before it
        assert bpe.vocab[256 + k] == bpe.vocab[a] + bpe.vocab[b]


@pytest.mark.parametrize("tie_break", ["smallest_ids", "greatest_bytes"])
def test_bpe_merges_are_most_frequent_pairs(corpus, tie_break):
    """Replay training with a full recount at every merge: each merge must be a most frequent pair, and among
    equally frequent pairs the smallest (id_a, id_b), or with tie_break="greatest_bytes" the pair whose
    (bytes_a, bytes_b) is lexicographically greatest (CS336's rule). This checks the incremental pair counts."""
    text = corpus + "<|endoftext|>" + corpus[:500]
    kwargs = {} if tie_break == "smallest_ids" else {"tie_break": tie_break}  # the default is unchanged
    tok = BPETokenizer().train(text, 256 + 250 + 1, special_tokens=["<|endoftext|>"], **kwargs)
    chunks = text.split("<|endoftext|>")  # special tokens are cut out of the training text
    words = collections.Counter(p for chunk in chunks for p in pretokenize(chunk))
    seqs = {w: list(w.encode("utf-8")) for w in words}
    ties = 0
    for k, merge in enumerate(tok.merges):
        counts = collections.Counter()
        for w, f in words.items():
            s = seqs[w]
            for pair in zip(s, s[1:]):
                counts[pair] += f
        top = max(counts.values())
        tied = sorted(p for p, c in counts.items() if c == top)
        if tie_break == "greatest_bytes":
            tied.sort(key=lambda p: (tok.vocab[p[0]], tok.vocab[p[1]]), reverse=True)
        ties += len(tied) > 1
        assert merge == tied[0], f"merge {k}: got {merge} (count {counts[merge]}), expected {tied[0]} (count {top})"
        seqs = {w: _merge(s, *merge, 256 + k) for w, s in seqs.items()}
    assert ties > 10  # the tie-break rule was exercised


def test_bpe_training_stops_when_no_pair_is_left():
    tok = BPETokenizer().train("ab ab", 1000)
    # pre-tokens "ab" and " ab": merges (a, b), then (' ', 'ab')
    assert [tok.vocab[256 + k] for k in range(len(tok.merges))] == [b"ab", b" ab"]
    assert tok.vocab_size == 258


def _reference_encode(tok, text):
    """Cut at special tokens, pre-tokenise, then apply every merge in rank order to each pre-token."""
    out = []
    if tok.special_tokens:
        alternatives = "|".join(re.escape(s) for s in sorted(tok.special_tokens, key=len, reverse=True))
        parts = re.split(f"({alternatives})", text)
    else:
        parts = [text]
    for k, part in enumerate(parts):
        if k % 2 == 1:
            out.append(tok.special_tokens[part])
            continue
        for piece in pretokenize(part):
            ids = list(piece.encode("utf-8"))
            for rank, (a, b) in enumerate(tok.merges):
                ids = _merge(ids, a, b, 256 + rank)
            out.extend(ids)
    return out


@pytest.mark.parametrize("text", HARD_STRINGS + [_toy_corpus(200, seed=99), "lowest newest<|pad|>wider"])
def test_bpe_encode_matches_reference_and_round_trips(bpe, text):
    ids = bpe.encode(text, allowed_special="all")
    assert ids == _reference_encode(bpe, text)
    assert bpe.decode(ids) == text


def test_bpe_compresses_training_like_text(bpe, corpus):
    text = corpus[:2000]
    assert len(bpe.encode(text)) < 0.6 * len(text.encode("utf-8"))


def test_bpe_round_trips_random_unicode(bpe):
    rng = random.Random(3)
    for _ in range(200):
        cps = []
        for _ in range(rng.randint(0, 20)):
            lo, hi = rng.choice([(0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF)])  # 1 to 4 bytes
            cp = rng.randint(lo, hi)
            if not 0xD800 <= cp <= 0xDFFF:  # surrogates cannot be UTF-8 encoded
                cps.append(chr(cp))
        text = "".join(cps)
        assert bpe.decode(bpe.encode(text)) == text


def test_special_tokens_are_single_ids_and_never_split(bpe):
    eot, pad = bpe.special_tokens["<|endoftext|>"], bpe.special_tokens["<|pad|>"]
    text = "low<|endoftext|>lower <|pad|><|pad|> <|endoftext|>\n<|endoftext|>"
    ids = bpe.encode(text, allowed_special="all")
    assert ids.count(eot) == 3 and ids.count(pad) == 2
    assert bpe.encode("<|endoftext|>", allowed_special={"<|endoftext|>"}) == [eot]
    assert bpe.decode(ids) == text
    # tiktoken's rule: special text raises by default, is ordinary text when no longer disallowed
    with pytest.raises(ValueError, match="<|pad|>"):
        bpe.encode("a<|pad|>", allowed_special={"<|endoftext|>"})
    assert bpe.encode("<|pad|>", disallowed_special=()) == BPETokenizer(bpe.merges).encode("<|pad|>")
    # the tokens on either side are encoded as if the special token were a boundary
    assert ids[: ids.index(eot)] == bpe.encode("low")
    # special tokens were cut out of the training text: no learned token contains a piece of them
    for k in range(len(bpe.merges)):
        assert b"<|" not in bpe.vocab[256 + k] and b"|>" not in bpe.vocab[256 + k]
    # without registration the same string is ordinary text
    plain = BPETokenizer(bpe.merges)
    assert len(plain.encode("<|endoftext|>")) > 1
    assert plain.decode(plain.encode("<|endoftext|>")) == "<|endoftext|>"


def test_longest_special_token_wins():
    tok = BPETokenizer(special_tokens=["<|a|>", "<|a|><|b|>"])
    assert tok.encode("<|a|><|b|><|a|>", allowed_special="all") == [257, 256]
    assert tok.encode("<|a|><|b", allowed_special="all") == [256, *b"<|b"]


def test_bpe_dropout(bpe, corpus):
    text = corpus[:1500]
    plain = bpe.encode(text)
    assert bpe.encode(text, dropout=0.0, seed=5) == plain
    segmentations = set()
    for seed in range(8):
        ids = bpe.encode(text, dropout=0.3, seed=seed)
        assert bpe.decode(ids) == text
        assert ids == bpe.encode(text, dropout=0.3, seed=seed)  # a fixed seed gives a fixed segmentation
        assert len(ids) > len(plain)  # skipped merges give more, shorter tokens
        segmentations.add(tuple(ids))
    assert len(segmentations) == 8
    # p = 1 skips every merge: single bytes, special tokens still whole
    assert bpe.encode("lowest<|pad|>", dropout=1.0, seed=0, allowed_special="all") == [
        *b"lowest", bpe.special_tokens["<|pad|>"]]
    rng = random.Random(0)  # a shared generator is accepted
    assert bpe.decode(bpe.encode(text, dropout=0.1, seed=rng)) == text


def test_bpe_dropout_keeps_the_order_of_merges():
    """With dropout every merge applied is the first (lowest rank) candidate not skipped; so p -> 0 is plain BPE
    and a word whose only candidate merge is skipped stays in bytes."""
    tok = BPETokenizer([(ord("a"), ord("b"))])
    counts = collections.Counter(tuple(tok.encode("ab", dropout=0.5, seed=s)) for s in range(400))
    assert set(counts) == {(256,), (97, 98)}
    assert 150 < counts[(256,)] < 250  # about half


def _dropout_distribution(merges, ids, p):
    """Exact distribution of BPE-dropout's output (Provilkov et al., 2020, as in their reference code): the
    candidate merges are tried in order (rank, position); each is skipped with probability p; the first one
    kept is applied; if all are skipped the word is final."""
    ranks = {pair: 256 + k for k, pair in enumerate(merges)}
    candidates = sorted((ranks[pair], i) for i, pair in enumerate(zip(ids, ids[1:])) if pair in ranks)
    if not candidates:
        return {tuple(ids): 1.0}
    dist = collections.defaultdict(float)
    dist[tuple(ids)] += p ** len(candidates)
    for j, (new, i) in enumerate(candidates):
        for out, q in _dropout_distribution(merges, ids[:i] + [new] + ids[i + 2 :], p).items():
            dist[out] += p**j * (1 - p) * q
    return dist


def test_bpe_dropout_distribution_is_exact():
    a, b = ord("a"), ord("b")
    merges = [(a, b), (b, a), (256, 256), (a, 257), (258, 256)]  # ab, ba, abab, aba, ababab
    tok = BPETokenizer(merges)
    word = list(b"ababab")
    p, n = 0.4, 6000
    exact = _dropout_distribution(merges, word, p)
    assert sum(exact.values()) == pytest.approx(1.0)
    assert len(exact) >= 8
    rng = random.Random(0)
    counts = collections.Counter(tuple(tok.encode("ababab", dropout=p, seed=rng)) for _ in range(n))
    assert set(counts) <= set(exact)
    # pool the rare outcomes so that every cell expects at least 5
    chi2, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for out, q in exact.items():
        if n * q >= 5:
            chi2 += (counts[out] - n * q) ** 2 / (n * q)
            cells += 1
        else:
            pooled_obs += counts[out]
            pooled_exp += n * q
    if pooled_exp > 0:
        chi2 += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    # 21 degrees of freedom: P(chi2 > 46.8) = 0.001; the seed is fixed, so this cannot flake
    assert cells - 1 == 21 and chi2 < 46.8, (cells, chi2)
    assert tok.encode("ababab") == [260]  # p = 0: ab ab ab -> abab ab -> ababab


def test_bpe_training_is_deterministic(corpus):
    a = BPETokenizer().train(corpus, 400)
    b = BPETokenizer().train(corpus, 400)
    assert a.merges == b.merges


def test_bpe_save_load_identity(bpe, tmp_path):
    path = tmp_path / "bpe.json"
    bpe.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))  # plain JSON
    assert data["type"] == "llmarch.BPETokenizer" and len(data["merges"]) == len(bpe.merges)
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(bpe.merges)  # one merge per line
    loaded = BPETokenizer.load(path)
    assert loaded.merges == bpe.merges
    assert loaded.special_tokens == bpe.special_tokens
    assert loaded.pattern == bpe.pattern
    for text in HARD_STRINGS + ["lowest<|endoftext|>newer"]:
        assert loaded.encode(text, allowed_special="all") == bpe.encode(text, allowed_special="all")
        assert loaded.encode(text, dropout=0.2, seed=1, allowed_special="all") == bpe.encode(
            text, dropout=0.2, seed=1, allowed_special="all")


def test_bpe_load_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"type": "something else", "version": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a 'llmarch.BPETokenizer' file"):
        BPETokenizer.load(path)
    path.write_text("not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not a JSON tokenizer file"):
        BPETokenizer.load(path)


def test_bpe_decode_of_a_broken_utf8_sequence():
    tok = BPETokenizer()
    ids = tok.encode("é")  # two bytes
    assert tok.decode(ids[:1]) == "\ufffd"
    with pytest.raises(UnicodeDecodeError):
        tok.decode(ids[:1], errors="strict")


def test_bpe_validates_input(bpe):
    with pytest.raises(ValueError, match="vocab_size=300 is too small"):
        BPETokenizer().train("abc", 300, special_tokens=[f"<{i}>" for i in range(50)])
    with pytest.raises(TypeError, match="text"):
        bpe.encode(["not", "a", "string"])
    with pytest.raises(ValueError, match="dropout"):
        bpe.encode("abc", dropout=1.5)
    with pytest.raises(TypeError, match="seed"):
        bpe.encode("abc", dropout=0.5, seed="x")
    with pytest.raises(ValueError, match=r"ids\[1\] = 9999 is not a token id"):
        bpe.decode([1, 9999])
    with pytest.raises(TypeError, match=r"ids\[0\]"):
        bpe.decode(["a"])
    with pytest.raises(ValueError, match="errors"):
        bpe.decode([1], errors="bogus")
    with pytest.raises(ValueError, match="exist before this merge"):
        BPETokenizer([(256, 1)])
    with pytest.raises(ValueError, match="repeats"):
        BPETokenizer([(1, 2), (1, 2)])
    with pytest.raises(ValueError, match="more than once"):
        BPETokenizer(special_tokens=["<s>", "<s>"])


# --- WordPiece ----------------------------------------------------------------------------------------------

HF_COURSE_WORDS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}


def _wordpiece_split(word):
    return [word[0]] + ["##" + ch for ch in word[1:]]


def _wordpiece_stats(splits, word_counts):
    pair_counts, symbol_counts = collections.Counter(), collections.Counter()
    for w, f in word_counts.items():
        s = splits[w]
        for sym in s:
            symbol_counts[sym] += f
        for pair in zip(s, s[1:]):
            pair_counts[pair] += f
    return pair_counts, symbol_counts


def test_wordpiece_score_picks_a_different_pair_than_bpe_frequency():
    """The Hugging Face course's example: BPE's most frequent pair is u+g (20 times); WordPiece's score
    count(ab) / (count(a) count(b)) is highest for ##g + ##s = 5 / (20 * 5)."""
    splits = {w: _wordpiece_split(w) for w in HF_COURSE_WORDS}
    pair_counts, symbol_counts = _wordpiece_stats(splits, HF_COURSE_WORDS)
    most_frequent = max(pair_counts, key=pair_counts.get)
    scores = {p: Fraction(c, symbol_counts[p[0]] * symbol_counts[p[1]]) for p, c in pair_counts.items()}
    best_score = max(scores, key=scores.get)
    assert most_frequent == ("##u", "##g") and pair_counts[most_frequent] == 20
    assert best_score == ("##g", "##s") and scores[best_score] == Fraction(1, 20)

    assert train_bpe_words(HF_COURSE_WORDS, 1) == [("u", "g")]
    tok = WordPieceTokenizer().train(HF_COURSE_WORDS, 14)
    assert tok.merges[0] == ("##g", "##s")
    assert tok.merges[0] != ("##u", "##g")


def test_wordpiece_merges_have_the_best_score():
    """Replay training with a full recount: every merge maximises the exact score (ties: smallest pair)."""
    rng = random.Random(11)
    words = ["".join(rng.choice("abcdef") for _ in range(rng.randint(1, 7))) for _ in range(60)]
    word_counts = {w: rng.randint(1, 9) for w in words}
    tok = WordPieceTokenizer().train(word_counts, 60)
    splits = {w: _wordpiece_split(w) for w in word_counts}
    alphabet = sorted({s for w in splits.values() for s in w})
    tokens = ["[UNK]"] + alphabet
    for k, merge in enumerate(tok.merges):
        pair_counts, symbol_counts = _wordpiece_stats(splits, word_counts)
        scores = {p: Fraction(c, symbol_counts[p[0]] * symbol_counts[p[1]]) for p, c in pair_counts.items()}
        top = max(scores.values())
        expected = min(p for p, s in scores.items() if s == top)
        assert merge == expected, f"merge {k}: got {merge}, expected {expected}"
        new = merge[0] + merge[1][2:]
        splits = {w: _merge(s, *merge, new) for w, s in splits.items()}
        if new not in tokens:
            tokens.append(new)
    assert list(tok.vocab) == tokens
    assert tok.vocab_size == 60


def _greedy_reference(word, vocab, unk="[UNK]"):
    """Greedy longest match by scanning the whole vocabulary at each position."""
    pieces, i = [], 0
    while i < len(word):
        matches = [
            t for t in vocab
            if (t.startswith("##") if i > 0 else not t.startswith("##"))
            and word.startswith(t[2:] if i > 0 else t, i)
            and len(t) > (2 if i > 0 else 0)
        ]
        if not matches:
            return [unk]
        best = max(matches, key=len)
        pieces.append(best)
        i += len(best) - (2 if i > 0 else 0)
    return pieces


def test_wordpiece_greedy_encoding_matches_reference():
    vocab = ["[UNK]", "a", "b", "c", "ab", "abc", "##a", "##b", "##c", "##bc", "##cab", "ca", "##ab"]
    tok = WordPieceTokenizer(vocab)
    rng = random.Random(5)
    for _ in range(500):
        word = "".join(rng.choice("abcd") for _ in range(rng.randint(1, 8)))
        assert tok.tokenize(word) == _greedy_reference(word, vocab), word
    assert tok.tokenize("abcab") == ["abc", "##ab"]
    assert tok.tokenize("abd") == ["[UNK]"]  # one unknown character makes the whole word [UNK]
    assert tok.tokenize("d abc") == ["[UNK]", "abc"]
    assert tok.encode("abc ca") == [5, 11]


def test_wordpiece_trained_tokenizer_matches_reference(corpus):
    tok = WordPieceTokenizer().train(corpus, 150)
    words = re.findall(r"\w+|[^\w\s]", corpus[:3000]) + ["unseenword", "zzz", "lowestnewer"]
    for word in words:
        assert tok.tokenize(word) == _greedy_reference(word, list(tok.vocab)), word


def test_wordpiece_pretokenization_and_decode():
    tok = WordPieceTokenizer(["[UNK]", "hello", ",", "world", "!", "wor", "##ld", "日", "本"])
    assert tok.tokenize("Hello, world!") == ["[UNK]", ",", "world", "!"]
    uncased = WordPieceTokenizer(list(tok.vocab), lowercase=True)
    assert uncased.tokenize("Héllo, WORLD!") == ["hello", ",", "world", "!"]
    assert tok.tokenize("日本") == ["日", "本"]  # CJK characters are words of their own
    assert tok.decode([tok.vocab[t] for t in ["hello", ",", "wor", "##ld", "!"]]) == "hello , world !"
    tok.max_input_chars_per_word = 4
    assert tok.tokenize("world") == ["[UNK]"]


def test_wordpiece_cleans_text_as_bert_does():
    """BERT's basic tokenizer (Devlin et al.'s tokenization.py, _clean_text and _is_whitespace/_is_control) removes
    NUL, U+FFFD and control characters and treats only space, tab, newline, carriage return and the Zs category as
    whitespace. Worked examples of each rule, including two where Python's str.isspace disagrees with BERT:
    U+001C (a control character: removed, the word stays whole) and U+2028 (category Zl: part of the word)."""
    tok = WordPieceTokenizer(["[UNK]", "hello", "world", "a", "b", "c", "d", "ab"])
    assert tok.tokenize("hel\x00lo\ufffd wor\x07ld") == ["hello", "world"]
    assert tok.tokenize("a\tb\nc\rd") == ["a", "b", "c", "d"]
    assert tok.tokenize("a\u00a0b") == ["a", "b"]  # no-break space, Zs: whitespace
    assert tok.tokenize("a\u200bb") == ["ab"]  # zero-width space, Cf: removed
    assert tok.tokenize("a\x1cb") == ["ab"]  # Python calls it whitespace; BERT removes it
    assert tok.tokenize("a\u2028b") == ["[UNK]"]  # Python calls it whitespace; for BERT it is a letter of the word

def test_wordpiece_special_tokens_are_never_split():
    tok = WordPieceTokenizer().train(HF_COURSE_WORDS, 20, special_tokens=["[PAD]", "[CLS]", "[SEP]"])
    assert list(tok.vocab)[:4] == ["[UNK]", "[PAD]", "[CLS]", "[SEP]"]  # unk_token is added first
    assert tok.tokenize("[CLS]hug pugs[SEP][UNK]") == ["[CLS]", "hug", "pug", "##s", "[SEP]", "[UNK]"]
    assert tok.decode(tok.encode("[CLS] hugs")) == "[CLS] hugs"
    assert WordPieceTokenizer(list(tok.vocab)).tokenize("[CLS]") == ["[UNK]", "[UNK]", "[UNK]"]  # not registered


def test_wordpiece_training_is_deterministic_and_saves(corpus, tmp_path):
    a = WordPieceTokenizer().train(corpus, 120)
    b = WordPieceTokenizer().train(corpus, 120)
    assert a.vocab == b.vocab and a.merges == b.merges
    a.save(tmp_path / "wp.json")
    c = WordPieceTokenizer.load(tmp_path / "wp.json")
    assert c.vocab == a.vocab and c.merges == a.merges
    assert c.encode(corpus[:500]) == a.encode(corpus[:500])


def test_wordpiece_validates_input():
    with pytest.raises(ValueError, match="too small"):
        WordPieceTokenizer().train(HF_COURSE_WORDS, 5)
    with pytest.raises(ValueError, match="unknown token"):
        WordPieceTokenizer(["a", "b"])
    with pytest.raises(ValueError, match="no vocabulary yet"):
        WordPieceTokenizer().encode("abc")
    with pytest.raises(ValueError, match="positive"):
        WordPieceTokenizer().train({"a": -1}, 10)


# --- Unigram ------------------------------------------------------------------------------------------------


def _segmentations(word, pieces):
    """All segmentations of word into pieces (exhaustive)."""
    if not word:
        yield []
        return
    for e in range(1, len(word) + 1):
        if word[:e] in pieces:
            for rest in _segmentations(word[e:], pieces):
                yield [word[:e], *rest]


def _random_pieces(alphabet, max_len, seed):
    rng = random.Random(seed)
    pieces = {}
    for n in range(1, max_len + 1):
        for chars in itertools.product(alphabet, repeat=n):
            if n == 1 or rng.random() < 0.6:
                pieces["".join(chars)] = -rng.uniform(0.5, 6.0)
    return pieces


def test_viterbi_matches_exhaustive_search():
    pieces = _random_pieces("abc", 3, seed=0)
    tok = UnigramTokenizer.from_pieces(pieces)
    for n in range(1, 8):
        for chars in itertools.product("abc", repeat=n):
            word = "".join(chars)
            best_pieces, best_lp = tok.viterbi(word)
            scores = [sum(pieces[p] for p in seg) for seg in _segmentations(word, pieces)]
            assert best_lp == pytest.approx(max(scores), abs=1e-12)
            assert "".join(best_pieces) == word
            assert sum(pieces[p] for p in best_pieces) == pytest.approx(best_lp, abs=1e-12)


def test_viterbi_worked_example():
    tok = UnigramTokenizer.from_pieces({"a": -1.0, "b": -2.0, "ab": -2.5})
    assert tok.viterbi("abab") == (["ab", "ab"], -5.0)  # beats a b a b = -6
    assert tok.viterbi("") == ([], 0.0)
    with pytest.raises(ValueError, match="the character 'c' is not a piece"):
        tok.viterbi("abc")


def test_log_likelihood_matches_exhaustive_sum():
    pieces = _random_pieces("ab", 3, seed=1)
    tok = UnigramTokenizer.from_pieces(pieces)
    counts = {"abba": 3, "bab": 2, "aaaab": 1, "b": 4}
    expected = sum(
        c * math.log(sum(math.exp(sum(pieces[p] for p in seg)) for seg in _segmentations(w, pieces)))
        for w, c in counts.items()
    )
    assert tok.log_likelihood(counts) == pytest.approx(expected, rel=1e-12)


def test_sampling_frequencies_match_exact_probabilities():
    pieces = {"a": -1.2, "b": -1.5, "c": -1.1, "d": -2.0, "ab": -2.2, "bc": -1.9, "cd": -2.5}
    pieces.update({"abc": -3.0, "bcd": -2.8, "abcd": -4.5})
    tok = UnigramTokenizer.from_pieces(pieces)
    for alpha in (0.0, 0.3, 1.0):
        segs = [tuple(s) for s in _segmentations("abcd", pieces)]
        assert len(segs) == 8
        weights = [math.exp(alpha * sum(pieces[p] for p in s)) for s in segs]
        probs = {s: w / sum(weights) for s, w in zip(segs, weights)}
        n = 20000
        rng = random.Random(2024)
        counts = collections.Counter(tuple(tok.sample("abcd", alpha=alpha, seed=rng)) for _ in range(n))
        assert set(counts) <= set(segs)
        chi2 = sum((counts[s] - n * p) ** 2 / (n * p) for s, p in probs.items())
        # 7 degrees of freedom: P(chi2 > 24.3) = 0.001; the seed is fixed, so this cannot flake
        assert chi2 < 24.3, (alpha, chi2)
    # a large alpha concentrates on the Viterbi segmentation
    assert tok.sample("abcd", alpha=200.0, seed=0) == tok.viterbi("abcd")[0]
    assert tok.sample("abcd", seed=3) == tok.sample("abcd", seed=3)


def _exhaustive_em_step(pieces, counts):
    """Expected counts by enumerating every segmentation with its posterior, then p = c / sum c."""
    expected = collections.defaultdict(float)
    for w, c in counts.items():
        segs = list(_segmentations(w, pieces))
        weights = [math.exp(sum(pieces[p] for p in s)) for s in segs]
        z = sum(weights)
        for s, wt in zip(segs, weights):
            for p in s:
                expected[p] += c * wt / z
    total = sum(expected.values())
    return {p: math.log(expected[p] / total) for p in pieces if expected[p] > 0}


def test_em_step_matches_exhaustive_expected_counts():
    pieces = _random_pieces("ab", 3, seed=2)
    counts = {"abba": 3, "bab": 2, "aaab": 1, "ba": 5}
    expected = _exhaustive_em_step(pieces, counts)
    tok = UnigramTokenizer.from_pieces(pieces)
    tok.em_step(counts)
    assert set(tok.pieces) == set(expected)
    for p, lp in expected.items():
        assert tok.pieces[p] == pytest.approx(lp, abs=1e-10)


def test_em_never_decreases_the_likelihood():
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5, "bugs": 2, "snug": 3}
    rng = random.Random(4)
    pieces = {}
    for w in counts:
        for s in range(len(w)):
            for e in range(s + 1, len(w) + 1):
                pieces[w[s:e]] = rng.uniform(0.01, 1.0)
    total = sum(pieces.values())  # EM's guarantee is for a proper distribution: normalise the start
    tok = UnigramTokenizer.from_pieces({p: math.log(v / total) for p, v in pieces.items()})
    history = [tok.log_likelihood(counts)]
    for _ in range(25):
        before = tok.em_step(counts)
        assert before == pytest.approx(history[-1], rel=1e-12)  # em_step reports the likelihood before it
        history.append(tok.log_likelihood(counts))
    for prev, nxt in zip(history, history[1:]):
        assert nxt >= prev - 1e-9 * abs(prev)
    assert history[-1] > history[0] + 1.0


UNIGRAM_TEXT = (
    "the cat sat on the mat. the dog sat on the log. a cat and a dog met on a mat; "
    "the cats sang, the dogs danced, and the hats were on the cats. "
) * 3 + "Zebras  zigzag\tquickly\nbetween   the  bushes!"


@pytest.fixture(scope="module")
def unigram():
    return UnigramTokenizer().train(UNIGRAM_TEXT, 60)


def test_unigram_training_result(unigram):
    assert unigram.vocab_size == 60 and len(unigram.pieces) == 59
    chars = set(UNIGRAM_TEXT.replace(" ", "\u2581")) | {"\u2581"}
    assert chars <= set(unigram.pieces)  # every character is kept
    assert unigram.vocab["<unk>"] == 0
    lps = list(unigram.pieces.values())
    assert lps == sorted(lps, reverse=True)  # ids follow probability
    assert math.fsum(math.exp(lp) for lp in lps) == pytest.approx(1.0, abs=1e-9)
    # within each run of EM steps on a fixed set of pieces the likelihood never decreases
    for (n0, ll0), (n1, ll1) in zip(unigram.history, unigram.history[1:]):
        if n0 == n1:
            assert ll1 >= ll0 - 1e-9 * abs(ll0)
    # frequent words become few pieces
    assert len(unigram.encode("the cat sat on the mat")) < len("the cat sat on the mat") / 2


@pytest.mark.parametrize(
    "text", [UNIGRAM_TEXT, "the cat", " the  cat ", "   ", "", "cats\tand\ndogs", "mat.mat.mat", "a"]
)
def test_unigram_round_trip(unigram, text):
    ids = unigram.encode(text)
    assert unigram.decode(ids) == text
    assert unigram.decode(unigram.encode(text, alpha=0.5, seed=1)) == text


def test_unigram_whitespace_and_unknown_characters(unigram):
    pieces = unigram.tokenize("the cat")
    assert "".join(pieces) == "\u2581the\u2581cat"
    assert all(p.startswith("\u2581") for p in [pieces[0]])
    ids = unigram.encode("the 🙂🙂 cat")
    assert ids.count(0) == 1  # the unseen emoji, twice: one <unk> for the run, as SentencePiece
    assert unigram.decode(ids) == "the  \u2047  cat"  # SentencePiece's surface of <unk> is " ⁇ "
    assert unigram.encode("") == []


def test_unigram_encode_is_viterbi_per_word(unigram):
    for word in ["\u2581the", "\u2581cats", "\u2581danced", "\u2581zigzag"]:
        assert unigram.tokenize(word[1:]) == unigram.viterbi(word)[0]


def test_unigram_subword_regularisation(unigram):
    text = "the cats danced on the mat"
    samples = {tuple(unigram.encode(text, alpha=0.2, seed=s)) for s in range(20)}
    assert len(samples) > 1
    assert unigram.encode(text, alpha=0.2, seed=7) == unigram.encode(text, alpha=0.2, seed=7)


def test_unigram_training_is_deterministic_and_saves(unigram, tmp_path):
    again = UnigramTokenizer().train(UNIGRAM_TEXT, 60)
    assert again.pieces == unigram.pieces
    unigram.save(tmp_path / "unigram.json")
    loaded = UnigramTokenizer.load(tmp_path / "unigram.json")
    assert loaded.pieces == unigram.pieces and loaded.vocab == unigram.vocab
    for text in [UNIGRAM_TEXT, "the 🙂 cat", " x "]:
        assert loaded.encode(text) == unigram.encode(text)


def test_unigram_validates_input(unigram):
    with pytest.raises(ValueError, match="vocab_size=5 is too small"):
        UnigramTokenizer().train(UNIGRAM_TEXT, 5)
    with pytest.raises(ValueError, match="finite"):
        UnigramTokenizer.from_pieces({"a": float("nan")})
    with pytest.raises(TypeError, match="pieces"):
        UnigramTokenizer.from_pieces([("a", -1.0)])
    with pytest.raises(ValueError, match="cannot also be a piece"):
        UnigramTokenizer.from_pieces({"<unk>": -1.0})
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        unigram.sample("\u2581the", alpha=-1.0)
    with pytest.raises(ValueError, match="no pieces yet"):
        UnigramTokenizer().encode("abc")
    with pytest.raises(ValueError, match=r"ids\[0\] = 60"):
        unigram.decode([60])
    with pytest.raises(ValueError, match="shrink_factor"):
        UnigramTokenizer().train(UNIGRAM_TEXT, 60, shrink_factor=1.5)


# --- loading published vocabularies: bad input (the real files are tested in test_tokenizers_openai.py) -----


def _byte_ranks():
    return {bytes([b]): b for b in range(256)}


def test_from_tiktoken_and_from_gpt2_files_validate_input(tmp_path):
    with pytest.raises(ValueError, match="single bytes"):
        BPETokenizer.from_tiktoken({b"a": 0}, GPT2_SPLIT_PATTERN)
    with pytest.raises(ValueError, match="rank 5"):
        BPETokenizer.from_tiktoken({**_byte_ranks(), b"ab": 5}, GPT2_SPLIT_PATTERN)
    with pytest.raises(ValueError, match="which is the token"):
        BPETokenizer.from_tiktoken(_byte_ranks(), GPT2_SPLIT_PATTERN, {"<|x|>": 65})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BPETokenizer.from_tiktoken(tmp_path / "missing.tiktoken", GPT2_SPLIT_PATTERN)
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("YQ== 0\nnot-base64! 1\n", encoding="ascii")
    with pytest.raises(ValueError, match="line 2"):
        BPETokenizer.from_tiktoken(bad, GPT2_SPLIT_PATTERN)
    # GPT-2's format, written here with its byte-to-unicode map: a merge of unknown tokens, ids out of order
    from llmarch.tokenizers import bytes_to_unicode

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)} | {"ab": 257, "abc": 256}
    vocab_json, merges_txt = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab_json.write_text(json.dumps(vocab), encoding="utf-8")
    merges_txt.write_text("#version: 0.2\na b\nab c\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must grow"):
        BPETokenizer.from_gpt2_files(vocab_json, merges_txt)
    merges_txt.write_text("#version: 0.2\nx yz\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not in"):
        BPETokenizer.from_gpt2_files(vocab_json, merges_txt)


def test_loaded_vocabulary_ids_special_tokens_and_errors(tmp_path):
    """A small vocabulary in tiktoken's format whose byte ids are not the bytes (as in GPT-2)."""
    ranks = {bytes([b]): 255 - b for b in range(256)} | {b"ab": 256, b"abc": 257}
    tok = BPETokenizer.from_tiktoken(ranks, GPT2_SPLIT_PATTERN, {"<|end|>": 300})
    assert tok.byte_ids[ord("a")] == 255 - ord("a") and tok.vocab_size == 301
    assert tok.encode("abc abd") == [257, 255 - ord(" "), 256, 255 - ord("d")]
    assert tok.encode("x<|end|>", allowed_special="all") == [255 - ord("x"), 300]
    with pytest.raises(ValueError, match="not allowed"):
        tok.encode("x<|end|>")
    assert tok.encode("<|nope|>", allowed_special={"<|nope|>"}) == tok.encode("<|nope|>")  # ignored, as tiktoken
    with pytest.raises(TypeError, match="strings"):
        tok.encode("x", allowed_special={3})
    with pytest.raises(ValueError, match="unused"):
        tok.decode([299])
    with pytest.raises(ValueError, match="trained layout"):
        tok.save(tmp_path / "x.json")
    with pytest.raises(TypeError, match="iterable of str"):
        list(tok.encode_iterable("a string"))
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"  # a lone surrogate, as tiktoken


def test_priority_queue_merge_equals_rescanning():
    """merge_by_rank_heap against the O(n^2) rule written out here: merge the adjacent pair of smallest rank,
    the leftmost among equal ranks, until no pair has a rank."""
    from llmarch.tokenizers import merge_by_rank_heap

    rng = random.Random(5)
    for _ in range(300):
        ranks = {}
        for r in range(10, 10 + rng.randint(1, 12)):
            ranks[(rng.randint(0, 3 + r - 10), rng.randint(0, 3 + r - 10))] = r
        ids = [rng.randint(0, 3) for _ in range(rng.randint(0, 30))]
        expected = list(ids)
        while True:
            found = [(ranks[p], k) for k, p in enumerate(zip(expected, expected[1:])) if p in ranks]
            if not found:
                break
            r, k = min(found)
            expected[k : k + 2] = [r]
        assert merge_by_rank_heap(ids, ranks) == expected, (ids, ranks)
