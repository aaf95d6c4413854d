"""Tokens per byte against vocabulary size for byte-level BPE, WordPiece and Unigram, on two corpora.

Book: Tokenizers, "Comparing the three". Regenerate the file with ``make experiments`` (this script alone
takes about three minutes on a 2-core CPU, almost all of it Unigram training on the second corpus). Training is
deterministic, so a rerun reproduces the counts exactly (the ``train_seconds`` column will differ).

Corpora (train on one part, measure on held-out text):

- ``grammar``: the course's synthetic corpus (``llmarch.data.synthetic_corpus``, 36 distinct words), words
  joined by single spaces; training text from seed 0 (``GRAMMAR_TRAIN_WORDS`` words), held-out text from seed 1;
- ``pydoc``: real English, the documentation topics that ship with CPython (``pydoc_data.topics``, the text of
  ``help("if")`` etc.): every fifth line is held out, the others are the training text. It comes with every
  Python, so nothing is downloaded; its content changes a little between Python versions (the version used is
  in the ``python`` column).

For every corpus, algorithm and requested vocabulary size the script trains a tokenizer with ``llmarch`` and
writes one row of ``book/data/tokenizer_compression.csv``:

- ``corpus, algorithm`` (``bpe``: :class:`BPETokenizer`, GPT-2 pre-tokenisation; ``wordpiece``:
  :class:`WordPieceTokenizer`, BERT pre-tokenisation, cased, merging by the score
  ``count(a b) / (count(a) count(b))`` (pure PMI); ``wordpiece_gain`` and ``wordpiece_freq``: the same
  ``##`` pieces and greedy longest-match encoding, but merging the pair with the largest gain in unigram
  log-likelihood of the training data (Schuster & Nakajima's criterion) or the most frequent pair (what Hugging
  Face's ``tokenizers`` does); ``unigram``: :class:`UnigramTokenizer`);
- ``requested_vocab, vocab_size``: the size asked for and the size obtained (BPE stops when no pair is left,
  Unigram's EM can drop pieces whose expected count is zero);
- ``tokens_per_byte``: tokens of the held-out text divided by its UTF-8 bytes;
- ``unk_fraction``: the fraction of those tokens that are the unknown token (BPE has none);
- ``limit_tokens_per_byte``: the same ratio if every pre-token (BPE), every BERT word (WordPiece) or every
  ``▁``-word (Unigram) of the held-out text were a single token, the best a vocabulary of any size can do
  with that pre-tokenisation;
- ``train_seconds`` (CPU), ``test_bytes``, ``python``.
"""

from __future__ import annotations

import csv
import platform
import time
from pathlib import Path

from llmarch.data import default_grammar, synthetic_corpus
import math
from collections import Counter

from llmarch.tokenizers import BPETokenizer, UnigramTokenizer, WordPieceTokenizer, _bert_pretokenize, _PairIndex, pretokenize

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GRAMMAR_TRAIN_WORDS, GRAMMAR_TEST_WORDS = 20_000, 5_000

SIZES = {
    "grammar": {
        "bpe": [256, 266, 276, 286, 296, 306, 316, 326, 336, 348],
        "wordpiece": [50, 60, 70, 80, 90, 100, 110, 120, 130],
        "wordpiece_gain": [50, 60, 70, 80, 90, 100, 110, 120, 130],
        "wordpiece_freq": [50, 60, 70, 80, 90, 100, 110, 120, 130],
        "unigram": [30, 35, 40, 45, 50, 55, 60, 70, 150],
    },
    "pydoc": {
        "bpe": [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096],
        "wordpiece": [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096],
        "wordpiece_gain": [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096],
        "wordpiece_freq": [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096],
        "unigram": [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096],
    },
}


def grammar_texts() -> tuple[str, str]:
    grammar = default_grammar()
    train = " ".join(grammar.decode(synthetic_corpus(GRAMMAR_TRAIN_WORDS, seed=0).tolist()))
    test = " ".join(grammar.decode(synthetic_corpus(GRAMMAR_TEST_WORDS, seed=1).tolist()))
    return train, test


def pydoc_texts() -> tuple[str, str]:
    from pydoc_data.topics import topics

    lines = "\n".join(topics[name] for name in sorted(topics)).split("\n")
    train = "\n".join(line for i, line in enumerate(lines) if i % 5 != 4)
    test = "\n".join(line for i, line in enumerate(lines) if i % 5 == 4)
    return train, test


def xlogx(x: float) -> float:
    return x * math.log(x) if x > 0 else 0.0


def likelihood_gain(c: int, ca: int, cb: int, n: int, same: bool) -> float:
    """Change of ``sum_s c(s) log(c(s) / N)`` (the training data under a unigram model of its symbols) when ``c``
    occurrences of the pair ``a b`` become a new symbol: ``c(a)`` and ``c(b)`` drop by ``c`` (``c(a)`` by ``2c``
    when ``a == b``), the new symbol has count ``c``, and ``N`` drops by ``c``. With ``sum c log(c/N) = sum c log c
    - N log N``, only these terms change."""
    m = n - c
    if same:
        before, after = xlogx(ca), xlogx(ca - 2 * c) + xlogx(c)
    else:
        before, after = xlogx(ca) + xlogx(cb), xlogx(ca - c) + xlogx(cb - c) + xlogx(c)
    return (after - xlogx(m)) - (before - xlogx(n))


