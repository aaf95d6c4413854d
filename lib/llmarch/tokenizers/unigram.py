"""The Unigram language-model tokenizer (Kudo, 2018), the model of SentencePiece: EM training, Viterbi, sampling.

Book: Tokenizers, "Unigram".

A space is the meta symbol ``▁`` (U+2581) and every text gets one ``▁`` in front, so ``"a b" -> ▁a ▁b``;
id 0 is ``<unk>``; piece scores are natural-log probabilities. Training runs forward-backward and Viterbi on
NumPy arrays, one batch of similar-length words at a time.
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping

import numpy as np

from ._common import (
    _check_ids,
    _check_int,
    _check_str,
    _check_word_counts,
    _make_rng,
    _read_json,
    _type_name,
    _write_json_lines,
)

_SPACE_SYMBOL = "\u2581"  # ▁, SentencePiece's meta symbol for a space
_MIN_LOG_PROB = math.log(sys.float_info.min)  # about -708: the floor for a character EM would round to 0
_UNK_SURFACE = "\u2047"  # ⁇, what an <unk> id decodes to (SentencePiece does the same)


def _logsumexp(values: list[float]) -> float:
    if not values:
        return -math.inf
    m = max(values)
    if m == -math.inf:
        return m
    return m + math.log(sum(math.exp(v - m) for v in values))


def _sentencepiece_words(text: str) -> list[str]:
    """Spaces become ``▁``, one ``▁`` goes in front, a new word starts at every ``▁``.

    ``"a  b" -> ["▁a", "▁", "▁b"]``
    """
    if not text:
        return []
    s = _SPACE_SYMBOL + text.replace(" ", _SPACE_SYMBOL)
    starts = [i for i, ch in enumerate(s) if ch == _SPACE_SYMBOL]
    return [s[a:b] for a, b in zip(starts, starts[1:] + [len(s)])]


def _build_lattices(counts: dict[str, int], piece_index: dict[str, int], max_len: int) -> list:
    """Every word's segmentation lattice as arrays, words of similar length batched together.

    A batch is ``(ids, lengths, weights, words)``: ``ids[b, e - 1, l - 1]`` is the index of the piece
    ``word_b[e - l : e]`` (the edge of length ``l`` that ends at position ``e``) or -1 if it is not a piece;
    words are padded to the batch length ``N`` with -1; ``weights`` are the word counts.
    """
    batches: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for word, c in counts.items():
        n = len(word)
        batches[n if n <= 16 else 1 << (n - 1).bit_length()].append((word, c))
    out = []
    for size, group in sorted(batches.items()):
        k = min(max_len, size)
        flat: list[int] = []
        for word, _ in group:
            n = len(word)
            for e in range(1, size + 1):
                if e > n:
                    flat.extend([-1] * k)
                else:
                    flat.extend(piece_index.get(word[e - l : e], -1) if l <= e else -1 for l in range(1, k + 1))
        ids = np.array(flat, dtype=np.int32).reshape(len(group), size, k)
        lengths = np.array([len(w) for w, _ in group], dtype=np.int64)
        weights = np.array([c for _, c in group], dtype=np.float64)
        out.append((ids, lengths, weights, [w for w, _ in group]))
    return out


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1)
    shift = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return shift + np.log(np.exp(x - shift[:, None]).sum(axis=1))


def _forward_backward(lattices: list, log_probs: np.ndarray) -> tuple[np.ndarray, float]:
    """Expected piece counts and the corpus log-likelihood, all words of a batch at once.

    ``alpha[e] = logsumexp_l(alpha[e - l] + log p(word[e-l:e]))`` from ``alpha[0] = 0``;
    ``beta[s] = logsumexp_l(log p(word[s:s+l]) + beta[s + l])`` from ``beta[n] = 0``; ``log P(word) = alpha[n]``;
    the edge ``word[s:e]`` is used ``exp(alpha[s] + log p + beta[e] - log P(word))`` times in expectation.
    """
    expected = np.zeros(len(log_probs))
    total = 0.0
    for ids, lengths, weights, words in lattices:
        batch, size, k = ids.shape
        rows = np.arange(batch)
        lp = np.where(ids >= 0, log_probs[np.maximum(ids, 0)], -np.inf)
        alpha = np.full((batch, size + 1), -np.inf)
        alpha[:, 0] = 0.0
        for e in range(1, size + 1):
            m = min(k, e)
            alpha[:, e] = _logsumexp_rows(alpha[:, e - m : e][:, ::-1] + lp[:, e - 1, :m])
        log_z = alpha[rows, lengths]
        if not np.all(np.isfinite(log_z)):
            word = words[int(np.argmin(np.isfinite(log_z)))]
            raise ValueError(f"{word!r} cannot be segmented with the current pieces")
        beta = np.full((batch, size + 1), -np.inf)
        beta[rows, lengths] = 0.0
        for s in range(size - 1, -1, -1):
            m = min(k, size - s)
            steps = np.arange(m)
            inner = _logsumexp_rows(lp[:, s + steps, steps] + beta[:, s + 1 : s + 1 + m])
            beta[:, s] = np.where(lengths == s, 0.0, inner)
        ends = np.arange(1, size + 1)[:, None]
        starts = np.maximum(ends - np.arange(1, k + 1)[None, :], 0)
        with np.errstate(invalid="ignore"):
            log_post = alpha[:, starts] + lp + beta[:, ends] - log_z[:, None, None]
        used = ids >= 0
        post = np.exp(log_post[used]) * np.broadcast_to(weights[:, None, None], ids.shape)[used]
        expected += np.bincount(ids[used], weights=post, minlength=len(log_probs))
        total += float(weights @ log_z)
    return expected, total


def _best_splits(lattices: list, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every word of ``lattices`` (in pruning: the pieces themselves), the best segmentation that is *not*
    the whole word: Viterbi (``max`` where :func:`_forward_backward` has ``logsumexp``), a batch at a time.

    Returns ``(whole, split)``: ``whole[r]`` is the index of the row's whole word as a piece (-1 if it is not
    one); ``split[r]`` the piece indices of its best split, padded with -1. Ties go to the longest final piece,
    as in :meth:`UnigramTokenizer.viterbi`.
    """
    wholes, splits = [], []
    width = max((ids.shape[2] for ids, *_ in lattices), default=1)
    for ids, lengths, _, _ in lattices:
        batch, size, k = ids.shape
        rows = np.arange(batch)
        wholes.append(ids[rows, lengths - 1, lengths - 1])
        lp = np.where(ids >= 0, log_probs[np.maximum(ids, 0)], -np.inf)
        lp[rows, lengths - 1, lengths - 1] = -np.inf  # forbid the edge that is the whole word
        best = np.full((batch, size + 1), -np.inf)
        best[:, 0] = 0.0
        last = np.zeros((batch, size + 1), dtype=np.int64)  # length of the last piece of the best path
        for e in range(1, size + 1):
            m = min(k, e)
            cand = (best[:, e - m : e][:, ::-1] + lp[:, e - 1, :m])[:, ::-1]  # column j: last piece of length m - j
            j = cand.argmax(axis=1)
            best[:, e] = cand[rows, j]
            last[:, e] = m - j
        split = np.full((batch, width), -1, dtype=np.int64)  # filled from the end, then left-aligned
        pos = lengths.copy()
        for t in range(width):
            active = np.nonzero(pos > 0)[0]
            if not len(active):
                break
            length = last[active, pos[active]]
            split[active, t] = ids[active, pos[active] - 1, length - 1]
            pos[active] -= length
        splits.append(split)  # pieces in reverse order; the order does not matter for the loss
    if not wholes:
        return np.zeros(0, dtype=np.int64), np.zeros((0, width), dtype=np.int64)
    return np.concatenate(wholes), np.concatenate(splits)


