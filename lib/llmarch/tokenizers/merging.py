"""The two inner loops of byte-level BPE: the incremental pair counts of training (:class:`_PairIndex`, which
WordPiece's training shares) and the merge of one pre-token when encoding, by the ranks of id pairs
(:func:`merge_by_rank_heap`) or of byte strings, as tiktoken states its rule (:func:`merge_bytes_by_rank`).

Book: Tokenizers, "Training fast" and "Real vocabularies".
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Mapping

from .classic import merge_symbols


class _PairIndex:
    """Counts of adjacent symbol pairs over distinct words, with an index from each pair to the words holding it.

    ``counts[(a, b)] = sum over words w of freq(w) * (number of positions i with w[i] = a, w[i+1] = b)``.
    A merge rewrites only the words that contain the pair and updates the counts of the pairs that changed,
    instead of recounting the corpus (the ``indices`` idea of subword-nmt's ``learn_bpe.py``).
    """

    def __init__(self, words: list[list], freqs: list[int]):
        self.words = words
        self.freqs = freqs
        self.counts: dict[tuple, int] = defaultdict(int)
        self.where: dict[tuple, set[int]] = defaultdict(set)
        for i, (w, f) in enumerate(zip(words, freqs)):
            for pair in zip(w, w[1:]):
                self.counts[pair] += f
                self.where[pair].add(i)

    def merge(self, pair: tuple, new) -> tuple[set, int]:
        """Merge ``pair`` into the symbol ``new`` everywhere; return the pairs whose count changed and how many
        occurrences (weighted by word frequency) were merged.

        Only the pairs next to each occurrence change: ``(x, a)`` and ``(b, y)`` lose the word's frequency,
        ``(x, new)`` and ``(new, y)`` gain it. ``where[p]`` may still list words that lost ``p`` (they are
        skipped when ``p`` is merged), but always lists every word that holds ``p``."""
        a, b = pair
        where, words, freqs = self.where, self.words, self.freqs
        delta: dict[tuple, int] = defaultdict(int)  # change of each pair's count, summed over the words
        merged = 0
        for i in where.pop(pair, ()):
            w = words[i]
            n = len(w)
            f = freqs[i]
            out: list = []
            made: list[int] = []  # positions of `new` in out
            j = 0
            while j < n:
                if w[j] == a and j + 1 < n and w[j + 1] == b:
                    if j > 0:
                        delta[(w[j - 1], a)] -= f
                    if j + 2 < n and not (j + 3 < n and w[j + 2] == a and w[j + 3] == b):
                        delta[(b, w[j + 2])] -= f  # (if the next occurrence follows, its left side counts it)
                    made.append(len(out))
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            if not made:
                continue  # the word lost the pair in an earlier merge
            merged += len(made) * f
            m = len(out)
            for k in made:
                if k > 0:
                    p = (out[k - 1], new)
                    delta[p] += f
                    where[p].add(i)
                if k + 1 < m and out[k + 1] != new:
                    p = (new, out[k + 1])
                    delta[p] += f
                    where[p].add(i)
            words[i] = out
        counts = self.counts
        changed = set()
        for p, d in delta.items():
            if d and p != pair:
                changed.add(p)
                c = counts[p] + d
                if c:
                    counts[p] = c
                else:
                    del counts[p]
                    where.pop(p, None)
        counts.pop(pair, None)
        return changed, merged


# --------------------------------------------------------------------------------------------------------------
# Byte-level BPE (GPT-2) with BPE-dropout
# --------------------------------------------------------------------------------------------------------------
# Merging one pre-token by rank


def merge_by_rank_heap(ids: list[int], ranks: Mapping[tuple[int, int], int]) -> list[int]:
    """Merge a pre-token with a priority queue: ``O(n log n)`` for ``n`` symbols.

    Book: Tokenizers, "Real vocabularies".

    Repeatedly merge the adjacent pair with the smallest rank, the leftmost among equal ranks (tiktoken's
    rule; ``ranks[(a, b)]`` is the id of the merged token). The symbols form a linked list; the heap holds
    ``(rank, position)`` of candidate pairs, and an entry whose pair has changed since it was pushed is
    skipped when popped.
    """
    n = len(ids)
    sym = list(ids)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get((sym[i], sym[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        r, i = heapq.heappop(heap)
        j = nxt[i] if alive[i] else n
        if j >= n or ranks.get((sym[i], sym[j])) != r:
            continue  # stale: a neighbour was merged after this entry was pushed
        sym[i] = r
        alive[j] = False
        nxt[i] = k = nxt[j]
        if k < n:
            prv[k] = i
            rk = ranks.get((r, sym[k]))
            if rk is not None:
                heapq.heappush(heap, (rk, i))
        p = prv[i]
        if p >= 0:
            rp = ranks.get((sym[p], r))
            if rp is not None:
                heapq.heappush(heap, (rp, p))
    return [s for s, keep in zip(sym, alive) if keep]


def _merge_by_rank_scan(ids: list[int], ranks: Mapping[tuple[int, int], int]) -> list[int]:
    """The same result as :func:`merge_by_rank_heap` by scanning for the best pair at every step (``O(n^2)``,
    faster for short pre-tokens). Merging every occurrence of the best pair at once, left to right, equals
    merging them one at a time: no merge can create a pair of the same rank."""
    while len(ids) >= 2:
        best, best_rank = None, None
        for pair in zip(ids, ids[1:]):
            r = ranks.get(pair)
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = pair, r
        if best is None:
            break
        ids = merge_symbols(ids, best[0], best[1], best_rank)
    return ids


# --------------------------------------------------------------------------------------------------------------
# Merging one pre-token by the ranks of byte strings (tiktoken's formulation)

_NO_RANK = 1 << 62  # larger than any rank: "these bytes are not a token"


def merge_bytes_by_rank(data: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """The token ids of one pre-token, merged by the ranks of byte strings: ``O(n^2)`` scans, ``O(n log n)``
    with a priority queue from 64 bytes on.

    Book: Tokenizers, "Real vocabularies".

    The pre-token is a list of parts (first its single bytes); repeatedly join the two adjacent parts whose
    concatenation has the smallest rank in ``ranks`` (``{token bytes: id}``), the leftmost among equal ranks,
    until no concatenation is a token. For a vocabulary where every token of two or more bytes can be written
    as two tokens of smaller rank (tiktoken's files), this is :func:`merge_by_rank_heap` on ids, without the
    table of pairs: nothing is built beyond ``ranks`` itself.
    """
    n = len(data)
    if n >= 64:
        return _merge_bytes_heap(data, ranks)
    get = ranks.get
    starts = list(range(n + 1))  # part k is data[starts[k]:starts[k + 1]]
    pair_ranks = [get(data[i:i + 2], _NO_RANK) for i in range(n - 1)]  # pair k joins parts k and k + 1
    while pair_ranks:
        best = min(pair_ranks)
        if best == _NO_RANK:
            break
        k = pair_ranks.index(best)  # the leftmost
        del starts[k + 1], pair_ranks[k]
        if k < len(pair_ranks):
            pair_ranks[k] = get(data[starts[k]:starts[k + 2]], _NO_RANK)
        if k > 0:
            pair_ranks[k - 1] = get(data[starts[k - 1]:starts[k + 1]], _NO_RANK)
    return [ranks[data[a:b]] for a, b in zip(starts, starts[1:])]


def _merge_bytes_heap(data: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """:func:`merge_bytes_by_rank` with a heap of ``(rank, start)``; the parts form a linked list (``end[i]``:
    where the part starting at ``i`` ends; ``prev[i]``: where its left neighbour starts)."""
    n = len(data)
    get = ranks.get
    end = list(range(1, n + 1))
    prev = list(range(-1, n - 1))
    alive = bytearray(b"\x01") * n
    heap = [(r, i) for i in range(n - 1) if (r := get(data[i:i + 2])) is not None]
    heapq.heapify(heap)
    while heap:
        r, i = heapq.heappop(heap)
        if not alive[i]:
            continue
        j = end[i]
        if j >= n or get(data[i:end[j]]) != r:
            continue  # stale: a neighbour was merged after this entry was pushed
        k = end[i] = end[j]
        alive[j] = 0
        if k < n:
            prev[k] = i
            rk = get(data[i:end[k]])
            if rk is not None:
                heapq.heappush(heap, (rk, i))
        p = prev[i]
        if p >= 0:
            rp = get(data[p:k])
            if rp is not None:
                heapq.heappush(heap, (rp, p))
    ids, i = [], 0
    while i < n:
        ids.append(ranks[data[i:end[i]]])
        i = end[i]
    return ids


def merge_with_dropout(ids: list[int], ranks: Mapping[tuple[int, int], int], dropout: float,
                       rng: random.Random) -> list[int]:
    """One pre-token's ids merged with BPE-dropout (Provilkov et al., 2020), as in their reference code.

    Book: Tokenizers, "BPE-dropout".

    At every step the candidate merges (``ranks``: ``{(a, b): new id}``, a smaller id merged first) are tried in
    priority order, by rank then position, and each is skipped with probability ``dropout``; the first one
    kept is applied. When every candidate is skipped, the segmentation is final.
    """
    while len(ids) >= 2:
        candidates = sorted((ranks[pair], pos) for pos, pair in enumerate(zip(ids, ids[1:])) if pair in ranks)
        chosen = next((c for c in candidates if rng.random() >= dropout), None)
        if chosen is None:
            break
        new_id, pos = chosen
        ids = ids[:pos] + [new_id] + ids[pos + 2:]
    return ids
