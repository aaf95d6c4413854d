"""Exact deduplication with suffix arrays: prefix doubling (the teaching version), libdivsufsort (the one
the pipeline uses), the LCP array (Kasai et al. 2001) and the repeated spans that Lee et al. (2022)'s
ExactSubstr removes.

Book: Pretraining data, "Exact deduplication with suffix arrays".

Conventions, stated once here:
- A sequence is a ``str`` (its Unicode code points), ``bytes`` (its byte values) or a 1-D array/sequence of
  integers (token ids). Suffix ``i`` is ``tokens[i:]``; suffixes compare lexicographically, a proper prefix
  before any longer string.
- ``sa = suffix_array(tokens)`` lists the starts of the suffixes in sorted order; ``rank`` is its inverse.
- ``lcp = lcp_array(tokens, sa)``: ``lcp[0] = 0`` and ``lcp[r]`` is the length of the longest common prefix
  of the suffixes ``sa[r - 1]`` and ``sa[r]``.
- Spans are half-open ``(start, end)`` token ranges.

Worked example, ``"banana"``: the sorted suffixes are ``a, ana, anana, banana, na, nana``, so
``sa = [5, 3, 1, 0, 4, 2]`` and ``lcp = [0, 1, 3, 0, 0, 2]``; with ``min_len = 3`` the repeated span is
``(1, 6)``: ``"ana"`` occurs at 1 and at 3 (overlapping occurrences count), covering ``"anana"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["as_token_array", "suffix_array_doubling", "suffix_array", "lcp_array", "repeated_spans",
           "repeated_spans_across"]

_DIGIT_BITS = 16  # numpy's stable argsort is a linear-time radix sort for integers of 16 bits or less


def as_token_array(tokens) -> np.ndarray:
    """``tokens`` as a 1-D ``int64`` array: code points of a ``str``, byte values of ``bytes``, or the integers
    of a 1-D array/sequence.

    Book: Pretraining data, "Exact deduplication with suffix arrays"
    """
    if isinstance(tokens, str):
        return np.frombuffer(tokens.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    if isinstance(tokens, (bytes, bytearray)):
        return np.frombuffer(bytes(tokens), dtype=np.uint8).astype(np.int64)
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "ui":
        raise ValueError(f"tokens must be a str, bytes or integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("token ids must fit in int64")
    return arr.astype(np.int64)


def _radix_argsort(keys: np.ndarray) -> np.ndarray:
    """Stable argsort of non-negative ``int64`` keys by LSD radix sort on 16-bit digits: ``ceil(bits / 16)``
    passes of numpy's stable ``uint16`` argsort, each O(n)."""
    order = np.arange(len(keys))
    top = int(keys.max()) if len(keys) else 0
    shift = 0
    while True:
        digit = ((keys[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += _DIGIT_BITS
        if top >> shift == 0:
            return order


def suffix_array_doubling(tokens) -> np.ndarray:
    """Suffix array of a sequence by prefix doubling (Manber & Myers 1993): ``int64`` of shape ``(n,)``.
    The chapter's teaching version; :func:`suffix_array` gives the same array, faster.

    Round ``k`` (``k = 1, 2, 4, ...``) sorts the suffixes by their first ``2k`` tokens, i.e. by the pair
    (rank of the first ``k``, rank of the next ``k``, or -1 past the end). The order by the second key is read
    off the previous round's array (suffixes ``i >= n - k`` first, then ``sa[j] - k`` for ``sa[j] >= k``); a
    stable radix sort by the first key finishes the round. One round costs ``O(n ceil(log2(n) / 16))``: O(n)
    (two 16-bit radix passes) for ``n < 2**32``. Rounds stop once all ranks differ, after at most
    ``ceil(log2 n)`` of them; with the initial O(n log n) sort of the token values the total is
    ``O(n log n)``.

    Book: Pretraining data, "Exact deduplication with suffix arrays"
    """
    x = as_token_array(tokens)
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, rank = np.unique(x, return_inverse=True)  # dense ranks 0..sigma-1 of the first token
    rank = rank.astype(np.int64).reshape(-1)
    sa = _radix_argsort(rank)
    k = 1
    while rank[sa[-1]] < n - 1 and k < n:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:]
        by_second = np.concatenate([np.arange(n - k, n), sa[sa >= k] - k])
        sa = by_second[_radix_argsort(rank[by_second])]
        first_sorted, second_sorted = rank[sa], second[sa]
        new = np.empty(n, dtype=np.int64)
        new[0] = 0
        np.cumsum(
            (first_sorted[1:] != first_sorted[:-1]) | (second_sorted[1:] != second_sorted[:-1]), out=new[1:]
        )
        rank = np.empty(n, dtype=np.int64)
        rank[sa] = new
        k *= 2
    return sa.astype(np.int64)


def suffix_array(tokens) -> np.ndarray:
    """Suffix array of a sequence, ``int64`` of shape ``(n,)``, by libdivsufsort (Mori's induced-sorting
    algorithm, through ``pydivsufsort``): the array :func:`suffix_array_doubling` computes, in about a
    tenth of its time on 10 MB. Sequences of values below 256 (bytes, Latin-1 text) are sorted as bytes,
    others as ``int64`` values.

    Book: Pretraining data, "Exact deduplication with suffix arrays"
    """
    from pydivsufsort import divsufsort

    x = as_token_array(tokens)
    if len(x) == 0:
        return np.zeros(0, dtype=np.int64)
    small = x.min() >= 0 and x.max() < 256
    return divsufsort(x.astype(np.uint8) if small else x).astype(np.int64)


def _check_sa(sa, n: int) -> np.ndarray:
    sa = np.asarray(sa)
    if sa.shape != (n,) or sa.dtype.kind not in "ui":
        raise ValueError(f"sa must be an integer array of shape ({n},), got dtype {sa.dtype} and shape {sa.shape}")
    if n and (sa.min() < 0 or sa.max() >= n or np.bincount(sa, minlength=n).max() != 1):
        raise ValueError(f"sa must be a permutation of 0..{n - 1}")
    return sa.astype(np.int64)


def lcp_array(tokens, sa) -> np.ndarray:
    """LCP array by Kasai et al. (2001), ``int64`` of shape ``(n,)``: ``lcp[0] = 0``, ``lcp[r] = LCP(suffix
    sa[r-1], suffix sa[r])``.

    Suffixes are visited in text order; going from suffix ``i`` to ``i + 1`` the common prefix with the
    preceding suffix in ``sa`` shrinks by at most one, so the total work is O(n).

    Book: Pretraining data, "Exact deduplication with suffix arrays"
    """
    x = as_token_array(tokens)
    n = len(x)
    sa = _check_sa(sa, n)
    rank = np.empty(n, dtype=np.int64)
    rank[sa] = np.arange(n)
    t, sa_list, rank_list = x.tolist(), sa.tolist(), rank.tolist()
    lcp = [0] * n
    h = 0
    for i in range(n):
        r = rank_list[i]
        if r == 0:
            h = 0
            continue
        j = sa_list[r - 1]
        while i + h < n and j + h < n and t[i + h] == t[j + h]:
            h += 1
        lcp[r] = h
        if h:
            h -= 1
    return np.array(lcp, dtype=np.int64)


def _check_min_len(min_len) -> None:
    if isinstance(min_len, bool) or not isinstance(min_len, (int, np.integer)) or min_len < 1:
        raise ValueError(f"min_len must be a positive integer, got {min_len!r}")


def _merge(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Union of half-open intervals sorted by start: overlapping or touching intervals merge."""
    if len(starts) == 0:
        return []
    reach = np.maximum.accumulate(ends)
    firsts = np.flatnonzero(np.concatenate([[True], starts[1:] > reach[:-1]]))
    return list(zip(starts[firsts].tolist(), np.maximum.reduceat(ends, firsts).tolist()))


def _spans_from_arrays(x: np.ndarray, min_len: int) -> list[tuple[int, int]]:
    n = len(x)
    if n < 2:
        return []
    sa = suffix_array(x)
    lcp = lcp_array(x, sa)
    # longest prefix of suffix sa[r] that occurs elsewhere: the larger LCP with its two neighbours in sa
    longest = np.maximum(lcp, np.concatenate([lcp[1:], [0]]))
    repeated = np.empty(n, dtype=np.int64)
    repeated[sa] = longest
    starts = np.flatnonzero(repeated >= min_len)
    return _merge(starts, starts + repeated[starts])


def repeated_spans(tokens, min_len: int) -> list[tuple[int, int]]:
    """Maximal half-open ranges of ``tokens`` covered by a substring of at least ``min_len`` tokens that occurs
    at least twice in ``tokens`` (overlapping occurrences count): the text ExactSubstr (Lee et al. 2022)
    removes, every occurrence included.

    Position ``p`` is covered iff some window ``tokens[i:i + min_len]`` with ``i <= p < i + min_len`` occurs
    again (a longer repeat contains such windows). Via the suffix and LCP arrays: the longest prefix of suffix
    ``i`` that occurs elsewhere has length ``m_i = max(lcp[rank i], lcp[rank i + 1])``; the answer is the union
    of ``[i, i + m_i)`` over ``m_i >= min_len``, sorted, with overlapping or touching ranges merged.

    Book: Pretraining data, "Exact deduplication with suffix arrays"
    """
    _check_min_len(min_len)
    return _spans_from_arrays(as_token_array(tokens), min_len)


def _later_occurrence_spans(x: np.ndarray, min_len: int) -> list[tuple[int, int]]:
    """Ranges covered by a window ``x[i:i + min_len]`` that also occurs at some ``j < i``.

    The suffixes whose first ``min_len`` tokens agree are consecutive in the suffix array (a run where
    ``lcp >= min_len``); in each run the smallest start is the first occurrence, and every other start's
    window is a later one. The union of those windows comes from a difference array."""
    n = len(x)
    if n < 2:
        return []
    sa = suffix_array(x)
    lcp = lcp_array(x, sa)
    run = np.cumsum(lcp < min_len)  # run id per rank: a new run wherever the common prefix is too short
    firsts = np.flatnonzero(np.concatenate([[True], run[1:] != run[:-1]]))
    first_start = np.minimum.reduceat(sa, firsts)[run - 1]
    later = sa[(sa != first_start) & (sa + min_len <= n)]
    cover = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cover, later, 1)
    np.add.at(cover, later + min_len, -1)
    covered = np.concatenate([[False], np.cumsum(cover[:-1]) > 0, [False]])
    edges = np.flatnonzero(covered[1:] != covered[:-1])
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def repeated_spans_across(docs: Sequence, min_len: int, keep_first: bool = False) -> list[list[tuple[int, int]]]:
    """:func:`repeated_spans` over a collection: for each document, its ranges (in its own positions) covered by
    a substring of at least ``min_len`` tokens that occurs at least twice in the whole collection (in the same
    document or in another).

    ``docs``: a sequence of ``str``, or of ``bytes``, or of integer sequences (one kind). The documents are
    concatenated with a distinct separator token after each, larger than every token, so no repeat crosses a
    document boundary.

    ``keep_first``: only the later occurrences, in collection order: position ``p`` is covered iff a window
    of ``min_len`` tokens containing it occurred earlier (in an earlier document, or earlier in the same
    one). The first copy of each repeated passage stays.

    Book: Pretraining data, "Exact deduplication with suffix arrays"
    """
    _check_min_len(min_len)
    if isinstance(docs, (str, bytes)) or not isinstance(docs, Sequence):
        raise ValueError(f"docs must be a sequence of documents, got {type(docs).__name__}")
    kinds = {str if isinstance(d, str) else bytes if isinstance(d, (bytes, bytearray)) else "ints" for d in docs}
    if len(kinds) > 1:
        raise ValueError("docs mixes str, bytes and integer sequences; use one kind")
    arrays = [as_token_array(d) for d in docs]
    if not arrays:
        return []
    lengths = np.array([len(a) for a in arrays])
    offsets = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
    values = np.concatenate(arrays) if lengths.sum() else np.zeros(0, dtype=np.int64)
    top = int(values.max()) + 1 if len(values) else 0
    pieces = []
    for d, a in enumerate(arrays):
        pieces.extend([a, np.array([top + d], dtype=np.int64)])
    spans = (_later_occurrence_spans if keep_first else _spans_from_arrays)(np.concatenate(pieces), min_len)
    result: list[list[tuple[int, int]]] = [[] for _ in arrays]
    for start, end in spans:  # no span contains a separator: each occurs once
        d = int(np.searchsorted(offsets, start, side="right")) - 1
        result[d].append((start - int(offsets[d]), end - int(offsets[d])))
    return result
