"""Trusted checks of ps5-efficient: fresh inputs for every hidden test cell, llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps5-efficient/ps5-efficient.ipynb``.
The softmax statistics (running maximum and sum) have no llmarch function of their own; their reference is the
definition, computed with torch on the prefix of the row (not block by block, so it cannot share a mistake with
an online implementation).
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import Case, Check, FailureClass
from llmarch.attention import causal_mask, scaled_dot_product_attention, softmax
from llmarch.efficient import attention, sliding_window_mask

NOTEBOOK = "ps5-efficient.ipynb"
TRUSTED_CALLABLES: dict = {}


def _t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def _stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, sum exp(x - max)) along the last axis; (-inf, 0) for a row with no finite entry."""
    m = x.amax(dim=-1)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return m, torch.exp(x - safe[..., None]).sum(dim=-1)


# --- references ---------------------------------------------------------------------------------------------


def ref_window(T, w, causal=True):
    return sliding_window_mask(int(T), int(w), causal=bool(causal)).numpy()


def ref_merge(m1, l1, m2, l2):
    """The statistics of the union, through log-sum-exp: log l = logaddexp(m1 + log l1, m2 + log l2) - m."""
    m1, l1, m2, l2 = (_t(a) for a in (m1, l1, m2, l2))
    m = torch.maximum(m1, m2)
    lse = torch.logaddexp(m1 + torch.log(l1), m2 + torch.log(l2))
    l = torch.where(torch.isfinite(m), torch.exp(lse - torch.where(torch.isfinite(m), m, torch.zeros_like(m))),
                    torch.zeros_like(m))
    return m.numpy(), l.numpy()


def ref_online_softmax(x, block_size):
    x = _t(x)
    n, bs = x.shape[-1], int(block_size)
    prefixes = [_stats(x[..., : min(end, n)]) for end in range(bs, n + bs, bs)]
    m_run = torch.stack([m for m, _ in prefixes], dim=-1)
    l_run = torch.stack([l for _, l in prefixes], dim=-1)
    return softmax(x, dim=-1).numpy(), m_run.numpy(), l_run.numpy()


def ref_tiled(q, k, v, block_size, is_causal=False):
    q, k, v = _t(q), _t(k), _t(v)
    out = scaled_dot_product_attention(q, k, v, is_causal=bool(is_causal))
    scores = q @ k.transpose(-2, -1) / np.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2]), float("-inf"))
    return out.numpy(), torch.logsumexp(scores, dim=-1).numpy()


def ref_gqa(q, k, v, is_causal=False):
    return attention(_t(q), _t(k), _t(v), is_causal=bool(is_causal), backend="reference").numpy()


def ref_decode(q, k_new, v_new, k_cache, v_cache):
    keys = torch.cat([_t(k_cache), _t(k_new)], dim=-2)
    values = torch.cat([_t(v_cache), _t(v_new)], dim=-2)
    t_new, t_all = q.shape[-2], keys.shape[-2]
    mask = causal_mask(t_new, t_all, offset=t_all - t_new)  # bottom-right: new token i is at position t_past + i
    out = attention(_t(q), keys, values, mask=mask, backend="reference")
    return out.numpy(), keys.numpy(), values.numpy()


# --- fresh inputs -------------------------------------------------------------------------------------------


# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _window_causal(rng):
    T = int(rng.integers(5, 13))
    return [
        Case((5, 3), note="T = 5, w = 3"),
        Case((4, 1), note="a window of 1"),
        Case((T, int(rng.integers(2, T - 1))), note="a random T and w"),
        Case((T, 1), note="a random T, a window of 1"),
        Case((T, T), {"causal": True}, note="a window as long as the sequence"),
        Case((T, T + int(rng.integers(1, 6))), note="a window longer than the sequence"),
        Case((1, int(rng.integers(1, 4))), note="a single position"),
        Case((int(rng.integers(6, 13)), int(rng.integers(2, 6))), {"causal": True}, note="causal=True passed by name"),
    ]


