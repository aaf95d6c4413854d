"""Trusted checks of ps3-tokenizers: fresh inputs for every hidden test cell, llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps3-tokenizers/ps3-tokenizers.ipynb``.
Inputs and outputs are plain data (strings, dicts, lists of pairs), so every check has ``output="data"``.

Conventions the notebook states and these references follow:

- classic BPE with ``</w>`` as a separate symbol; ties between equally frequent pairs go to the pair seen first,
  scanning the words in the dict's order and each word left to right (``train_bpe_words``, ``tie_break="first"``).
  ``test_train_bpe`` trains only as long as the most frequent pair is unique (so that a tie rule cannot matter
  there) and ``test_train_bpe_ties`` never runs out of pairs (so that stopping early cannot matter there);
- WordPiece: greedy longest match first, ``##`` continuation pieces, a word that cannot be segmented or is longer
  than ``max_chars`` becomes ``[unk]`` (``WordPieceTokenizer``);
- Viterbi: among equally good segmentations of a prefix, the one whose last piece is longest
  (``UnigramTokenizer.viterbi``). ``test_viterbi`` uses inputs whose best segmentation beats the second best by
  a clear margin, so rounding cannot decide it; ``test_viterbi_ties`` uses log-probabilities that are
  multiples of 1/2, whose sums are exact, and makes sure ties happen.
"""

from __future__ import annotations

import itertools

import numpy as np

from autograder.checks import Case, Check, FailureClass
from llmarch.tokenizers import (
    END_OF_WORD,
    UnigramTokenizer,
    WordPieceTokenizer,
    bpe_segment_word,
    merge_symbols,
    train_bpe_words,
)

NOTEBOOK = "ps3-tokenizers.ipynb"
TRUSTED_CALLABLES: dict = {}


# ---- references


def ref_pair_stats(vocab):
    """The definition: every adjacent pair of symbols of every word, weighted by the word's count."""
    stats = {}
    for word, count in vocab.items():
        symbols = word.split()
        for pair in zip(symbols, symbols[1:]):
            stats[pair] = stats.get(pair, 0) + count
    return stats


def ref_merge_pair(pair, vocab):
    a, b = pair
    return {" ".join(merge_symbols(word.split(), a, b, a + b)): count for word, count in vocab.items()}


def ref_train_bpe(word_counts, num_merges):
    return train_bpe_words(word_counts, num_merges)


def ref_bpe_segment(word, merges):
    return bpe_segment_word(word, merges)


def ref_wordpiece(word, vocab, unk="[UNK]", max_chars=100):
    tokenizer = WordPieceTokenizer(list(vocab), unk_token=unk, max_input_chars_per_word=max_chars)
    return tokenizer.tokenize(word)  # the words are letters only, so BERT's pre-tokeniser keeps them whole


def ref_viterbi(word, log_probs):
    return UnigramTokenizer.from_pieces(log_probs).viterbi(word)


# ---- inputs


def _letters(rng, k):
    return [str(c) for c in rng.choice(list("abcdefghijklmnoprstuvwy"), size=k, replace=False)]


def _word(rng, alphabet, lo, hi):
    return "".join(str(c) for c in rng.choice(alphabet, size=int(rng.integers(lo, hi + 1))))


def _corpus(rng, alphabet, n_words, max_len=7, max_count=20):
    """A dict {word: count} of distinct words, in random order (the order decides ties)."""
    words = {}
    while len(words) < n_words:
        words.setdefault(_word(rng, alphabet, 1, max_len), int(rng.integers(1, max_count + 1)))
    return words


def _bpe_state(word_counts, merges):
    """The vocab of training after the given merges: {"l o w </w>": 5, ...}."""
    vocab = {}
    for word, count in word_counts.items():
        symbols = [*word, END_OF_WORD]
        for a, b in merges:
            symbols = merge_symbols(symbols, a, b, a + b)
        vocab[" ".join(symbols)] = count
    return vocab


# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _merge_steps(word_counts, limit):
    """The reference's merges (at most ``limit``) and, for each, whether the most frequent pair was unique."""
    vocab = _bpe_state(word_counts, [])
    merges, unique = [], []
    for _ in range(limit):
        stats = ref_pair_stats(vocab)
        if not stats:
            break
        top = max(stats.values())
        best = max(stats, key=stats.get)
        unique.append(sum(1 for count in stats.values() if count == top) == 1)
        merges.append(best)
        a, b = best
        vocab = {" ".join(merge_symbols(w.split(), a, b, a + b)): c for w, c in vocab.items()}
    return merges, unique


