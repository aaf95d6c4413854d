"""Byte-level BPE: encoding time against tiktoken, and training time against a naive trainer and Hugging Face.

    python benchmarks/bench_bpe.py [--part all|encode|tiktoken|train] [--corpus zipf|grammar] [--megabytes 1.0]
                                   [--vocab-size 2000] [--naive-merges 150] [--repeats 3] [--hf-threads 1]
                                   [--mixed-megabytes 10] [--stream-megabytes 50]

Encoding (``--part encode``): GPT-2's and GPT-4's (cl100k_base) official vocabularies, loaded by
:func:`llmarch.tokenizers.openai_tokenizer`, encode 1 MB of real English text (the Python documentation's
pydoc topics, then the book's chapters) and 1 MB of Python code (the standard library's sources), against
tiktoken built from the same rank files (its ``encode`` runs on one thread). llmarch's cache of merged
pre-tokens is emptied before every run, so each run merges every distinct pre-token again. The ids must be
equal; the printed ratio is llmarch's CPU time over tiktoken's (target: at most 3 on the 1 MB texts). A
last row encodes one pre-token of 8,000 random letters, where merging (not the regex) is all the work.

The tiktoken interface (``--part tiktoken``), GPT-4's vocabulary (cl100k_base) against tiktoken in the same
run, five numbers: (1) ``Encoding.encode_ordinary`` on ``--mixed-megabytes`` of mixed text (:func:`mixed_text`;
llmarch's cache emptied before each run), target at most 1.5x tiktoken's CPU time; (2) ``encode_iterable``
over the lines of the same text against tiktoken's ``encode`` of the whole, target at most 2x; (3) building
the encoding from its rank file, target at most 1 s (wall); (4) the growth of the resident memory when the
encoding is loaded, in a fresh process each, target at most 1.5x tiktoken's; (5) ``encode_iterable`` over
the lines of a ``--stream-megabytes`` file in a fresh process: the peak resident memory, and how much of it
came after loading. The ids must equal tiktoken's.

Training:

All three train byte-level BPE with GPT-2's pre-tokenisation on the same text to the same vocabulary size
(256 byte tokens + merges, no special tokens):

- ``llmarch``: :meth:`llmarch.tokenizers.BPETokenizer.train` (pair counts updated incrementally: only the
  pre-tokens that contain the merged pair are rewritten, a heap with lazy deletion finds the next pair);
- ``naive``: written below, the textbook loop: after every merge, recount *every* adjacent pair over the whole
  table of distinct pre-tokens and rewrite every pre-token (with llmarch's ``merge_symbols``). Same tie rule as
  llmarch (smallest pair of ids), so it must learn exactly the same merges -- checked on the merges it runs. It
  is slow, so by default it runs only ``--naive-merges`` merges; the time of the remaining ones is *estimated*
  from single naive steps timed at a few later points (the pre-tokens fast-forwarded there with the merges
  llmarch learned), because a naive step gets cheaper as the pre-tokens get shorter. ``--naive-merges 0`` means
  "run them all";
- ``tokenizers``: the Hugging Face library (Rust), ``BpeTrainer`` with the ``ByteLevel`` pre-tokenizer
  (GPT-2 regex, no prefix space) and the 256-byte initial alphabet. Optional: ``pip install tokenizers``
  (the ``bench`` extra); without it that row is skipped. ``--hf-threads 1`` (default) compares single-threaded
  code with single-threaded code.

Corpora: ``zipf`` (default) is ``--megabytes`` of deterministic pseudo-English: sentences of pseudo-words
built from syllables, word frequencies following Zipf's law over 20,000 stems, plus suffixes, digits and
punctuation, so that, like real text, it has tens of thousands of distinct words and a long tail.
``grammar`` is the course's synthetic corpus (``llmarch.data.synthetic_corpus``), kept for comparison: it has
only 36 distinct words, so BPE runs out of pairs after 92 merges whatever the requested size, and there is
nothing for an incremental trainer to save.

Prints CPU and wall times, the ratios of CPU times (naive / llmarch, llmarch / tokenizers) and how many of
llmarch's merges the Rust trainer also learned. No assertions: the numbers are for the book's "Byte-level BPE"
section. On a 2-core machine the default run takes about a minute and a half (training) plus half a minute
(encoding).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

import numpy as np

from llmarch.tokenizers import (
    OPENAI_SPECIAL_TOKENS,
    OPENAI_SPLIT_PATTERNS,
    BPETokenizer,
    bytes_to_unicode,
    merge_symbols,
    openai_tokenizer,
    pretokenize,
)


# --------------------------------------------------------------------------------------------------------------
# corpora


def zipf_corpus(n_bytes: int, seed: int = 0, n_stems: int = 20_000) -> str:
    """``n_bytes`` characters (all ASCII) of pseudo-English with a Zipfian vocabulary; the same for a given seed."""
    rng = np.random.default_rng(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "br", "st",
              "tr", "pl", "ch", "sh", "th", "gr", "cl"]
    vowels = ["a", "e", "i", "o", "u", "ea", "ou", "ai", "io"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck"]
    stems: dict[str, None] = {}
    while len(stems) < n_stems:
        n_syllables = int(rng.choice([1, 2, 2, 3, 3, 4]))
        parts = rng.integers(0, [len(onsets), len(vowels), len(codas)], size=(n_syllables, 3))
        stems["".join(onsets[a] + vowels[b] + codas[c] for a, b, c in parts)] = None
    stem_list = list(stems)
    weights = 1.0 / (np.arange(1, n_stems + 1) + 2.7)  # Zipf-Mandelbrot: frequency ~ 1 / (rank + 2.7)
    suffixes = ["", "s", "ed", "ing", "er", "ly", "ness"]
    suffix_p = [0.55, 0.15, 0.08, 0.08, 0.06, 0.05, 0.03]
    n_words = n_bytes // 5 + 1000  # enough: a word and its space take more than 5 bytes on average
    word_ids = rng.choice(n_stems, size=n_words, p=weights / weights.sum())
    suffix_ids = rng.choice(len(suffixes), size=n_words, p=suffix_p)
    words = [stem_list[w] + suffixes[s] for w, s in zip(word_ids, suffix_ids)]
    out, size, k = [], 0, 0
    while size < n_bytes and k < n_words - 20:
        n = int(rng.integers(4, 18))
        sentence = words[k : k + n]
        k += n
        sentence[0] = sentence[0].capitalize()
        if rng.random() < 0.3:
            sentence.insert(int(rng.integers(1, n)), str(int(rng.integers(0, 2000))))
        if rng.random() < 0.3:
            sentence[int(rng.integers(0, n - 1))] += ","
        piece = " ".join(sentence) + str(rng.choice([".", ".", ".", "?", "!"])) + ("\n" if rng.random() < 0.2 else " ")
        out.append(piece)
        size += len(piece)
    return "".join(out)[:n_bytes]


def grammar_corpus(n_bytes: int, seed: int = 0) -> str:
    """``n_bytes`` characters of the course's synthetic grammar corpus, words joined by spaces."""
    from llmarch.data import default_grammar, synthetic_corpus

    grammar = default_grammar()
    ids = synthetic_corpus(n_bytes // 4, seed=seed)  # about 5.5 bytes per word: more words than needed
    return " ".join(grammar.decode(ids.tolist()))[:n_bytes]


# --------------------------------------------------------------------------------------------------------------
# the naive trainer


class Timer:
    """CPU time of this process and wall time, in seconds. Ratios use CPU time: on a shared machine it depends
    much less on the load than wall time (all trainers here run on one thread)."""

    def __enter__(self):
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = time.process_time() - self._cpu, time.perf_counter() - self._wall


def naive_step(words: list[list[int]], freqs: list[int], new_id: int):
    """One merge the naive way: recount all pairs, take the most frequent (ties: smallest pair), rewrite all."""
    counts: dict[tuple[int, int], int] = {}
    for symbols, f in zip(words, freqs):
        for pair in zip(symbols, symbols[1:]):
            counts[pair] = counts.get(pair, 0) + f
    if not counts:
        return None, words
    top = max(counts.values())
    best = min(pair for pair, c in counts.items() if c == top)
    return best, [merge_symbols(symbols, *best, new_id) for symbols in words]


def naive_train(text: str, vocab_size: int, max_merges: int | None = None):
    """Pre-tokenise and count like llmarch, then merge naively; returns (merges, Timer)."""
    merges = []
    with Timer() as timer:
        counts = Counter(pretokenize(text))
        words = [list(w.encode("utf-8")) for w in counts]
        freqs = list(counts.values())
        n_merges = vocab_size - 256 if max_merges is None else min(max_merges, vocab_size - 256)
        for k in range(n_merges):
            best, words = naive_step(words, freqs, 256 + k)
            if best is None:
                break
            merges.append(best)
    return merges, timer


def naive_step_seconds(word_counts: Counter, merges: list, at: int, repeats: int) -> tuple[float, bool]:
    """Time of naive merge number ``at`` (0-based) and whether it picks llmarch's merge. The pre-tokens are put in
    the state training has after ``at`` merges by encoding each with the first ``at`` merges (the same as
    applying them one after the other)."""
    fast_forward = BPETokenizer(merges[:at], pattern=None)
    words = [fast_forward.encode(w) for w in word_counts]
    freqs = list(word_counts.values())
    times = []
    for _ in range(repeats):
        with Timer() as t:
            best, _ = naive_step(words, freqs, 256 + at)
        times.append(t.cpu)
    return statistics.median(times), best == merges[at]


# --------------------------------------------------------------------------------------------------------------
# Hugging Face tokenizers


def hf_train(text: str, vocab_size: int):
    """Train with the ``tokenizers`` library; returns (merges as byte pairs, Timer, version)."""
    import json

    import tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=0, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = text.splitlines(keepends=True)
    with Timer() as timer:
        tok.train_from_iterator(lines, trainer=trainer)
    decode = {c: b for b, c in bytes_to_unicode().items()}
    merges = json.loads(tok.to_str())["model"]["merges"]
    as_bytes = []
    for m in merges:
        a, b = m if isinstance(m, list) else m.split(" ")
        as_bytes.append((bytes(decode[c] for c in a), bytes(decode[c] for c in b)))
    return as_bytes, timer, tokenizers.__version__


# --------------------------------------------------------------------------------------------------------------
# encoding against tiktoken


def real_texts(n_chars: int = 1_000_000) -> dict[str, str]:
    """``n_chars`` of English prose (pydoc topics, then the book's chapters) and of the standard library's code."""
    import sysconfig
    from pathlib import Path

    from pydoc_data.topics import topics

    english = "\n\n".join(topics[k] for k in sorted(topics))
    for chapter in sorted((Path(__file__).resolve().parents[1] / "book").glob("*.md")):
        if len(english) >= n_chars:
            break
        english += "\n\n" + chapter.read_text(encoding="utf-8")
    code = ""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if len(code) >= n_chars:
            break
        code += path.read_text(encoding="utf-8", errors="replace")
    return {"English": english[:n_chars], "Python code": code[:n_chars]}


def tiktoken_encoding(name: str, tok: BPETokenizer):
    """tiktoken built offline from the ranks ``tok`` was loaded from (never ``tiktoken.get_encoding``)."""
    import tiktoken

    ranks = {tok.vocab[i]: i for i in tok.vocab if i not in tok.special_tokens.values()}
    return tiktoken.Encoding(name, pat_str=OPENAI_SPLIT_PATTERNS[name], mergeable_ranks=ranks,
                             special_tokens=OPENAI_SPECIAL_TOKENS[name])


def encode_benchmark(repeats: int) -> None:
    try:
        import tiktoken
    except ImportError:
        print("tiktoken is not installed (the 'bench' extra): skipping the encoding benchmark")
        return
    texts = real_texts()
    rng = np.random.default_rng(0)  # one pre-token: the merge's complexity, O(n log n) here
    texts["8,000 letters"] = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=8000))
    print(f"encoding 1 MB texts, CPU seconds (median of {repeats}), tiktoken {tiktoken.__version__} on one thread")
    print(f"{'vocabulary':<13} {'text':<13} {'tokens':>8} {'llmarch':>9} {'tiktoken':>9} {'ratio':>7}")
    for name in ("gpt2", "cl100k_base"):
        tok = openai_tokenizer(name)
        enc = tiktoken_encoding(name, tok)
        for label, text in texts.items():
            ours, theirs = [], []
            for _ in range(repeats):
                tok._cache.clear()  # every run merges every distinct pre-token again
                with Timer() as t_ours:
                    ids = tok.encode(text, disallowed_special=())
                with Timer() as t_theirs:
                    expected = enc.encode(text, disallowed_special=())
                ours.append(t_ours.cpu)
                theirs.append(t_theirs.cpu)
            if ids != expected:
                raise SystemExit(f"{name} on {label}: llmarch's ids differ from tiktoken's")
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"{name:<13} {label:<13} {len(ids):>8,} {a:>9.4f} {b:>9.4f} {a / b:>6.2f}x")
    print("ratio = llmarch / tiktoken CPU time, same ids (target: at most 3x on the 1 MB texts)\n")