def _window_bidirectional(rng):
    T = int(rng.integers(6, 13))
    odd, even = 2 * int(rng.integers(1, 3)) + 1, 2 * int(rng.integers(1, 3))
    windows = {odd: "an odd window", even: "an even window", 1: "a window of 1"}
    return [Case((5, 2), {"causal": False}, note="T = 5, an even window, 2"),
            Case((5, 3), {"causal": False}, note="T = 5, an odd window, 3")] + [
        Case((T, w), {"causal": False}, note=windows.get(w, "a window longer than the sequence"))
        for w in (odd, even, 1, 2 * T + int(rng.integers(0, 3)))]


def _block_stats(rng, rows, scale=3.0, offset=0.0):
    x = rng.normal(size=(rows, int(rng.integers(1, 6)))) * scale + offset
    m = x.max(axis=1)
    return m, np.exp(x - m[:, None]).sum(axis=1)


def _merge_stats(rng):
    rows = int(rng.integers(3, 7))
    (m1, l1), (m2, l2) = _block_stats(rng, rows), _block_stats(rng, rows)
    (a1, b1), (a2, b2) = _block_stats(rng, 6), _block_stats(rng, 6)
    worked = (np.array([2.0, 3.0]), np.array([1.5, 1.0]), np.array([3.0, 2.0]), np.array([1.0, 1.5]))  # both orders
    return [Case(worked, note="the worked example, the larger maximum on either side"),
            Case((m1, l1, m2, l2), note="random rows"),
            Case((a1.reshape(2, 3), b1.reshape(2, 3), a2.reshape(2, 3), b2.reshape(2, 3)),
                 note="statistics of shape (2, 3)")]


def _merge_extremes(rng):
    rows = 8
    big = [_block_stats(rng, rows, offset=sign * 1e4) for sign in (1, 1, -1, -1)]
    (m1, l1), (m2, l2) = _block_stats(rng, rows), _block_stats(rng, rows)
    empty1, empty2 = rng.random(rows) < 0.4, rng.random(rows) < 0.4
    empty1[0] = empty2[0] = True  # row 0: two empty blocks
    m1, l1 = np.where(empty1, -np.inf, m1), np.where(empty1, 0.0, l1)
    m2, l2 = np.where(empty2, -np.inf, m2), np.where(empty2, 0.0, l2)
    empty = (np.array([-np.inf, -np.inf, 5.0]), np.array([0.0, 0.0, 1.0]), np.array([-np.inf, 5.0, -np.inf]),
             np.array([0.0, 1.0, 0.0]))  # two empty blocks; an empty block on either side
    huge = (np.array([1e4, 5.0]), np.array([2.0, 1.0]), np.array([1e4 - 1, 1e4]), np.array([1.0, 1.0]))
    return [Case(empty, note="empty blocks (maximum -inf): on either side, and both"),
            Case(huge, note="maxima near 1e4"), Case((*big[0], *big[1]), note="random rows with maxima near +1e4"),
            Case((*big[2], *big[3]), note="random rows with maxima near -1e4"),
            Case((m1, l1, m2, l2), note="random rows, some blocks empty")]


def _online_softmax(rng):
    n = int(rng.integers(7, 20))
    bs = int(rng.integers(2, n - 1))
    bs = bs + 1 if n % bs == 0 else bs  # a shorter last block
    x2 = rng.normal(size=(int(rng.integers(2, 5)), n)) * 2
    return [
        Case((rng.normal(size=n) * 2, bs), note="one row, a shorter last block"),
        Case((x2, 1), note="rows, blocks of size 1"),
        Case((x2, n + int(rng.integers(0, 5))), note="rows, one block longer than the row"),
        Case((rng.normal(size=(2, 3, n)), int(rng.integers(2, 5))), note="three axes, small blocks"),
    ]