def _pair_stats_cases(rng):
    cases = [Case(({"b a </w>": 1, "a a a </w>": 3, "x y </w>": 2, "xy</w>": 4},),
                  note="a pair twice in one word, and a word of one symbol")]
    for n_merges in (0, int(rng.integers(2, 6))):
        corpus = _corpus(rng, _letters(rng, int(rng.integers(3, 6))), int(rng.integers(4, 8)), max_len=6)
        cases.append(Case((_bpe_state(corpus, train_bpe_words(corpus, n_merges)),),
                          note="a random corpus after a few merges" if n_merges else "a random corpus, no merges"))
    # merges learned on the first two words only: those become single symbols (no pairs), the others do not
    corpus = _corpus(rng, _letters(rng, 3), 5, max_len=5)
    cases.append(Case((_bpe_state(corpus, train_bpe_words(dict(list(corpus.items())[:2]), 20)),),
                      note="some words merged into a single symbol"))
    return cases


def _boundary_vocab(rng):
    """Symbols that end with the pair's first symbol or start with its second: string replacement gets them wrong."""
    p, q, r = _letters(rng, 3)
    vocab = {f"{p}{q} {r} {END_OF_WORD}": 3, f"{q} {r} {p} {END_OF_WORD}": 2, f"{p} {q}{r} {q} {r} {END_OF_WORD}": 4,
             f"{q} {r}{p} {END_OF_WORD}": 1, f"{r} {q} {q} {q} {r} {END_OF_WORD}": 5}
    return (q, r), vocab


def _merge_pair_cases(rng):
    cases = []
    corpus = _corpus(rng, _letters(rng, 4), 6)
    vocab = _bpe_state(corpus, train_bpe_words(corpus, int(rng.integers(0, 5))))
    pairs = list(ref_pair_stats(vocab))
    cases.append(Case((pairs[int(rng.integers(len(pairs)))], vocab),  # any pair present, not only the best
                      note="a random pair of a random vocabulary"))
    cases.append(Case(_boundary_vocab(rng), note="symbols that end or start with the pair's letters"))
    a = _letters(rng, 1)[0]
    repeats = {" ".join([a] * int(k) + [END_OF_WORD]): int(c) for k, c in zip((2, 3, 4, 5), rng.integers(1, 9, 4))}
    cases.append(Case(((a, a), repeats), note="runs of one letter: left to right, no overlaps"))
    cases.append(Case((("q", "z"), vocab), note="a pair that does not occur"))
    return cases


# Small corpora on which one classic mistake changes the merges (found by brute force over tiny corpora):
# counting a pair once per word, ignoring the counts, merging by string replacement, merging right to left.
TIE_FREE_TRAPS = [(({"xaaa": 3}, 1), "one word with a run of one letter, 1 merge"),
                  (({"a": 2, "b": 3}, 1), "words of one letter: the counts decide, 1 merge"),
                  (({"abab": 3, "bab": 4}, 4), "a pair repeated inside words, 4 merges"),
                  (({"a": 1, "aaa": 2}, 2), "a run of one letter, 2 merges")]
TIE_TRAPS = [(({"ab": 2, "ba": 2}, 4), "two words with tied pairs"),  # the tie rule, in both orders of the words
             (({"ba": 2, "ab": 2}, 4), "the same two words in the opposite order"),
             (({"xaaa": 3}, 2), "a run of one letter, with ties, 2 merges"),
             (({"b": 1, "aa": 3}, 1), "tied pairs, 1 merge"), (({"bxbx": 1, "x": 3}, 3), "tied pairs, 3 merges"),
             (({"aaa": 2}, 2), "a run of one letter, with ties, 2 merges")]


def _train_bpe_cases(rng):
    """Training stops before the first tie (no tie rule can matter); it also stops early, and trains 0 merges."""
    cases = [Case(args, note=note) for args, note in TIE_FREE_TRAPS]
    cases += [Case(({"ab": 3, "b": 1}, 10), note="more merges asked than there are pairs"),  # out after 2 merges
              Case(({"ab": 3, "b": 1}, 0), note="zero merges")]
    while len(cases) < len(TIE_FREE_TRAPS) + 4:
        corpus = _corpus(rng, _letters(rng, int(rng.integers(4, 7))), int(rng.integers(5, 9)), max_count=50)
        merges, unique = _merge_steps(corpus, int(rng.integers(5, 16)))
        n = unique.index(False) if False in unique else len(merges)
        if n >= 3:
            cases.append(Case((corpus, n), note="a random corpus, as many merges as come before the first tie"))
    return cases