def _drop_rows(lattices: list) -> list:
    """Keep the rows whose whole word is (still) a piece."""
    out = []
    for ids, lengths, weights, words in lattices:
        keep = ids[np.arange(len(lengths)), lengths - 1, lengths - 1] >= 0
        if keep.any():
            out.append((ids[keep], lengths[keep], weights[keep], [w for w, k in zip(words, keep.tolist()) if k]))
    return out


class UnigramTokenizer:
    """Unigram language-model tokenizer (Kudo, 2018), the model of SentencePiece.

    Book: Tokenizers, "Unigram".

    A word is a sequence of pieces ``x = (x_1, ..., x_n)`` with probability ``P(x) = prod_i p(x_i)``; a string
    ``X`` has many segmentations ``S(X)``, its likelihood is ``P(X) = sum_{x in S(X)} P(x)``. ``pieces`` maps
    each piece to ``log p`` (natural log); ids: 0 is ``unk_token``, then the pieces in the order of
    ``pieces`` (training sorts them by probability, most probable first). Text is handled as SentencePiece
    does (module docstring): spaces become ``▁`` and every text starts with one, so
    ``decode(encode(text)) == text`` whenever every character of ``text`` is a piece. A character that is not
    a piece is encoded as the ``unk_token`` id (one per character) and decodes to ``⁇``. Only the space is
    replaced (no other normalisation); a ``▁`` already in the input decodes as a space.

    >>> tok = UnigramTokenizer.from_pieces({"a": -1.0, "b": -2.0, "ab": -2.5})
    >>> tok.viterbi("abab")
    (['ab', 'ab'], -5.0)
    """

    def __init__(self, pieces: Mapping[str, float] | None = None, unk_token: str = "<unk>"):
        _check_str("unk_token", unk_token, non_empty=True)
        pieces = {} if pieces is None else pieces
        if not isinstance(pieces, Mapping):
            raise TypeError(f"pieces must be a dict {{piece: log_prob}}, got {_type_name(pieces)}")
        checked: dict[str, float] = {}
        for piece, lp in pieces.items():
            _check_str("each piece", piece, non_empty=True)
            if isinstance(lp, bool) or not isinstance(lp, (int, float)):
                raise TypeError(f"pieces[{piece!r}] must be a float log-probability, got {_type_name(lp)}")
            if not math.isfinite(lp):
                raise ValueError(f"pieces[{piece!r}] = {lp}; log-probabilities must be finite")
            checked[piece] = float(lp)
        if unk_token in checked:
            raise ValueError(f"the unknown token {unk_token!r} cannot also be a piece")
        self.unk_token = unk_token
        self.history: list[tuple[int, float]] = []
        self._set_pieces(checked)

    def _set_pieces(self, pieces: dict[str, float]) -> None:
        self.pieces: dict[str, float] = pieces
        self._id_to_piece = [self.unk_token, *pieces]
        self.vocab: dict[str, int] = {p: i for i, p in enumerate(self._id_to_piece)}
        self._max_len = max((len(p) for p in pieces), default=0)

    @classmethod
    def from_pieces(cls, pieces: Mapping[str, float], unk_token: str = "<unk>") -> UnigramTokenizer:
        """A tokenizer with the given ``{piece: log_prob}`` (ids 1, 2, ... in the dict's order; 0 is ``unk_token``).

        Book: Tokenizers, "Unigram". The log-probabilities need not be normalised for :meth:`viterbi`
        (only differences matter there); :meth:`log_likelihood` treats them as given.
        """
        return cls(pieces, unk_token)

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_piece)

    # ---- the lattice

    def _check_word(self, word: str) -> str:
        _check_str("word", word)
        for ch in word:
            if ch not in self.pieces:
                raise ValueError(
                    f"cannot segment {word!r}: the character {ch!r} is not a piece (encode() maps it to "
                    f"{self.unk_token!r})"
                )
        return word

    def _forward(self, word: str, scale: float = 1.0) -> list[float]:
        """``alpha[e] = log sum over segmentations x of word[:e] of prod p(x_i)^scale``."""
        logp, maxlen = self.pieces, self._max_len
        n = len(word)
        alpha = [-math.inf] * (n + 1)
        alpha[0] = 0.0
        for e in range(1, n + 1):
            terms = []
            for s in range(max(0, e - maxlen), e):
                lp = logp.get(word[s:e])
                if lp is not None and alpha[s] > -math.inf:
                    terms.append(alpha[s] + scale * lp)
            alpha[e] = _logsumexp(terms)
        return alpha

    def _viterbi(self, word: str, split: bool = False) -> tuple[list[str], float]:
        """Best segmentation of ``word``; with ``split=True`` the best one that is not ``word`` itself."""
        get, maxlen = self.pieces.get, self._max_len
        n = len(word)
        best = [0.0] + [-math.inf] * n
        back = [0] * (n + 1)
        for e in range(1, n + 1):
            top, arg = -math.inf, 0
            for s in range(max(0, e - maxlen), e):  # longest final piece first: it wins ties
                lp = get(word[s:e])
                if lp is not None and best[s] + lp > top:
                    top, arg = best[s] + lp, s
            if e == n and split and arg == 0:
                # the best way to end is the whole word: redo the last position without that edge
                top, arg = -math.inf, 0
                for s in range(max(1, e - maxlen), e):
                    lp = get(word[s:e])
                    if lp is not None and best[s] + lp > top:
                        top, arg = best[s] + lp, s
            best[e], back[e] = top, arg
        if best[n] == -math.inf:
            return [], -math.inf
        pieces, e = [], n
        while e > 0:
            pieces.append(word[back[e] : e])
            e = back[e]
        return pieces[::-1], best[n]

    def viterbi(self, word: str) -> tuple[list[str], float]:
        """The most probable segmentation of ``word`` and its log-probability ``sum_i log p(x_i)``.

        Book: Tokenizers, "Unigram": ``x* = argmax_{x in S(X)} log P(x)`` by dynamic programming over the end
        positions, ``best[e] = max_s best[s] + log p(word[s:e])``. Equal scores go to the segmentation whose
        last piece is longest. ``word`` is taken literally (no ``▁`` is added); a character that is not a
        piece raises ``ValueError``.
        """
        self._check_word(word)
        return self._viterbi(word)

    def sample(self, word: str, alpha: float = 1.0, seed=None) -> list[str]:
        """Draw a segmentation ``x`` of ``word`` with probability ``P(x)^alpha / sum_{x'} P(x')^alpha``.

        Book: Tokenizers, "Unigram" (subword regularisation, Kudo, 2018). Forward filtering computes
        ``A[e] = log sum over segmentations of word[:e] of P^alpha``; backward sampling then draws the last piece
        ``word[s:e]`` with probability ``exp(A[s] + alpha log p(word[s:e]) - A[e])`` and repeats from ``s``.
        ``alpha -> 0`` is uniform over segmentations, large ``alpha`` approaches :meth:`viterbi`. ``seed``: an
        int, a ``random.Random`` or ``None``.
        """
        self._check_word(word)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise TypeError(f"alpha must be a finite float, got {alpha!r}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        rng = _make_rng(seed)
        forward = self._forward(word, scale=float(alpha))
        logp, maxlen = self.pieces, self._max_len
        pieces, e = [], len(word)
        while e > 0:
            r = rng.random()
            acc = 0.0
            chosen = None
            for s in range(max(0, e - maxlen), e):
                lp = logp.get(word[s:e])
                if lp is None or forward[s] == -math.inf:
                    continue
                chosen = s
                acc += math.exp(forward[s] + alpha * lp - forward[e])
                if r < acc:
                    break
            pieces.append(word[chosen:e])  # rounding can leave r >= acc: then the last candidate is taken
            e = chosen
        return pieces[::-1]

    # ---- likelihood and EM

    def _word_counts(self, text_or_word_counts) -> dict[str, int]:
        if isinstance(text_or_word_counts, str):
            counts = dict(Counter(_sentencepiece_words(text_or_word_counts)))
        else:
            counts = _check_word_counts(text_or_word_counts, "text_or_word_counts")
        return counts

    def _lattices(self, counts: dict[str, int]) -> list:
        for word in counts:
            self._check_word(word)
        index = {p: k for k, p in enumerate(self.pieces)}
        return _build_lattices(counts, index, self._max_len)

    def _renumber(self, lattices: list, old_pieces: list[str]) -> list:
        """Lattices built for ``old_pieces``, re-indexed for the current pieces (a subset); dropped pieces -> -1."""
        index = {p: k for k, p in enumerate(self.pieces)}
        remap = np.array([index.get(p, -1) for p in old_pieces] + [-1], dtype=np.int32)
        return [(remap[ids], *rest) for ids, *rest in lattices]  # an id of -1 picks remap[-1] = -1

    def _log_probs(self) -> np.ndarray:
        return np.fromiter(self.pieces.values(), dtype=np.float64, count=len(self.pieces))

    def log_likelihood(self, text_or_word_counts) -> float:
        """``L = sum_words count(X) * log sum_{x in S(X)} P(x)`` (natural log), by the forward algorithm.

        Book: Tokenizers, "Unigram". A text is split into ``▁`` words first; a dict ``{word: count}`` is used
        as given. Every character must be a piece.
        """
        lattices = self._lattices(self._word_counts(text_or_word_counts))
        return _forward_backward(lattices, self._log_probs())[1]

    def _em_update(self, lattices) -> tuple[float, bool]:
        """One EM step on prepared lattices; returns the log-likelihood before it and whether pieces were dropped."""
        expected, ll = _forward_backward(lattices, self._log_probs())
        ratios = expected / expected.sum()
        new = {}
        for (p, _), r in zip(self.pieces.items(), ratios):
            if r > 0.0:
                new[p] = math.log(r)
            elif len(p) == 1:  # a character whose expected count underflowed: keep it, encode() needs it
                new[p] = _MIN_LOG_PROB
        dropped = len(new) != len(self.pieces)
        self._set_pieces(new)
        return ll, dropped

    def em_step(self, text_or_word_counts) -> float:
        """One EM iteration on the current pieces; returns the log-likelihood *before* the update.

        Book: Tokenizers, "Unigram". E-step: the expected count ``c(x)`` of each piece, summed over all
        segmentations weighted by their posterior ``P(x | X)``; forward-backward on each word's lattice gives
        it as ``sum over uses X[s:e] = x of exp(alpha[s] + log p(x) + beta[e] - log P(X))``. M-step:
        ``p(x) = c(x) / sum_y c(y)`` (maximum likelihood; SentencePiece adds a Bayesian correction). By the EM
        theorem the likelihood never decreases. Pieces whose expected count is 0 are dropped, except single
        characters, which keep a floor log-probability of about -708 (the smallest normal double) so that
        every character seen stays encodable.
        """
        return self._em_update(self._lattices(self._word_counts(text_or_word_counts)))[0]

    def _prune(self, lattices, piece_lattices, target: int) -> None:
        """Keep the ``target`` pieces whose removal would cost the most likelihood (all characters stay).

        The cost of removing ``x`` is estimated as Kudo (2018) and SentencePiece do: every use of ``x`` is
        replaced by the best segmentation ``alt(x)`` of ``x`` without ``x``. With expected counts ``c`` and
        ``N = sum c``: ``loss(x) = c(x) * (log(c(x) / N) - sum_{y in alt(x)} log p'(y))`` where
        ``p'(y) = (c(y) + c(x)) / (N + c(x) * (|alt(x)| - 1))``. ``lattices`` are the corpus's,
        ``piece_lattices`` those of the pieces themselves (longer than one character), both for the current pieces.
        """
        log_probs = self._log_probs()
        expected, _ = _forward_backward(lattices, log_probs)
        total = float(expected.sum())
        whole, split = _best_splits(piece_lattices, log_probs)
        present = whole >= 0
        whole, split = whole[present], split[present]
        c = expected[whole]
        in_split = split >= 0
        new_total = total + c * (in_split.sum(axis=1) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            new_p = (expected[np.maximum(split, 0)] + c[:, None]) / new_total[:, None]
            split_lp = np.where(in_split, np.log(new_p), 0.0)
            loss = np.where(c / total > 0.0, c * (np.log(c / total) - split_lp.sum(axis=1)), 0.0)
        names = list(self.pieces)
        ranked = sorted(zip((-loss).tolist(), (names[i] for i in whole.tolist())))
        n_chars = sum(1 for p in names if len(p) == 1)
        keep = {p for _, p in ranked[: max(0, target - n_chars)]}
        self._set_pieces({p: lp for p, lp in self.pieces.items() if len(p) == 1 or p in keep})

    def train(
        self,
        text_or_word_counts,
        vocab_size: int,
        *,
        max_piece_length: int = 16,
        seed_size: int = 100_000,
        shrink_factor: float = 0.75,
        em_iterations: int = 2,
    ) -> UnigramTokenizer:
        """Learn ``vocab_size - 1`` pieces (plus ``unk_token``); returns ``self``.

        Book: Tokenizers, "Unigram" (Kudo, 2018, section 3.2).

        1. Seed: every substring of at most ``max_piece_length`` characters seen at least twice (the
           ``seed_size`` most frequent; ties by string), plus every character; ``p`` proportional to frequency.
        2. Repeat: ``em_iterations`` EM steps (:meth:`em_step`); stop if at most ``vocab_size - 1`` pieces are
           left; otherwise prune to ``max(vocab_size - 1, shrink_factor * size)`` pieces, dropping those whose
           removal loses the least likelihood (:meth:`_prune`). Single characters are never dropped.

        Input: a text (split SentencePiece-style into ``▁`` words) or a dict ``{word: count}`` (used as
        given). ``history`` records ``(number of pieces, log-likelihood)`` before every EM step. Pieces are
        finally sorted by log-probability (highest first, ties by string), which fixes the ids. The result can
        have fewer pieces than asked: when the seed is smaller, and when EM drops pieces whose expected count
        underflows to zero (:meth:`em_step`), e.g. once whole words explain a small corpus.
        """
        counts = self._word_counts(text_or_word_counts)
        _check_int("vocab_size", vocab_size, minimum=2)
        _check_int("max_piece_length", max_piece_length, minimum=1)
        _check_int("seed_size", seed_size, minimum=1)
        _check_int("em_iterations", em_iterations, minimum=1)
        if isinstance(shrink_factor, bool) or not isinstance(shrink_factor, (int, float)):
            raise TypeError(f"shrink_factor must be a float in (0, 1), got {_type_name(shrink_factor)}")
        if not 0 < shrink_factor < 1:
            raise ValueError(f"shrink_factor must be in (0, 1), got {shrink_factor}")
        if not counts:
            raise ValueError("the training data is empty")

        chars: Counter[str] = Counter()
        substrings: Counter[str] = Counter()
        for word, c in counts.items():
            for ch in word:
                chars[ch] += c
            n = len(word)
            for s in range(n):
                for e in range(s + 2, min(n, s + max_piece_length) + 1):
                    substrings[word[s:e]] += c
        if len(chars) > vocab_size - 1:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the corpus has {len(chars)} distinct characters, which "
                f"are all kept, plus one id for {self.unk_token!r}: use vocab_size >= {len(chars) + 1}"
            )
        frequent = sorted(((c, s) for s, c in substrings.items() if c >= 2), key=lambda t: (-t[0], t[1]))
        seed = dict(chars)
        for c, s in frequent[: max(0, seed_size - len(chars))]:
            seed[s] = c
        total = sum(seed.values())
        self._set_pieces({p: math.log(c / total) for p, c in seed.items()})

        history: list[tuple[int, float]] = []
        target = vocab_size - 1
        # Pieces are only ever removed after the seed, so the seed's lattices hold every edge there will be:
        # build them once and renumber their piece indices after each removal. The pieces' own lattices
        # (for the pruning loss) lose the rows of removed pieces.
        indexed_for = list(self.pieces)  # the pieces that the lattices' indices refer to
        lattices = self._lattices(counts)
        piece_lattices = self._lattices({p: 1 for p in indexed_for if len(p) > 1})

        def renumber():
            nonlocal lattices, piece_lattices, indexed_for
            lattices = self._renumber(lattices, indexed_for)
            piece_lattices = _drop_rows(self._renumber(piece_lattices, indexed_for))
            indexed_for = list(self.pieces)

        while True:
            for _ in range(em_iterations):
                size = len(self.pieces)
                ll, dropped = self._em_update(lattices)
                history.append((size, ll))
                if dropped:
                    renumber()
            if len(self.pieces) <= target:
                break
            self._prune(lattices, piece_lattices, max(target, int(len(self.pieces) * shrink_factor)))
            renumber()
        ordered = sorted(self.pieces.items(), key=lambda t: (-t[1], t[0]))
        self._set_pieces(dict(ordered))
        self.history = history
        return self

    # ---- text

    def _segment_word(self, word: str, alpha, rng) -> list[int]:
        ids: list[int] = []
        run_start = 0
        for k in range(len(word) + 1):
            if k < len(word) and word[k] in self.pieces:
                continue
            if k > run_start:  # a stretch of known characters
                run = word[run_start:k]
                pieces = self._viterbi(run)[0] if alpha is None else self.sample(run, alpha, rng)
                ids.extend(self.vocab[p] for p in pieces)
            if k < len(word):
                ids.append(0)  # the unknown character: no piece can contain it
            run_start = k + 1
        return ids

    def tokenize(self, text: str, alpha: float | None = None, seed=None) -> list[str]:
        """The pieces of :meth:`encode` (``unk_token`` for unknown characters)."""
        return [self._id_to_piece[i] for i in self.encode(text, alpha, seed)]

    def encode(self, text: str, alpha: float | None = None, seed=None) -> list[int]:
        """Ids of ``text``: each ``▁`` word by :meth:`viterbi`, or sampled with :meth:`sample` when ``alpha`` is set.

        Book: Tokenizers, "Unigram". ``"Hello world" -> ▁Hello ▁world``; unknown characters -> id 0
        (``unk_token``); ``alpha``/``seed`` turn on subword regularisation.
        """
        _check_str("text", text)
        if not self.pieces:
            raise ValueError("this UnigramTokenizer has no pieces yet: call train() or from_pieces()")
        rng = None if alpha is None else _make_rng(seed)
        ids: list[int] = []
        for word in _sentencepiece_words(text):
            ids.extend(self._segment_word(word, alpha, rng))
        return ids

    def decode(self, ids) -> str:
        """Concatenate the pieces, turn ``▁`` back into spaces and drop the one space added in front."""
        ids = _check_ids(ids, self.vocab_size)
        text = "".join(_UNK_SURFACE if i == 0 else self._id_to_piece[i] for i in ids)
        text = text.replace(_SPACE_SYMBOL, " ")
        return text[1:] if text.startswith(" ") else text

    # ---- files

    def save(self, path) -> None:
        """A readable JSON file: ``unk_token``, then one ``[piece, log_prob]`` per line, in id order."""
        header = {"type": "llmarch.UnigramTokenizer", "version": 1, "unk_token": self.unk_token}
        _write_json_lines(path, header, "pieces", [[p, lp] for p, lp in self.pieces.items()])

    @classmethod
    def load(cls, path) -> UnigramTokenizer:
        data = _read_json(path, "llmarch.UnigramTokenizer")
        rows = data.get("pieces")
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 2 for r in rows):
            raise ValueError(f"{path}: 'pieces' must be a list of [piece, log_prob]")
        return cls({p: lp for p, lp in rows}, data.get("unk_token", "<unk>"))

    def __repr__(self) -> str:
        return f"UnigramTokenizer(pieces={len(self.pieces)}, unk_token={self.unk_token!r})"