# --------------------------------------------------------------------------------------------------------------
# the tiktoken interface: five ratios against tiktoken

MULTILINGUAL = [
    "Le cœur a ses raisons que la raison ne connaît point — n’est-ce pas ?",
    "Über die Brücke gingen {n} Menschen, sagte Jürgen.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "العربية لغة جميلة، والكتابة من اليمين إلى اليسار.",
    "हिन्दी में संयुक्ताक्षर जैसे क्ष, त्र और ज्ञ होते हैं।",
    "日本語の文章には、ひらがな・カタカナ・漢字が混ざっています。{n}",
    "中文没有空格，分词很重要。",
    "한국어는 한글로 씁니다. 띄어쓰기가 있습니다.",
    "Tiếng Việt có nhiều dấu thanh: ả, ẫ, ợ. 🙂👍 {n}",
]


def mixed_text(n_chars: int, seed: int = 0) -> str:
    """``n_chars`` of mixed text, in blocks of about 64 KB taken in turn: Python code (the standard library's
    sources, file after file, never repeated), English (the pydoc topics and the book's chapters, 1.5 MB,
    repeated when used up), pseudo-English prose (:func:`zipf_corpus`, a new block each time) and lines in
    eight other scripts with emoji and numbers."""
    import sysconfig
    from pathlib import Path

    from pydoc_data.topics import topics

    english = "\n\n".join(topics[k] for k in sorted(topics)) + "".join(
        "\n\n" + p.read_text(encoding="utf-8") for p in sorted((Path(__file__).resolve().parents[1] / "book")
                                                              .glob("*.md")))
    code_files = iter(sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")))
    rng = np.random.default_rng(seed)
    block, out, size, k, english_at = 65536, [], 0, 0, 0
    while size < n_chars:
        kind = k % 4
        if kind == 0:
            piece = ""
            while len(piece) < block:
                piece += next(code_files).read_text(encoding="utf-8", errors="replace")
        elif kind == 1:
            piece = english[english_at:english_at + block] or english[:block]
            english_at = english_at + block if english_at + block < len(english) else 0
        elif kind == 2:
            piece = zipf_corpus(block, seed=seed + k)
        else:
            lines = [MULTILINGUAL[i].format(n=int(rng.integers(0, 10**6))) for i in rng.integers(0, 9, block // 60)]
            piece = "\n".join(lines) + "\n"
        out.append(piece)
        size += len(piece)
        k += 1
    return "".join(out)[:n_chars]


_LOAD_PROBE = r"""
import gc, sys, time
def memory(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
which, path = sys.argv[1], sys.argv[2]
if which == "llmarch":
    import llmarch.tokenizers as t
    before, start = memory("VmRSS:"), time.perf_counter()
    enc = t.get_encoding("cl100k_base")
else:
    import tiktoken, tiktoken.load
    from llmarch.tokenizers import OPENAI_SPECIAL_TOKENS, OPENAI_SPLIT_PATTERNS
    before, start = memory("VmRSS:"), time.perf_counter()
    enc = tiktoken.Encoding("cl100k_base", pat_str=OPENAI_SPLIT_PATTERNS["cl100k_base"],
                            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(path),
                            special_tokens=OPENAI_SPECIAL_TOKENS["cl100k_base"])
enc.encode("warm up: hello world")
seconds = time.perf_counter() - start
gc.collect()
print(seconds, memory("VmRSS:") - before)
"""

_STREAM_PROBE = r"""
import array, itertools, sys, time, zlib
from llmarch.tokenizers import openai_tokenizer
def memory(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
tok = openai_tokenizer("cl100k_base")
tok.encode("warm up")
loaded = memory("VmHWM:")
start, n, crc = time.process_time(), 0, 0
with open(sys.argv[1], encoding="utf-8", newline="") as f:
    ids = tok.encode_iterable(f, disallowed_special=())
    while batch := array.array("I", itertools.islice(ids, 1 << 20)):  # uint32, as tiktoken's numpy output
        n, crc = n + len(batch), zlib.crc32(batch, crc)
print(n, time.process_time() - start, loaded, memory("VmHWM:"), crc)
"""


def tiktoken_benchmark(megabytes: float, stream_megabytes: float, repeats: int) -> None:
    """The five numbers of the tiktoken interface, each against tiktoken in the same run (cl100k_base)."""
    import gzip
    import subprocess
    import sys
    import tempfile
    import zlib
    from pathlib import Path

    import tiktoken
    import tiktoken.load

    import llmarch.tokenizers as ours

    name = "cl100k_base"
    folder = Path(tempfile.mkdtemp(prefix="bench-bpe-"))
    rank_file = folder / f"{name}.tiktoken"
    rank_file.write_bytes(gzip.decompress(ours.openai_vocabulary_files(name)[0].read_bytes()))

    def build_tiktoken():
        return tiktoken.Encoding(name, pat_str=OPENAI_SPLIT_PATTERNS[name],
                                 mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(rank_file)),
                                 special_tokens=OPENAI_SPECIAL_TOKENS[name])

    loads = {"llmarch": [], "tiktoken": []}  # (seconds, bytes) of a cold load, each in a fresh process
    for _ in range(repeats):
        for which in loads:
            run = subprocess.run([sys.executable, "-c", _LOAD_PROBE, which, str(rank_file)], capture_output=True,
                                 text=True, check=True)
            seconds, grown = run.stdout.split()
            loads[which].append((float(seconds), int(grown)))
    enc = ours.get_encoding(name)
    ref = build_tiktoken()
    text = mixed_text(int(megabytes * 1e6))
    print(f"tiktoken {tiktoken.__version__} (one thread) against llmarch, {name}; CPU seconds, median of {repeats}")
    ours_t, theirs_t = [], []
    for _ in range(repeats):
        enc._bpe._cache.clear()
        with Timer() as t:
            ids = enc.encode_ordinary(text)
        ours_t.append(t.cpu)
        with Timer() as t:
            expected = ref.encode_ordinary(text)
        theirs_t.append(t.cpu)
    if ids != expected:
        raise SystemExit("encode: llmarch's ids differ from tiktoken's")
    lines = text.splitlines(keepends=True)
    iter_t = []
    for _ in range(repeats):
        enc._bpe._cache.clear()
        with Timer() as t:
            streamed = list(enc._bpe.encode_iterable(lines, disallowed_special=()))
        iter_t.append(t.cpu)
    if streamed != expected:
        raise SystemExit("encode_iterable: llmarch's ids differ from tiktoken's")
    e_o, e_t, i_o = statistics.median(ours_t), statistics.median(theirs_t), statistics.median(iter_t)

    stream_file = folder / "stream.txt"
    with open(stream_file, "w", encoding="utf-8", newline="") as f:
        chunk = int(megabytes * 1e6)
        for k in range(max(1, round(stream_megabytes / megabytes))):
            f.write(text if k == 0 else mixed_text(chunk, seed=k))
    run = subprocess.run([sys.executable, "-c", _STREAM_PROBE, str(stream_file)], capture_output=True, text=True,
                         check=True)
    n_stream, stream_cpu, loaded_rss, peak_rss, crc = run.stdout.split()
    stream_bytes = stream_file.stat().st_size
    with open(stream_file, encoding="utf-8", newline="") as f:
        expected = ref.encode_to_numpy(f.read(), disallowed_special=())
    if (len(expected), zlib.crc32(expected.astype("<u4").tobytes())) != (int(n_stream), int(crc)):
        raise SystemExit("encode_iterable on the file: llmarch's ids differ from tiktoken's")
    del expected
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()

    mb = len(text.encode("utf-8")) / 1e6
    print(f"1. encode {mb:.1f} MB of mixed text: llmarch {e_o:.2f} s, tiktoken {e_t:.2f} s: "
          f"{e_o / e_t:.2f}x (target <= 1.5x), {len(ids):,} ids, equal")
    print(f"2. encode_iterable over its {len(lines):,} lines: llmarch {i_o:.2f} s, tiktoken's encode {e_t:.2f} s: "
          f"{i_o / e_t:.2f}x (target <= 2x), equal ids")
    (b_o, m_o), (b_t, m_t) = (tuple(statistics.median(x) for x in zip(*loads[w])) for w in ("llmarch", "tiktoken"))
    print(f"3. build {name} from its rank file, in a fresh process: llmarch {b_o:.2f} s (target <= 1 s), "
          f"tiktoken {b_t:.2f} s: {b_o / b_t:.2f}x (wall)")
    print(f"4. memory after loading (growth of the resident set): llmarch {m_o / 2**20:.0f} MiB, tiktoken "
          f"{m_t / 2**20:.0f} MiB: {m_o / m_t:.2f}x (target <= 1.5x)")
    print(f"5. encode_iterable over a {stream_bytes / 1e6:.0f} MB file's lines: {int(n_stream):,} ids in "
          f"{float(stream_cpu):.1f} s CPU; peak resident memory {int(peak_rss) / 2**20:.0f} MiB, "
          f"{(int(peak_rss) - int(loaded_rss)) / 2**20:.0f} MiB above its peak once loaded (the ids are checked "
          "against tiktoken's by count and CRC-32, not kept)\n")


# --------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["all", "encode", "tiktoken", "train"], default="all")
    parser.add_argument("--mixed-megabytes", type=float, default=10.0, help="mixed text for --part tiktoken")
    parser.add_argument("--stream-megabytes", type=float, default=50.0, help="the file encode_iterable streams")
    parser.add_argument("--corpus", choices=["zipf", "grammar"], default="zipf")
    parser.add_argument("--megabytes", type=float, default=1.0, help="size of the training text (10^6 bytes)")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--naive-merges", type=int, default=150,
                        help="merges the naive trainer really runs (0: all); the rest are estimated")
    parser.add_argument("--checkpoints", type=int, default=8, help="later merges at which a naive step is timed")
    parser.add_argument("--repeats", type=int, default=3, help="runs of llmarch and tokenizers (median)")
    parser.add_argument("--hf-threads", type=int, default=1, help="threads for the Rust trainer")
    args = parser.parse_args()
    # the Rust library reads these when it starts its thread pool, i.e. at the first parallel call
    os.environ["RAYON_NUM_THREADS"] = str(args.hf_threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if args.hf_threads == 1 else "true"
    if args.part in ("all", "encode"):
        encode_benchmark(args.repeats)
    if args.part in ("all", "tiktoken"):
        tiktoken_benchmark(args.mixed_megabytes, args.stream_megabytes, args.repeats)
    if args.part in ("encode", "tiktoken"):
        return

    n_bytes = int(args.megabytes * 1e6)
    text = zipf_corpus(n_bytes) if args.corpus == "zipf" else grammar_corpus(n_bytes)
    word_counts = Counter(pretokenize(text))
    print(f"corpus {args.corpus!r}: {len(text.encode('utf-8')):,} bytes, {len(word_counts):,} distinct pre-tokens "
          f"(GPT-2 regex); requested vocabulary {args.vocab_size} = 256 bytes + {args.vocab_size - 256} merges")

    ours_runs = []
    for _ in range(args.repeats):
        with Timer() as timer:
            ours = BPETokenizer().train(text, args.vocab_size)
        ours_runs.append(timer)
    t_ours = statistics.median(t.cpu for t in ours_runs)
    w_ours = statistics.median(t.wall for t in ours_runs)
    merges = ours.merges
    n_total = len(merges)
    if n_total < args.vocab_size - 256:
        print(f"note: no pair was left after {n_total} merges; every trainer stops there")

    # naive: run the first merges for real, estimate the rest
    run_all = args.naive_merges <= 0 or args.naive_merges >= n_total
    naive_merges, naive_timer = naive_train(text, args.vocab_size, None if run_all else args.naive_merges)
    t_naive_run = naive_timer.cpu
    same = naive_merges == merges[: len(naive_merges)]
    if run_all:
        t_naive, how = t_naive_run, f"all {len(naive_merges)} merges run ({naive_timer.wall:.1f} s wall)"
    else:
        k = len(naive_merges)
        points = sorted({int(x) for x in np.linspace(k, n_total - 1, args.checkpoints)})
        steps = [naive_step_seconds(word_counts, merges, m, repeats=3) for m in points]
        step_times = [t for t, _ in steps]
        same = same and all(agrees for _, agrees in steps)
        rest = float(np.interp(np.arange(k, n_total), points, step_times).sum())
        t_naive = t_naive_run + rest
        linear = t_naive_run / k * n_total
        how = (f"ran {k} merges in {t_naive_run:.1f} s, the other {n_total - k} ESTIMATED at {rest:.1f} s from\n"
               f"{'':58}naive steps timed at merges {points[0]}..{points[-1]} (plain linear extrapolation\n"
               f"{'':58}of the first {k}: {linear:.1f} s)")

    hf = None
    try:
        hf_runs = [hf_train(text, args.vocab_size) for _ in range(args.repeats)]
        hf = (hf_runs[0][0], statistics.median(r[1].cpu for r in hf_runs), hf_runs[0][2],
              statistics.median(r[1].wall for r in hf_runs))
    except ImportError:
        print("tokenizers is not installed (pip install tokenizers, or the 'bench' extra): skipping that row")

    print(f"\n{'trainer':<34} {'CPU s':>9} {'x llmarch':>10} {'wall s':>9}")
    print(f"{'llmarch BPETokenizer.train':<34} {t_ours:>9.2f} {1.0:>10.2f} {w_ours:>9.2f}   median of {args.repeats}")
    print(f"{'naive recount every merge':<34} {t_naive:>9.2f} {t_naive / t_ours:>10.2f} {'':>9}   {how}")
    if hf:
        name = f"tokenizers {hf[2]} ({args.hf_threads} thread{'s' if args.hf_threads > 1 else ''})"
        print(f"{name:<34} {hf[1]:>9.2f} {hf[1] / t_ours:>10.2f} {hf[3]:>9.2f}   median of {args.repeats}")

    print(f"\nCPU time: llmarch is {t_naive / t_ours:.1f}x faster than the naive trainer (target: at least 30x)")
    if hf:
        print(f"CPU time: llmarch takes {t_ours / hf[1]:.1f}x the time of tokenizers (target: at most 5x)")
    print(f"the naive trainer picks llmarch's merge at every merge it ran or timed: {same}")
    if hf:
        ours_bytes = [(ours.vocab[a], ours.vocab[b]) for a, b in merges]
        theirs = hf[0]
        common = len(set(ours_bytes) & set(theirs))
        differ = [i for i, (x, y) in enumerate(zip(ours_bytes, theirs)) if x != y]
        prefix = differ[0] if differ else min(len(ours_bytes), len(theirs))
        print(f"merges: llmarch {len(ours_bytes)}, tokenizers {len(theirs)}; {common} of llmarch's are also in "
              f"tokenizers' list; the two lists agree on their first {prefix} merges")
        tokens_ours = {a + b for a, b in ours_bytes}
        tokens_theirs = {a + b for a, b in theirs}
        print(f"tokens: {len(tokens_ours & tokens_theirs)} of llmarch's {len(tokens_ours)} learned tokens are also "
              f"tokenizers' tokens")
        if prefix < min(len(ours_bytes), len(theirs)):
            # count both candidate pairs in the state both trainers share after `prefix` merges
            state = BPETokenizer(merges[:prefix], pattern=None)
            pair_counts: Counter = Counter()
            for word, f in word_counts.items():
                ids = state.encode(word)
                for pair in zip(ids, ids[1:]):
                    pair_counts[state.vocab[pair[0]], state.vocab[pair[1]]] += f
            print(f"  first difference, merge {prefix}: llmarch {ours_bytes[prefix]} "
                  f"(count {pair_counts[ours_bytes[prefix]]}) vs tokenizers {theirs[prefix]} "
                  f"(count {pair_counts[theirs[prefix]]})")


if __name__ == "__main__":
    main()