def _train_bpe_ties_cases(rng):
    """Few letters and equal counts: many pairs tie, and the order of the words matters. Never more merges than
    there are pairs to merge."""
    alphabet = _letters(rng, 2)
    corpus = _corpus(rng, alphabet, 5, max_len=5, max_count=1)
    flipped = dict(reversed(list(corpus.items())))  # the same counts in the opposite order
    n = min(8, len(_merge_steps(corpus, 8)[0]), len(_merge_steps(flipped, 8)[0]))  # the order changes it
    return [Case(args, note=note) for args, note in TIE_TRAPS] + [
        Case((corpus, n), note="a random corpus of two letters with many ties"),
        Case((flipped, n), note="the same corpus in the opposite order")]


def _bpe_segment_cases(rng):
    alphabet = _letters(rng, 5)
    corpus = _corpus(rng, alphabet[:4], 8)
    merges = train_bpe_words(corpus, int(rng.integers(8, 20)))
    seen = list(corpus)[int(rng.integers(len(corpus)))]
    words = [seen, _word(rng, alphabet[:4], 4, 9), _word(rng, alphabet[:4], 6, 10), alphabet[4] + seen]
    traps = [(("xab", [("x", "a"), ("a", "b")]), "merges of symbols, not string replacement"),
             (("aaa", [("a", "a")]), "a run of one letter: left to right"),
             (("abab", [("a", "b")]), "a pair that occurs twice"),
             (("abc", [("b", "c"), ("a", "b")]), "merges applied in the order learned")]
    notes = ["a word of the training corpus", "a random word", "a longer random word",
             "a word that starts with a letter never seen in training"]
    return [Case(args, note=note) for args, note in traps] + [Case((w, merges), note=n) for w, n in zip(words, notes)]


def _wordpiece_vocab(rng, alphabet, unk, drop=()):
    """Every letter (as a first piece and as ##piece, except those in ``drop``) plus random pieces of random words."""
    vocab = [unk] + [c for c in alphabet if c not in drop] + ["##" + c for c in alphabet if c not in drop]
    for _ in range(12):
        w = _word(rng, alphabet, 3, 7)
        s = int(rng.integers(0, len(w) - 1))
        e = int(rng.integers(s + 2, len(w) + 1))
        piece = w[s:e] if rng.random() < 0.4 else "##" + w[s:e]
        if not any(c in drop for c in w[s:e]) and piece not in vocab:
            vocab.append(piece)
    return [vocab[0]] + [vocab[i] for i in rng.permutation(np.arange(1, len(vocab)))]


def _wordpiece_cases(rng):
    alphabet = _letters(rng, 4)
    vocab = _wordpiece_vocab(rng, alphabet, "[UNK]")
    cases = [Case(("abc", ["[UNK]", "a", "ab", "##b", "##c", "##bc"]), note="longest match first"),
             Case(("ab", ["[UNK]", "a", "##b"]), note="continuation pieces are looked up with ##"),
             Case(("a", ["[UNK]", "a", "##a"]), note="a word of one letter")]
    cases += [Case((_word(rng, alphabet, 2, 9), vocab), note="a random word") for _ in range(3)]
    cases.append(Case((_word(rng, alphabet, 3, 8), vocab), {"unk": "[UNK]", "max_chars": 20},
                      note="a random word, max_chars 20"))
    return cases


def _wordpiece_unknown_cases(rng):
    alphabet = _letters(rng, 5)
    missing = alphabet[4]
    vocab = _wordpiece_vocab(rng, alphabet, "<unk>", drop=(missing,))
    w = _word(rng, alphabet[:4], 3, 6)
    p, q, r = alphabet[:3]
    trap = ["[UNK]", p + q, p, "##" + q + r, "##" + r]  # greedy takes pq (not p), then ##r
    trap2 = ["[UNK]", p + q, p, "##" + q + r]  # greedy takes pq, then r cannot continue: [UNK] (p ##qr existed)
    long_word = _word(rng, alphabet[:4], 7, 9)
    return [
        Case((w[:2] + missing + w[2:], vocab), {"unk": "<unk>"}, note="a letter missing from the vocabulary"),
        Case((p + q + r, trap), note="greedy longest match first, then a continuation"),
        Case((p + q + r, trap2), note="greedy longest match first, no backtracking"),
        Case((long_word, vocab), {"unk": "<unk>", "max_chars": len(long_word) - 1},
             note="a word one letter longer than max_chars"),
        Case((long_word, vocab), {"unk": "<unk>", "max_chars": len(long_word)},
             note="a word exactly max_chars long"),
    ]