def train_wordpiece_variant(text: str, vocab_size: int, rule: str) -> WordPieceTokenizer:
    """WordPiece training with another merge rule (``"gain"`` or ``"freq"``), otherwise as
    ``WordPieceTokenizer.train`` (same pre-tokenisation, ``##`` pieces, start vocabulary, ties to the smallest
    pair). Encoding is the library's greedy longest match."""
    word_counts = Counter(_bert_pretokenize(text, False))
    words = [[w[0], *("##" + ch for ch in w[1:])] for w in word_counts]
    freqs = list(word_counts.values())
    tokens = ["[UNK]"] + sorted({s for w in words for s in w})
    symbol_counts: Counter = Counter()
    for w, f in zip(words, freqs):
        for s in w:
            symbol_counts[s] += f
    n = sum(symbol_counts.values())
    index, known = _PairIndex(words, freqs), set(tokens)
    while len(tokens) < vocab_size and index.counts:
        if rule == "freq":
            key = {p: c for p, c in index.counts.items()}
        else:
            key = {(a, b): likelihood_gain(c, symbol_counts[a], symbol_counts[b], n, a == b)
                   for (a, b), c in index.counts.items()}
        top = max(key.values())
        a, b = min(p for p, v in key.items() if v == top)
        new = a + b[2:]
        _, merged = index.merge((a, b), new)
        symbol_counts[a] -= merged
        symbol_counts[b] -= merged
        symbol_counts[new] += merged
        n -= merged
        if new not in known:
            known.add(new)
            tokens.append(new)
    return WordPieceTokenizer(tokens)


def limit(algorithm: str, text: str) -> int:
    """How many tokens ``text`` needs if every unit of the pre-tokenisation is a single token."""
    if algorithm == "bpe":
        return len(pretokenize(text))  # GPT-2 pre-tokens
    if algorithm.startswith("wordpiece"):
        return len(WordPieceTokenizer(["[UNK]"]).tokenize(text))  # a vocabulary of [UNK] only: one per BERT word
    return 1 + text.count(" ")  # SentencePiece: one ▁ in front, a new ▁-word at every space


def train_and_measure(algorithm: str, train: str, test: str, size: int) -> tuple[int, int, int]:
    """Returns (vocabulary size obtained, tokens of ``test``, unknown tokens among them)."""
    if algorithm == "bpe":
        tok = BPETokenizer().train(train, size)
        ids = tok.encode(test)
        return tok.vocab_size, len(ids), 0
    if algorithm == "wordpiece":
        tok = WordPieceTokenizer().train(train, size)
        ids = tok.encode(test)
        return tok.vocab_size, len(ids), ids.count(tok.vocab[tok.unk_token])
    if algorithm.startswith("wordpiece_"):
        tok = train_wordpiece_variant(train, size, algorithm.removeprefix("wordpiece_"))
        ids = tok.encode(test)
        return tok.vocab_size, len(ids), ids.count(tok.vocab[tok.unk_token])
    tok = UnigramTokenizer().train(train, size)
    ids = tok.encode(test)
    return tok.vocab_size, len(ids), ids.count(0)


def main() -> None:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    rows = []
    start = time.perf_counter()
    for corpus, make in (("grammar", grammar_texts), ("pydoc", pydoc_texts)):
        train, test = make()
        test_bytes = len(test.encode("utf-8"))
        print(f"{corpus}: {len(train.encode('utf-8')):,} training bytes, {test_bytes:,} held-out bytes")
        for algorithm, sizes in SIZES[corpus].items():
            best = limit(algorithm, test)
            for size in sizes:
                t0 = time.process_time()
                vocab_size, n_tokens, n_unk = train_and_measure(algorithm, train, test, size)
                seconds = time.process_time() - t0
                rows.append([corpus, algorithm, size, vocab_size, f"{n_tokens / test_bytes:.6f}",
                             f"{n_unk / n_tokens:.6f}", f"{best / test_bytes:.6f}", f"{seconds:.2f}", test_bytes,
                             platform.python_version()])
                print(f"  {algorithm:9s} requested {size:5d} got {vocab_size:5d}: {n_tokens / test_bytes:.4f} "
                      f"tokens/byte, {n_unk} unknown, {seconds:.1f} s", flush=True)
    path = DATA_DIR / "tokenizer_compression.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["corpus", "algorithm", "requested_vocab", "vocab_size", "tokens_per_byte", "unk_fraction",
                         "limit_tokens_per_byte", "train_seconds", "test_bytes", "python"])
        writer.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows) in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
