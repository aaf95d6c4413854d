"""The Unigram language-model tokenizer (Kudo, 2018), the model of SentencePiece: EM training, Viterbi, sampling.

Book: Tokenizers, "Unigram".

A space is the meta symbol ``▁`` (U+2581) and every text gets one ``▁`` in front, so ``"a b" -> ▁a ▁b``;
id 0 is ``<unk>``; piece scores are natural-log probabilities. Training runs forward-backward and Viterbi on
NumPy arrays (:mod:`llmarch.tokenizers.unigram_lattice`); encoding and decoding are SentencePiece's, exactly
(:mod:`llmarch.tokenizers.sentencepiece_compat`).
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Mapping

import numpy as np

from ._common import (
    _check_bool,
    _check_ids,
    _check_int,
    _check_special_tokens,
    _check_str,
    _check_word_counts,
    _make_rng,
    _read_json,
    _type_name,
    _write_json_lines,
)
from .sentencepiece_compat import (
    CONTROL,
    SPACE_SYMBOL,
    UNK_PENALTY,
    UNK_SURFACE,
    UNKNOWN,
    best_path_ids,
    check_supported,
    float32,
    merge_unknown_runs,
    normalise,
    read_model_file,
)
from .unigram_lattice import _best_splits, _build_lattices, _drop_rows, _forward_backward

_MIN_LOG_PROB = math.log(sys.float_info.min)  # about -708: the floor for a character EM would round to 0


def _logsumexp(values: list[float]) -> float:
    if not values:
        return -math.inf
    m = max(values)
    if m == -math.inf:
        return m
    return m + math.log(sum(math.exp(v - m) for v in values))


def _words(s: str) -> list[str]:
    """A normalised text cut before every ``▁``: ``"▁a▁▁b" -> ["▁a", "▁", "▁b"]`` (the words EM trains on)."""
    starts = sorted({0, *(i for i, ch in enumerate(s) if ch == SPACE_SYMBOL)}) if s else []
    return [s[a:b] for a, b in zip(starts, starts[1:] + [len(s)])]


class UnigramTokenizer:
    """Unigram language-model tokenizer (Kudo, 2018), the model of SentencePiece.

    Book: Tokenizers, "Unigram".

    A word is a sequence of pieces ``x = (x_1, ..., x_n)`` with probability ``P(x) = prod_i p(x_i)``; a string
    ``X`` has many segmentations ``S(X)``, its likelihood is ``P(X) = sum_{x in S(X)} P(x)``. ``pieces`` maps
    each piece to ``log p`` (natural log); ids: 0 is ``unk_token``, then the ``control_tokens`` (never
    matched in text, decoded to nothing: SentencePiece's ``<s>``, ``</s>``), then the pieces in the order of
    ``pieces`` (training sorts them by probability, most probable first). Text is handled as SentencePiece's
    ``identity`` normaliser does (:func:`~llmarch.tokenizers.sentencepiece_compat.normalise`): spaces become
    ``▁`` and every text starts with one (``add_dummy_prefix``), so ``decode(encode(text)) == text`` whenever
    every character of ``text`` is a piece; ``remove_extra_whitespaces`` (SentencePiece's default, off here)
    first strips and collapses spaces. A run of characters that are not pieces is one ``unk_token`` id, which
    decodes to ``" ⁇ "``. :meth:`encode` gives SentencePiece's ids exactly (float32 scores, its tie rule);
    :meth:`from_sentencepiece` loads a SentencePiece ``.model`` file.

    >>> tok = UnigramTokenizer.from_pieces({"a": -1.0, "b": -2.0, "ab": -2.5})
    >>> tok.viterbi("abab")
    (['ab', 'ab'], -5.0)
    """

    def __init__(self, pieces: Mapping[str, float] | None = None, unk_token: str = "<unk>", *,
                 control_tokens=(), add_dummy_prefix: bool = True, remove_extra_whitespaces: bool = False):
        _check_str("unk_token", unk_token, non_empty=True)
        self.control_tokens = _check_special_tokens(control_tokens, "control_tokens")
        self.add_dummy_prefix = _check_bool("add_dummy_prefix", add_dummy_prefix)
        self.remove_extra_whitespaces = _check_bool("remove_extra_whitespaces", remove_extra_whitespaces)
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
        if unk_token in self.control_tokens:
            raise ValueError(f"the unknown token {unk_token!r} cannot also be a control token")
        for token in (unk_token, *self.control_tokens):
            if token in checked:
                raise ValueError(f"the unknown or control token {token!r} cannot also be a piece")
        self.unk_token = unk_token
        self.history: list[tuple[int, float]] = []
        self._set_pieces(checked)

    def _set_pieces(self, pieces: dict[str, float]) -> None:
        self.pieces: dict[str, float] = pieces
        self._id_to_piece = [self.unk_token, *self.control_tokens, *pieces]
        self.vocab: dict[str, int] = {p: i for i, p in enumerate(self._id_to_piece)}
        self._max_len = max((len(p) for p in pieces), default=0)
        self._scores32 = {p: float32(lp) for p, lp in pieces.items()}
        self._unk_score32 = float32(min(self._scores32.values(), default=0.0) - UNK_PENALTY)

    @classmethod
    def from_pieces(cls, pieces: Mapping[str, float], unk_token: str = "<unk>") -> UnigramTokenizer:
        """A tokenizer with the given ``{piece: log_prob}`` (ids 1, 2, ... in the dict's order; 0 is ``unk_token``).

        Book: Tokenizers, "Unigram". The log-probabilities need not be normalised for :meth:`viterbi`
        (only differences matter there); :meth:`log_likelihood` treats them as given.
        """
        return cls(pieces, unk_token)

    @classmethod
    def from_sentencepiece(cls, model_file) -> UnigramTokenizer:
        """The tokenizer of a SentencePiece Unigram ``.model`` file (a path, or its bytes), with its ids: its
        :meth:`encode` gives ``SentencePieceProcessor.encode``'s ids and :meth:`decode` its text.

        Book: Tokenizers, "Unigram". The file is parsed here (neither ``sentencepiece`` nor ``protobuf`` is
        needed). ``ValueError`` naming the setting for what is not implemented: another model type, a
        normaliser other than ``identity`` (SentencePiece's default is ``nmt_nfkc``), byte fallback,
        user-defined or unused pieces, or ids laid out other than ``<unk>``, control tokens, pieces.
        """
        model = read_model_file(model_file)
        where = "the model bytes" if isinstance(model_file, (bytes, bytearray)) else str(model_file)
        check_supported(model, where)
        types = [t for _, _, t in model.pieces]
        n_reserved = 1 + sum(t == CONTROL for t in types)
        if types[0] != UNKNOWN or UNKNOWN in types[1:] or any(t not in (UNKNOWN, CONTROL) for t in types[:n_reserved]):
            raise ValueError(f"{where}: llmarch needs <unk> at id 0 and the control tokens right after it; the ids "
                             f"0 to {n_reserved - 1} here are {[p for p, _, _ in model.pieces[:n_reserved]]}")
        return cls({p: score for p, score, _ in model.pieces[n_reserved:]}, model.pieces[0][0],
                   control_tokens=[p for p, _, _ in model.pieces[1:n_reserved]],
                   add_dummy_prefix=model.add_dummy_prefix,
                   remove_extra_whitespaces=model.remove_extra_whitespaces)

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
            text = normalise(text_or_word_counts, self.add_dummy_prefix, self.remove_extra_whitespaces)
            counts = dict(Counter(_words(text)))
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

    def _sample_ids(self, s: str, alpha: float, rng) -> list[int]:
        """Sampled ids of the normalised text ``s``: each stretch of known characters by :meth:`sample`, each
        run of characters that are not pieces as one ``unk_token`` id."""
        ids: list[int] = []
        run_start = 0
        for k in range(len(s) + 1):
            if k < len(s) and s[k] in self.pieces:
                continue
            if k > run_start:  # a stretch of known characters
                ids.extend(self.vocab[p] for p in self.sample(s[run_start:k], alpha, rng))
            if k < len(s):
                ids.append(0)  # an unknown character
            run_start = k + 1
        return merge_unknown_runs(ids)

    def tokenize(self, text: str, alpha: float | None = None, seed=None) -> list[str]:
        """The pieces of :meth:`encode` (``unk_token`` for a run of unknown characters; SentencePiece shows
        their text instead)."""
        return [self._id_to_piece[i] for i in self.encode(text, alpha, seed)]

    def encode(self, text: str, alpha: float | None = None, seed=None) -> list[int]:
        """Ids of ``text``: SentencePiece's best segmentation, or one sampled with :meth:`sample` when ``alpha``
        is set.

        Book: Tokenizers, "Unigram". ``"Hello world" -> ▁Hello ▁world``. The best path runs over the whole
        normalised text in float32, as SentencePiece's (:func:`~llmarch.tokenizers.sentencepiece_compat.
        best_path_ids`): a character that is not a piece is an edge of score ``min log p - 10``, and a run
        of them is one ``unk_token`` id. ``alpha``/``seed`` turn on subword regularisation.
        """
        _check_str("text", text)
        if not self.pieces:
            raise ValueError("this UnigramTokenizer has no pieces yet: call train() or from_pieces()")
        s = normalise(text, self.add_dummy_prefix, self.remove_extra_whitespaces)
        if alpha is not None:
            return self._sample_ids(s, alpha, _make_rng(seed))
        return best_path_ids(s, self._scores32, self.vocab, self._max_len, self._unk_score32)

    def decode(self, ids) -> str:
        """The text of ``ids``, as SentencePiece decodes: control tokens are dropped, ``unk_token`` becomes
        ``" ⁇ "`` and ``▁`` a space. When the normaliser adds a ``▁`` in front or removes extra spaces, the
        first piece loses a leading ``▁``; when it removes extra spaces, so does every piece until some text
        has come out."""
        ids = _check_ids(ids, self.vocab_size)
        out, at_start = [], self.add_dummy_prefix or self.remove_extra_whitespaces
        for i in ids:
            if 0 < i <= len(self.control_tokens):
                continue
            piece = UNK_SURFACE if i == 0 else self._id_to_piece[i]
            if at_start and i != 0 and piece.startswith(SPACE_SYMBOL):
                piece = piece[1:]
            out.append(piece)
            at_start = at_start and self.remove_extra_whitespaces and not piece
        return "".join(out).replace(SPACE_SYMBOL, " ")

    # ---- files

    def save(self, path) -> None:
        """A readable JSON file: ``unk_token``, the control tokens and the normaliser's settings, then one
        ``[piece, log_prob]`` per line, in id order."""
        header = {"type": "llmarch.UnigramTokenizer", "version": 1, "unk_token": self.unk_token,
                  "control_tokens": self.control_tokens, "add_dummy_prefix": self.add_dummy_prefix,
                  "remove_extra_whitespaces": self.remove_extra_whitespaces}
        _write_json_lines(path, header, "pieces", [[p, lp] for p, lp in self.pieces.items()])

    @classmethod
    def load(cls, path) -> UnigramTokenizer:
        data = _read_json(path, "llmarch.UnigramTokenizer")
        rows = data.get("pieces")
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 2 for r in rows):
            raise ValueError(f"{path}: 'pieces' must be a list of [piece, log_prob]")
        return cls({p: lp for p, lp in rows}, data.get("unk_token", "<unk>"),
                   control_tokens=data.get("control_tokens", []), add_dummy_prefix=data.get("add_dummy_prefix", True),
                   remove_extra_whitespaces=data.get("remove_extra_whitespaces", False))

    def __repr__(self) -> str:
        return f"UnigramTokenizer(pieces={len(self.pieces)}, unk_token={self.unk_token!r})"