def _segmentations(word):
    for cuts in itertools.product((False, True), repeat=len(word) - 1):
        pieces, start = [], 0
        for k, cut in enumerate(cuts, start=1):
            if cut:
                pieces.append(word[start:k])
                start = k
        yield pieces + [word[start:]]


def _scores(word, log_probs):
    return sorted((sum(log_probs[p] for p in seg) for seg in _segmentations(word)
                   if all(p in log_probs for p in seg)), reverse=True)


def _unigram_pieces(rng, alphabet, letter_values, piece_values):
    """Every letter and ten random longer pieces. Long pieces may be improbable, so fewest pieces is not always best."""
    pieces = {c: float(rng.choice(letter_values)) for c in alphabet}
    for _ in range(10):
        pieces.setdefault(_word(rng, alphabet, 2, 5), float(rng.choice(piece_values)))
    return pieces


def _unigram_word(rng, pieces, max_len=10):
    """Pieces and letters glued together, so that long pieces matter; at most ``max_len`` letters."""
    multi = [p for p in pieces if len(p) > 1]
    letters = [p for p in pieces if len(p) == 1]
    word = ""
    while len(word) < 3 or rng.random() < 0.7:
        part = multi[int(rng.integers(len(multi)))] if rng.random() < 0.6 else letters[int(rng.integers(len(letters)))]
        if len(word) + len(part) > max_len:
            break
        word += part
    return word


def _viterbi_cases(rng):
    """Continuous log-probabilities; the best segmentation wins by at least 1e-3, so rounding cannot matter."""
    cases = [Case(("aab", {"a": -1.0, "b": -1.0, "aa": -1.5}), note="pieces returned in the word's order"),
             Case(("abc", {"a": -1.0, "b": -1.0, "c": -1.0, "ab": -5.0}), note="a long but improbable piece"),
             Case(("abab", {"a": -2.0, "b": -2.0, "abab": -1.0}), note="the whole word is a piece")]
    while len(cases) < 4:
        alphabet = _letters(rng, 3)
        log_probs = _unigram_pieces(rng, alphabet, np.round(-rng.uniform(0.5, 2.5, 20), 2),
                                    np.round(-rng.uniform(1.0, 8.0, 20), 2))
        word = _unigram_word(rng, log_probs)
        scores = _scores(word, log_probs)
        if len(scores) == 1 or scores[0] - scores[1] > 1e-3:
            cases.append(Case((word, log_probs), note="a random vocabulary with one clearly best segmentation"))
    return cases


def _viterbi_ties_cases(rng):
    """Log-probabilities that are multiples of 1/2 (exact sums): at least two cases have several best segmentations."""
    cases = [Case(("ab", {"a": -1.0, "b": -1.0, "ab": -2.0}), note="two letters and their piece tie"),
             # a|b|cd (3 pieces) and abc|d (2 pieces) tie: the longer last piece wins, not the fewer pieces
             Case(("abcd", {"a": -1.0, "b": -1.0, "c": -5.0, "d": -1.0, "cd": -2.0, "abc": -3.0}),
                  note="a tie between three pieces and two")]
    tied = 0
    while len(cases) < 6:
        alphabet = _letters(rng, 3)
        log_probs = _unigram_pieces(rng, alphabet, [-1.0, -1.5, -2.0], [-1.5, -2.0, -2.5, -3.0, -3.5, -4.0])
        word = _unigram_word(rng, log_probs)
        scores = _scores(word, log_probs)
        has_tie = len(scores) > 1 and scores[0] == scores[1]
        if has_tie or tied >= 2:
            tied += has_tie
            cases.append(Case((word, log_probs), note="random log-probabilities in halves: a tie is possible"))
    return cases


def _data(function, cases, reference, **options):
    return Check(function, cases, reference, output="data", **options)


