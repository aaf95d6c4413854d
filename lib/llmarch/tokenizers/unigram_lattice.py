"""The Unigram tokenizer's EM on arrays: every word's segmentation lattice, forward-backward and Viterbi,
one batch of similar-length words at a time.

Book: Tokenizers, "EM over segmentations". Used by :meth:`llmarch.tokenizers.UnigramTokenizer.train`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


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