def _online_softmax_extremes(rng):
    n, bs = int(rng.integers(9, 16)), int(rng.integers(2, 4))
    n = n + 1 if n % bs == 0 else n  # a shorter last block
    rows = 4
    ramp = np.cumsum(rng.uniform(100, 400, size=(rows, n)), axis=1)  # the maximum grows by far more than 709
    x = 1e4 + ramp + rng.normal(size=(rows, n))
    x[:, :bs] = -np.inf  # a fully masked first block
    x[rng.random((rows, n)) < 0.2] = -np.inf  # scattered masked entries
    x[:, -1] = 1e4 + ramp[:, -1]  # every row keeps a finite entry
    low = -1e4 + rng.normal(size=(3, n)) * 5  # everything underflows without the shift
    worked = np.array([-np.inf, -np.inf, 1e4, 1e4 + 1, 1e4 + 1000, 1e4 + 999, 1e4 + 2])  # a masked block, a short one
    return [Case((worked, 2), note="the worked example: a masked block, values near 1e4, a short last block"),
            Case((x, bs), note="a masked first block, scattered -inf, a maximum that grows past exp's range"),
            Case((low, int(rng.integers(2, 5))), note="values near -1e4: everything underflows without the shift")]


def _huge_scores(rng, b, t_q, t_k, sign=1.0):
    """Scores between about 1000 and 1130 everywhere (exp overflows without the running maximum); with
    ``sign=-1``, between about -1130 and -1000 (exp underflows to 0 for a running maximum that starts at 0)."""
    q = np.zeros((b, t_q, 2))
    q[..., 0] = 40.0 * sign
    k = rng.normal(size=(b, t_k, 2))
    k[..., 0] = 38.0 + rng.random((b, t_k))
    return q, k, rng.normal(size=(b, t_k, 3))


def _tiled_full(rng):
    b, h = (int(s) for s in rng.integers(1, 4, size=2))
    t_q, t_k, d, d_v = int(rng.integers(3, 9)), int(rng.integers(9, 20)), int(rng.integers(2, 7)), int(rng.integers(1, 6))
    bs = int(rng.integers(2, t_k - 1))
    bs = bs + 1 if t_k % bs == 0 else bs
    q, k, v = rng.normal(size=(b, h, t_q, d)), rng.normal(size=(b, h, t_k, d)), rng.normal(size=(b, h, t_k, d_v))
    return [
        Case((*_huge_scores(rng, 2, 3, 7), 3), note="scores above 1000: exp overflows without the running maximum"),
        Case((*_huge_scores(rng, 2, 3, 7, sign=-1.0), 3),
             note="scores below -1000: a running maximum that starts at 0 divides 0 by 0"),
        Case((q, k, v, bs), note="four axes (B, H, T, d), a shorter last block"),
        Case((q, k, v, 1), note="blocks of one key"),
        Case((q, k, v, t_k + int(rng.integers(0, 10))), note="one block holds every key"),
        Case((q[0, 0], k[0, 0], v[0, 0], bs), {"is_causal": False}, note="two axes (T, d), is_causal=False by name"),
        Case((q * 30, k * 30, v, int(rng.integers(2, 5))), note="scores in the hundreds and thousands"),
    ]


def _tiled_causal(rng):
    t = int(rng.integers(9, 20))
    bs = int(rng.integers(2, 6))
    bs = bs + 1 if t % bs == 0 else bs
    q, k, v = rng.normal(size=(2, 2, t, 4)), rng.normal(size=(2, 2, t, 4)), rng.normal(size=(2, 2, t, 3))
    return [
        Case((*_huge_scores(rng, 2, 7, 7), 3), {"is_causal": True}, note="scores above 1000, causal"),
        Case((*_huge_scores(rng, 2, 7, 7, sign=-1.0), 3), {"is_causal": True}, note="scores below -1000, causal"),
        Case((q, k, v, bs), {"is_causal": True}, note="four axes, causal, a shorter last block"),
        Case((q[0], k[0], v[0], 1), {"is_causal": True}, note="three axes, causal, blocks of one key"),
        Case((q, k, v, t + int(rng.integers(0, 5))), {"is_causal": True}, note="causal, one block holds every key"),
        Case((q * 20, k * 20, v, int(rng.integers(2, 5))), {"is_causal": True}, note="large scores, causal"),
    ]