EXACT = {"rtol": 0.0, "atol": 0.0}
TRAIN_USES = ("get_pair_stats", "merge_pair")  # the notebook builds train_bpe on them (and bpe_segment on merge_pair)

CHECKS = {
    "test_pair_stats": _data("get_pair_stats", _pair_stats_cases, ref_pair_stats, **EXACT),
    "test_merge_pair": _data("merge_pair", _merge_pair_cases, ref_merge_pair, **EXACT),
    "test_train_bpe": _data("train_bpe", _train_bpe_cases, ref_train_bpe, depends_on=TRAIN_USES, **EXACT),
    "test_train_bpe_ties": _data("train_bpe", _train_bpe_ties_cases, ref_train_bpe, depends_on=TRAIN_USES, **EXACT),
    "test_bpe_segment": _data("bpe_segment", _bpe_segment_cases, ref_bpe_segment, depends_on=("merge_pair",), **EXACT),
    "test_wordpiece": _data("wordpiece_encode", _wordpiece_cases, ref_wordpiece, **EXACT),
    "test_wordpiece_unknown": _data("wordpiece_encode", _wordpiece_unknown_cases, ref_wordpiece, **EXACT),
    # the total is a sum of floats: the order of additions may differ from the reference's
    "test_viterbi": _data("viterbi_segment", _viterbi_cases, ref_viterbi, rtol=1e-9, atol=1e-9),
    "test_viterbi_ties": _data("viterbi_segment", _viterbi_ties_cases, ref_viterbi, rtol=1e-9, atol=1e-9),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _words(case):
    return [word.split() for word in case.args[0]]


def _merge_by_replacement_differs(case):
    pair, vocab = case.args
    return list(ref_merge_pair(pair, vocab)) != [w.replace(" ".join(pair), "".join(pair)) for w in vocab]


def _tied_top_pairs(word_counts, num_merges):
    """At each merge of training, the most frequent pairs in first-seen order (several when they tie)."""
    vocab, steps = _bpe_state(word_counts, []), []
    for _ in range(num_merges):
        stats = ref_pair_stats(vocab)
        if not stats:
            break
        top = [pair for pair, count in stats.items() if count == max(stats.values())]
        steps.append(top)
        vocab = ref_merge_pair(top[0], vocab)
    return steps


def _best_segmentations(word, log_probs):
    scored = [(sum(log_probs[p] for p in seg), seg) for seg in _segmentations(word) if all(p in log_probs for p in seg)]
    best = max(score for score, _ in scored)
    return [seg for score, seg in scored if score == best]


def _fewest_pieces_loses_a_tie(case):
    best = _best_segmentations(*case.args)
    return min(best, key=len) != ref_viterbi(*case.args)[0]


def _wordpiece_unk(case):
    return case.kwargs.get("unk", "[UNK]")


def _has_first_piece_but_fails(case):
    """Greedy finds a first piece, but the word as a whole becomes unk (pieces before the unknown one are dropped)."""
    word, vocab = case.args
    return (ref_wordpiece(word, vocab, **case.kwargs) == [_wordpiece_unk(case)]
            and any(word[:e] in vocab for e in range(1, len(word))) and len(word) <= case.kwargs.get("max_chars", 100))


FAILURE_CLASSES = [
    FailureClass("a pair twice in one word", "test_pair_stats",
                 lambda case: any(len(set(zip(w, w[1:]))) < len(w) - 1 for w in _words(case))),
    FailureClass("a word of one symbol (no pairs)", "test_pair_stats", lambda case: any(len(w) == 1 for w in _words(case))),
    FailureClass("word counts above 1 (pairs weighted by them)", "test_pair_stats",
                 lambda case: max(case.args[0].values()) > 1),
    FailureClass("symbols that end or start with the pair's letters (merge symbols, not strings)", "test_merge_pair",
                 _merge_by_replacement_differs),
    FailureClass("a run of three or more of the pair's letter (left to right, no overlaps)", "test_merge_pair",
                 lambda case: case.args[0][0] == case.args[0][1]
                 and any(" ".join([case.args[0][0]] * 3) in w for w in case.args[1])),
    FailureClass("a pair that does not occur", "test_merge_pair",
                 lambda case: tuple(case.args[0]) not in ref_pair_stats(case.args[1])),
    FailureClass("more merges asked than there are pairs", "test_train_bpe",
                 lambda case: case.args[1] > len(ref_train_bpe(*case.args))),
    FailureClass("zero merges", "test_train_bpe", lambda case: case.args[1] == 0),
    FailureClass("a word of one letter (only its end-of-word pair)", "test_train_bpe",
                 lambda case: case.args[1] > 0 and any(len(w) == 1 for w in case.args[0])),
    FailureClass("a pair repeated inside a word, several merges", "test_train_bpe",
                 lambda case: case.args[1] >= 2 and any(len(set(zip(w, w[1:]))) < len(w) - 1 for w in case.args[0])),
    FailureClass("a tie won by a pair that is not the lexicographically largest", "test_train_bpe_ties",
                 lambda case: any(top[0] != max(top) for top in _tied_top_pairs(*case.args))),
    FailureClass("a tie where the pair seen first is not the pair seen last", "test_train_bpe_ties",
                 lambda case: any(len(top) > 1 for top in _tied_top_pairs(*case.args))),
    FailureClass("merges whose order changes the segmentation", "test_bpe_segment",
                 lambda case: ref_bpe_segment(*case.args) != ref_bpe_segment(case.args[0], case.args[1][::-1])),
    FailureClass("a merged pair that occurs twice in the word", "test_bpe_segment",
                 lambda case: any(len(a) == len(b) == 1 and a != b and case.args[0].count(a + b) >= 2
                                  for a, b in case.args[1])),
    FailureClass("a run of three equal letters and their merge", "test_bpe_segment",
                 lambda case: any(a == b and len(a) == 1 and a * 3 in case.args[0] for a, b in case.args[1])),
    FailureClass("a letter never seen in training", "test_bpe_segment",
                 lambda case: any(all(c not in (a + b).replace(END_OF_WORD, "") for a, b in case.args[1])
                                  for c in case.args[0])),
    FailureClass("a shorter and a longer first piece both in the vocabulary (longest first)", "test_wordpiece",
                 lambda case: sum(case.args[0][:e] in case.args[1] for e in range(1, len(case.args[0]) + 1)) >= 2),
    FailureClass("a continuation found only with ##", "test_wordpiece",
                 lambda case: len(case.args[0]) > 1 and case.args[0][1:] not in case.args[1]
                 and "##" + case.args[0][-1] in case.args[1] and case.args[0][-1] not in case.args[1]),
    FailureClass("a word of one letter", "test_wordpiece", lambda case: len(case.args[0]) == 1),
    FailureClass("a letter missing from the vocabulary", "test_wordpiece_unknown",
                 lambda case: any(c not in case.args[1] and "##" + c not in case.args[1] for c in case.args[0])),
    FailureClass("an unk token other than [UNK]", "test_wordpiece_unknown",
                 lambda case: _wordpiece_unk(case) != "[UNK]" and ref_wordpiece(*case.args, **case.kwargs) == [_wordpiece_unk(case)]),
    FailureClass("a word one letter longer than max_chars", "test_wordpiece_unknown",
                 lambda case: len(case.args[0]) == case.kwargs.get("max_chars", 100) + 1),
    FailureClass("a word exactly max_chars long", "test_wordpiece_unknown",
                 lambda case: len(case.args[0]) == case.kwargs.get("max_chars", 100)),
    FailureClass("a word whose first pieces are found before one that is not", "test_wordpiece_unknown",
                 _has_first_piece_but_fails),
    FailureClass("a best segmentation of several different pieces (their order)", "test_viterbi",
                 lambda case: len(set(ref_viterbi(*case.args)[0])) > 1),
    FailureClass("a best segmentation with more pieces than the fewest possible", "test_viterbi",
                 lambda case: len(ref_viterbi(*case.args)[0]) > min(len(seg) for seg in _segmentations(case.args[0])
                                                                    if all(p in case.args[1] for p in seg))),
    FailureClass("the whole word is a piece of the longest length", "test_viterbi",
                 lambda case: case.args[0] in case.args[1] and len(case.args[0]) == max(map(len, case.args[1]))
                 and ref_viterbi(*case.args)[0] == [case.args[0]]),
    FailureClass("several best segmentations (a tie)", "test_viterbi_ties",
                 lambda case: len(_best_segmentations(*case.args)) > 1),
    FailureClass("a tie that the fewest pieces would break the wrong way", "test_viterbi_ties", _fewest_pieces_loses_a_tie),
]