def _heads(rng):
    return [(4, 2), (6, 3), (6, 2), (8, 2), (4, 1), (3, 3)][int(rng.integers(0, 6))]


def _gqa_inputs(rng, h, h_kv, t_q, t_k):
    b, d, d_v = int(rng.integers(1, 3)), int(rng.integers(2, 6)), int(rng.integers(1, 5))
    return rng.normal(size=(b, h, t_q, d)), rng.normal(size=(b, h_kv, t_k, d)), rng.normal(size=(b, h_kv, t_k, d_v))


def _gqa(rng):
    cases = [Case(_gqa_inputs(rng, 6, 2, int(rng.integers(2, 7)), int(rng.integers(2, 9))),  # interleaving differs
                  note="6 query heads on 2 key/value heads: h // g, not h % H_kv"),
             Case(_gqa_inputs(rng, 4, 1, 3, 5), note="multi-query attention (one key/value head)"),
             Case(_gqa_inputs(rng, 3, 3, 4, 4), note="multi-head attention (H_kv = H)")]
    h, h_kv = _heads(rng)
    return cases + [Case(_gqa_inputs(rng, h, h_kv, int(rng.integers(2, 7)), int(rng.integers(2, 9))),
                         {"is_causal": False}, note="random heads, not causal")]


def _gqa_causal(rng):
    t = int(rng.integers(4, 10))
    h, h_kv = _heads(rng)
    return [Case(_gqa_inputs(rng, 8, 4, t, t), {"is_causal": True}, note="8 query heads on 4, causal"),
            Case(_gqa_inputs(rng, h, h_kv, t, t), {"is_causal": True}, note="random heads, causal")]


def _decode_inputs(rng, h, h_kv, t_past, t_new):
    b, d, d_v = int(rng.integers(1, 3)), int(rng.integers(2, 6)), int(rng.integers(1, 5))
    return (rng.normal(size=(b, h, t_new, d)), rng.normal(size=(b, h_kv, t_new, d)), rng.normal(size=(b, h_kv, t_new, d_v)),
            rng.normal(size=(b, h_kv, t_past, d)), rng.normal(size=(b, h_kv, t_past, d_v)))


def _decode_step(rng):
    h, h_kv = _heads(rng)
    return [Case(_decode_inputs(rng, 4, 2, 0, 1), note="the first token: an empty cache"),
            Case(_decode_inputs(rng, 6, 2, int(rng.integers(1, 9)), 1),
                 note="one new token after a cache, 6 heads on 2"),
            Case(_decode_inputs(rng, h, h_kv, int(rng.integers(1, 9)), 1), note="one new token, random heads")]


def _decode_chunks(rng):
    h, h_kv = _heads(rng)
    return [Case(_decode_inputs(rng, 4, 2, int(rng.integers(2, 7)), int(rng.integers(2, 5))),
                 note="several new tokens after a cache: causal among themselves"),
            Case(_decode_inputs(rng, h, h_kv, int(rng.integers(1, 7)), int(rng.integers(2, 5))),
                 note="several new tokens, random heads"),
            Case(_decode_inputs(rng, 4, 1, 0, int(rng.integers(2, 5))), note="several new tokens, an empty cache")]


CHECKS = {
    "test_window_causal": Check("sliding_window_mask", _window_causal, ref_window),
    "test_window_bidirectional": Check("sliding_window_mask", _window_bidirectional, ref_window),
    "test_merge_stats": Check("merge_softmax_stats", _merge_stats, ref_merge),
    "test_merge_extremes": Check("merge_softmax_stats", _merge_extremes, ref_merge),
    # the notebook asks online_softmax to merge with the student's merge_softmax_stats
    "test_online_softmax": Check("online_softmax", _online_softmax, ref_online_softmax,
                                 depends_on=("merge_softmax_stats",)),
    "test_online_softmax_extremes": Check("online_softmax", _online_softmax_extremes, ref_online_softmax,
                                          depends_on=("merge_softmax_stats",)),
    "test_tiled_full": Check("tiled_attention", _tiled_full, ref_tiled),
    "test_tiled_causal": Check("tiled_attention", _tiled_causal, ref_tiled),
    "test_gqa": Check("grouped_query_attention", _gqa, ref_gqa),
    "test_gqa_causal": Check("grouped_query_attention", _gqa_causal, ref_gqa),
    "test_decode_step": Check("decode_step", _decode_step, ref_decode),
    "test_decode_chunks": Check("decode_step", _decode_chunks, ref_decode),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _window(case):
    """(T, w, causal) of a window case."""
    return case.args[0], case.args[1], case.kwargs.get("causal", True)


def _blocks(n, block_size):
    """How the blocks cover a row of n entries: "short" (a shorter last block), "one" (a single block holds
    the row), or "even" (equal blocks)."""
    return "one" if block_size >= n else ("short" if n % block_size else "even")


def _scores(case):
    q, k = case.args[0], case.args[1]
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def _running_max_jumps(case):
    """The running maximum grows by more than exp's range (709) from one block to the next."""
    _, m_run, _ = ref_online_softmax(*case.args)
    return bool((np.diff(np.where(np.isfinite(m_run), m_run, np.nan), axis=-1) > 709).any())


def _grouped(case, minimum_kv=2):
    """Query heads grouped on at least ``minimum_kv`` key/value heads, several per group."""
    h, h_kv = case.args[0].shape[1], case.args[1].shape[1]
    return h_kv >= minimum_kv and h // h_kv >= 2


def _tiled_class(name, check, blocks, causal):
    return FailureClass(name, check, lambda case: _blocks(case.args[1].shape[-2], case.args[3]) == blocks
                        and case.kwargs.get("is_causal", False) == causal and case.args[1].shape[-2] > 1)


FAILURE_CLASSES = [
    FailureClass("a window of 1", "test_window_causal", lambda case: _window(case)[1] == 1 and _window(case)[0] > 1),
    FailureClass("a window shorter than the sequence", "test_window_causal",
                 lambda case: 1 < _window(case)[1] < _window(case)[0]),
    FailureClass("a window as long as the sequence or longer", "test_window_causal",
                 lambda case: _window(case)[1] >= _window(case)[0] > 1),
    FailureClass("a single position", "test_window_causal", lambda case: _window(case)[0] == 1),
    FailureClass("causal=True passed by name", "test_window_causal", lambda case: case.kwargs.get("causal") is True),
    FailureClass("an even window, not causal", "test_window_bidirectional",
                 lambda case: not _window(case)[2] and _window(case)[1] % 2 == 0 and _window(case)[1] < _window(case)[0]),
    FailureClass("an odd window above 1, not causal", "test_window_bidirectional",
                 lambda case: not _window(case)[2] and _window(case)[1] % 2 == 1 and 1 < _window(case)[1] < _window(case)[0]),
    FailureClass("a window of 1, not causal", "test_window_bidirectional",
                 lambda case: not _window(case)[2] and _window(case)[1] == 1),
    FailureClass("a window longer than the sequence, not causal", "test_window_bidirectional",
                 lambda case: not _window(case)[2] and _window(case)[1] > _window(case)[0]),
    FailureClass("the larger maximum on either side", "test_merge_stats",
                 lambda case: (case.args[0] > case.args[2]).any() and (case.args[2] > case.args[0]).any()),
    FailureClass("statistics of two axes", "test_merge_stats", lambda case: np.ndim(case.args[0]) == 2),
    FailureClass("an empty block (maximum -inf) on either side", "test_merge_extremes",
                 lambda case: (np.isneginf(case.args[0]) & np.isfinite(case.args[2])).any()
                 and (np.isneginf(case.args[2]) & np.isfinite(case.args[0])).any()),
    FailureClass("two empty blocks", "test_merge_extremes",
                 lambda case: (np.isneginf(case.args[0]) & np.isneginf(case.args[2])).any()),
    FailureClass("maxima above 709 (exp overflows in absolute terms)", "test_merge_extremes",
                 lambda case: np.max(case.args[0]) > 709),
    FailureClass("maxima below -709 (exp underflows in absolute terms)", "test_merge_extremes",
                 lambda case: np.max(case.args[0]) < -709),
    FailureClass("a shorter last block", "test_online_softmax",
                 lambda case: _blocks(np.shape(case.args[0])[-1], case.args[1]) == "short"),
    FailureClass("blocks of size 1", "test_online_softmax", lambda case: case.args[1] == 1),
    FailureClass("one block holds the whole row", "test_online_softmax",
                 lambda case: case.args[1] >= np.shape(case.args[0])[-1]),
    FailureClass("three axes", "test_online_softmax", lambda case: np.ndim(case.args[0]) == 3),
    FailureClass("a fully masked first block", "test_online_softmax_extremes",
                 lambda case: np.isneginf(np.asarray(case.args[0])[..., : case.args[1]]).all(axis=-1).any()),
    FailureClass("a running maximum that jumps past exp's range", "test_online_softmax_extremes", _running_max_jumps),
    FailureClass("a row whose values are all below -709", "test_online_softmax_extremes",
                 lambda case: (np.max(case.args[0], axis=-1) < -709).any()),
    FailureClass("scores above 709 (exp overflows without the running maximum)", "test_tiled_full",
                 lambda case: _scores(case).max() > 709),
    FailureClass("scores below -709 everywhere (a running maximum that starts at 0)", "test_tiled_full",
                 lambda case: _scores(case).max() < -709),
    _tiled_class("keys in blocks with a shorter last one", "test_tiled_full", "short", False),
    FailureClass("blocks of one key", "test_tiled_full", lambda case: case.args[3] == 1),
    _tiled_class("one block holds every key", "test_tiled_full", "one", False),
    FailureClass("two axes (T, d)", "test_tiled_full", lambda case: case.args[0].ndim == 2),
    FailureClass("values of another width than the keys (d_v != d)", "test_tiled_full",
                 lambda case: case.args[2].shape[-1] != case.args[0].shape[-1]),
    FailureClass("scores above 709, causal", "test_tiled_causal", lambda case: _scores(case).max() > 709),
    FailureClass("scores below -709 everywhere, causal", "test_tiled_causal", lambda case: _scores(case).max() < -709),
    _tiled_class("causal, a shorter last block", "test_tiled_causal", "short", True),
    FailureClass("causal, blocks of one key", "test_tiled_causal", lambda case: case.args[3] == 1),
    _tiled_class("causal, one block holds every key", "test_tiled_causal", "one", True),
    FailureClass("query heads grouped on several key/value heads (h // g, not h % H_kv)", "test_gqa", _grouped),
    FailureClass("one key/value head (multi-query)", "test_gqa", lambda case: case.args[1].shape[1] == 1),
    FailureClass("as many key/value heads as query heads", "test_gqa",
                 lambda case: case.args[1].shape[1] == case.args[0].shape[1]),
    FailureClass("grouped heads, causal", "test_gqa_causal",
                 lambda case: _grouped(case) and case.kwargs.get("is_causal") and case.args[0].shape[2] > 1),
    FailureClass("one new token, an empty cache", "test_decode_step", lambda case: case.args[3].shape[2] == 0),
    FailureClass("one new token after a cache, grouped heads", "test_decode_step",
                 lambda case: case.args[3].shape[2] > 0 and _grouped(case)),
    FailureClass("several new tokens after a cache (the mask's bottom-right alignment)", "test_decode_chunks",
                 lambda case: case.args[0].shape[2] >= 2 and case.args[3].shape[2] >= 1 and _grouped(case)),
    FailureClass("several new tokens, an empty cache", "test_decode_chunks",
                 lambda case: case.args[0].shape[2] >= 2 and case.args[3].shape[2] == 0),
]
