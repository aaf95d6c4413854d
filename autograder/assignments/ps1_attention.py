"""Trusted checks of ps1-attention: fresh inputs for every hidden test cell, and llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps1-attention/ps1-attention.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import CallableArg, Case, Check, FailureClass
from llmarch.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention, softmax

NOTEBOOK = "ps1-attention.ipynb"


def _t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def ref_softmax(x, axis=-1):
    return softmax(_t(x), dim=axis).numpy()


def ref_causal_mask(T):
    return causal_mask(int(T)).numpy()


def ref_sdpa(q, k, v, mask=None):
    out, w = scaled_dot_product_attention(
        _t(q), _t(k), _t(v), mask=None if mask is None else torch.as_tensor(mask), return_weights=True
    )
    return out.numpy(), w.numpy()


def _mha_module(w_q, w_k, w_v, w_o, n_heads):
    d_model = w_q.shape[0]
    mha = MultiHeadAttention(d_model, int(n_heads), bias=False).double()
    with torch.no_grad():  # the notebook's row-vector convention x @ W is nn.Linear with weight W^T
        for proj, w in ((mha.q_proj, w_q), (mha.k_proj, w_k), (mha.v_proj, w_v), (mha.o_proj, w_o)):
            proj.weight.copy_(_t(w).T)
    return mha


def ref_mha(x, w_q, w_k, w_v, w_o, n_heads, mask=None):
    x = np.asarray(x)
    batched = _t(x if x.ndim == 3 else x[None])
    out = _mha_module(w_q, w_k, w_v, w_o, n_heads)(batched, mask=None if mask is None else torch.as_tensor(mask))
    out = out.detach().numpy()
    return out if x.ndim == 3 else out[0]


def ref_equivariance_error(f, x, perm):
    return np.float64(np.max(np.abs(f(x[perm]) - f(x)[perm])))


# Trusted versions of the functions the harness hands to `equivariance_error` (capture.CALLABLES).
TRUSTED_CALLABLES = {
    "attention": lambda a: (lambda h: ref_mha(h, a["w_q"], a["w_k"], a["w_v"], a["w_o"], a["n_heads"])),
    "causal_attention": lambda a: (
        lambda h: ref_mha(h, a["w_q"], a["w_k"], a["w_v"], a["w_o"], a["n_heads"], mask=causal_mask(len(h)).numpy())
    ),
    "cumsum": lambda a: (lambda h: np.cumsum(h, axis=0)),
    "scale": lambda a: (lambda h: float(a["factor"]) * h),
}


# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _softmax_examples(rng):
    a = float(rng.uniform(-20, 20))
    c = float(rng.uniform(2, 12))
    return [Case((np.array([1.0, 0.0, 0.0]),), note="the worked example [1, 0, 0]"),
            Case((np.array([float(rng.uniform(-5, 5))]),), note="a single entry"),
            Case((np.full(int(rng.integers(2, 6)), a),), note="equal entries"),
            Case((np.array([c, 0.0, 0.0]),), note="one large entry and two zeros"),
            Case((rng.normal(size=int(rng.integers(3, 9))),), note="a random vector")]


def _softmax_stability(rng):
    x = rng.normal(size=7) * 3
    rows = rng.normal(size=(3, 5)) + np.array([[1000.0], [0.0], [-1000.0]])  # a shift by the global maximum underflows
    return [Case((np.array([1000.0, 0.0, -1000.0]),), note="entries of +-1000: exp overflows without a shift"),
            Case((np.array([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1003.0]]),),
                 note="a row near +1000 and a row near -1000"),
            Case((x + 1000.0,), note="a random vector shifted by +1000"),
            Case((x - 1000.0,), note="a random vector shifted by -1000"),
            Case((rows,), note="rows near +1000, 0 and -1000: shift each row by its own maximum"),
            Case((np.array([800.0, -800.0, 0.0, float(rng.uniform(700, 900))]),), note="two large entries, +-800")]


def _softmax_axis(rng):
    x = rng.normal(size=(3, 4, 5))
    return [Case((rng.normal(size=(4, 6)),), note="a matrix, default axis"),
            Case((x,), {"axis": 0}, note="three axes, along axis 0"),
            Case((x,), {"axis": 1}, note="three axes, along the middle axis"),
            Case((x,), {"axis": -1}, note="three axes, along the last axis")]


def _masks(rng):
    return [Case((1,), note="a single position")] + [Case((int(t),), note="a random length")
                                                         for t in rng.integers(2, 12, size=3)]


def _sdpa_small(rng):
    d, n = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    return [Case((np.array([[1.0, 0.0]]), np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]])), note="the worked example"),
            Case((rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 1))),
                 note="values of another width than the keys (d_v != d)"),
            Case((rng.normal(size=(3, d)), rng.normal(size=(1, d)), rng.normal(size=(1, 2))), note="a single key"),
            Case((rng.normal(size=(1, d)), rng.normal(size=(n, d)), rng.normal(size=(n, int(rng.integers(1, 4))))),
                 note="a single query"),
            Case((rng.normal(size=(3, d)), rng.normal(size=(n, d)), rng.normal(size=(n, 2))),
                 note="random queries, keys and values")]


def _sdpa_mask(rng):
    t = int(rng.integers(3, 8))
    random_mask = rng.random((t, t)) < 0.6
    random_mask[:, 0] = True  # every query sees at least one key
    random_mask[0, -1] = True  # a key after the query: never the causal mask, whatever the draw
    q, k, v = rng.normal(size=(t, 4)), rng.normal(size=(t, 4)), rng.normal(size=(t, 3))
    key_mask = rng.random(t) < 0.6
    seen = int(rng.integers(t))
    key_mask[seen], key_mask[(seen + 1) % t] = True, False  # at least one key seen and one hidden, whatever the draw
    return [Case((q, k, v), {"mask": causal_mask(t).numpy()}, note="a causal mask"),
            Case((q, k, v), {"mask": random_mask}, note="a random (T, T) mask"),
            Case((q, k, v), {"mask": key_mask}, note="a key mask of shape (T_k,), broadcast over the queries")]


def _sdpa_batched(rng):
    b, h, tq, tk = (int(n) for n in rng.integers(2, 5, size=4))
    return [Case((rng.normal(size=(b, h, tq, 8)), rng.normal(size=(b, h, tk, 8)), rng.normal(size=(b, h, tk, 5))),
                 note="four axes (B, H, T, d)"),
            Case((rng.normal(size=(b, tq, 4)), rng.normal(size=(b, tk, 4)), rng.normal(size=(b, tk, 4))),
                 note="three axes (B, T, d)")]


def _weights(rng, d):
    return tuple(rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(4))


def _mha_one_head(rng):
    d = int(rng.choice([3, 4, 6]))
    return [Case((rng.normal(size=(5, d)), *_weights(rng, d), 1), note="one head, five tokens"),
            Case((rng.normal(size=(1, d)), *_weights(rng, d), 1), note="one head, a sequence of length 1")]


def _mha_heads(rng):
    return [Case((rng.normal(size=(6, 8)), *_weights(rng, 8), 2), note="two heads of width 4"),
            Case((rng.normal(size=(4, 12)), *_weights(rng, 12), 3), note="three heads of width 4")]


def _mha_batch_causal(rng):
    t = int(rng.integers(3, 8))
    return [Case((rng.normal(size=(2, t, 8)), *_weights(rng, 8), 4), {"mask": causal_mask(t).numpy()},
                 note="a batch of two, four heads, a causal mask")]


def _equivariance(rng):
    t = int(rng.integers(4, 8))
    x = rng.normal(size=(t, 4))
    w_q, w_k, w_v, w_o = _weights(rng, 4)
    attention_arrays = {"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o, "n_heads": np.array(2)}
    perm = rng.permutation(t)
    cycle = np.roll(np.arange(t), 1)  # not its own inverse: catches the inverse permutation on one side
    swap = np.array([1, 0, *range(2, t)])
    # cumulative sums with the first two rows swapped: f(x[swap]) - f(x)[swap] = [-x_0, x_1, 0, ...], so the
    # largest absolute difference is negative in one case and positive in the other (catches a missing abs)
    big_first, big_second = np.zeros((t, 4)), np.zeros((t, 4))
    big_first[:2] = [[3.0], [1.0]]
    big_second[:2] = [[1.0], [3.0]]
    return [
        Case((CallableArg("cumsum"), big_first, swap), note="cumulative sum, first two rows swapped"),
        Case((CallableArg("cumsum"), big_second, swap), note="cumulative sum, first two rows swapped, other sign"),
        Case((CallableArg("attention", attention_arrays), x, cycle), note="attention, a cyclic shift"),
        Case((CallableArg("cumsum"), x, cycle), note="cumulative sum, a cyclic shift (not its own inverse)"),
        Case((CallableArg("attention", attention_arrays), x, perm), note="attention, a random permutation"),
        Case((CallableArg("causal_attention", attention_arrays), x, perm),
             note="causal attention, a random permutation"),
        Case((CallableArg("cumsum"), x, perm), note="cumulative sum, a random permutation"),
        Case((CallableArg("scale", {"factor": np.array(rng.uniform(0.5, 3))}), x, perm),
             note="a scaling, a random permutation"),
    ]


SDPA_USES = ("softmax",)  # the notebook asks for these to be reused
MHA_USES = ("scaled_dot_product_attention", "softmax")

CHECKS = {
    "test_softmax_examples": Check("softmax", _softmax_examples, ref_softmax),
    "test_softmax_stability": Check("softmax", _softmax_stability, ref_softmax),
    "test_softmax_axis": Check("softmax", _softmax_axis, ref_softmax),
    "test_causal_mask": Check("causal_mask", _masks, ref_causal_mask),
    "test_sdpa_small": Check("scaled_dot_product_attention", _sdpa_small, ref_sdpa, depends_on=SDPA_USES),
    "test_sdpa_mask": Check("scaled_dot_product_attention", _sdpa_mask, ref_sdpa, depends_on=SDPA_USES),
    "test_sdpa_batched": Check("scaled_dot_product_attention", _sdpa_batched, ref_sdpa, depends_on=SDPA_USES),
    "test_mha_one_head": Check("multi_head_attention", _mha_one_head, ref_mha, depends_on=MHA_USES),
    "test_mha_two_heads": Check("multi_head_attention", _mha_heads, ref_mha, depends_on=MHA_USES),
    "test_mha_batch_causal": Check("multi_head_attention", _mha_batch_causal, ref_mha, depends_on=MHA_USES),
    # rounding differs between implementations, so an error of 1e-16 and one of 1e-15 both mean "equivariant"
    "test_equivariance": Check("equivariance_error", _equivariance, ref_equivariance_error, rtol=1e-6, atol=1e-9),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _rows(case):
    """The softmax input as rows along its axis: (rows, entries)."""
    x = np.asarray(case.args[0])
    return np.moveaxis(x, case.kwargs.get("axis", -1), -1).reshape(-1, x.shape[case.kwargs.get("axis", -1)])


def _equivariance_gap(case):
    """f(x[perm]) - f(x)[perm] for an equivariance case, with the trusted f."""
    f, x, perm = case.args
    f = TRUSTED_CALLABLES[f.name](f.arrays)
    return f(x[perm]) - f(x)[perm]


def _mask(case):
    return case.kwargs.get("mask")


FAILURE_CLASSES = [
    FailureClass("a single entry", "test_softmax_examples", lambda case: case.args[0].size == 1),
    FailureClass("several equal entries", "test_softmax_examples",
                 lambda case: case.args[0].size > 1 and np.all(case.args[0] == case.args[0].flat[0])),
    FailureClass("entries of distinct values", "test_softmax_examples", lambda case: len(np.unique(case.args[0])) > 2),
    FailureClass("scores of +1000 (exp overflows without a shift)", "test_softmax_stability",
                 lambda case: _rows(case).max() >= 700),
    FailureClass("a row whose scores are all below -700 (exp underflows to 0/0 without a shift)",
                 "test_softmax_stability", lambda case: (_rows(case).max(axis=1) <= -700).any()),
    FailureClass("rows whose maxima differ by more than 700 (a shift by the global maximum underflows)",
                 "test_softmax_stability", lambda case: np.ptp(_rows(case).max(axis=1)) > 700),
    FailureClass("a matrix, default axis", "test_softmax_axis",
                 lambda case: case.args[0].ndim == 2 and "axis" not in case.kwargs),
    FailureClass("axis 0 of three axes", "test_softmax_axis",
                 lambda case: case.args[0].ndim == 3 and case.kwargs.get("axis") == 0),
    FailureClass("the middle axis of three", "test_softmax_axis",
                 lambda case: case.args[0].ndim == 3 and case.kwargs.get("axis") == 1),
    FailureClass("a single position", "test_causal_mask", lambda case: case.args[0] == 1),
    FailureClass("several positions (both triangles and the diagonal)", "test_causal_mask",
                 lambda case: case.args[0] >= 3),
    FailureClass("values of another width than the queries (d_v != d)", "test_sdpa_small",
                 lambda case: case.args[2].shape[-1] != case.args[0].shape[-1]),
    FailureClass("a single key", "test_sdpa_small", lambda case: case.args[1].shape[-2] == 1),
    FailureClass("a single query, several keys", "test_sdpa_small",
                 lambda case: case.args[0].shape[-2] == 1 and case.args[1].shape[-2] > 1),
    FailureClass("more queries than keys (T_q != T_k)", "test_sdpa_small",
                 lambda case: case.args[0].shape[-2] > case.args[1].shape[-2]),
    FailureClass("a causal mask", "test_sdpa_mask",
                 lambda case: _mask(case) is not None and _mask(case).ndim == 2
                 and np.array_equal(_mask(case), np.tril(np.ones_like(_mask(case))))),
    FailureClass("a (T, T) mask that is not causal", "test_sdpa_mask",
                 lambda case: _mask(case) is not None and _mask(case).ndim == 2 and np.triu(_mask(case), 1).any()),
    FailureClass("a key mask of shape (T_k,) that hides a key", "test_sdpa_mask",
                 lambda case: _mask(case) is not None and _mask(case).ndim == 1 and not _mask(case).all()),
    FailureClass("four axes (B, H, T, d)", "test_sdpa_batched", lambda case: case.args[0].ndim == 4),
    FailureClass("three axes (B, T, d)", "test_sdpa_batched", lambda case: case.args[0].ndim == 3),
    FailureClass("one head", "test_mha_one_head", lambda case: case.args[5] == 1 and case.args[0].shape[-2] > 1),
    FailureClass("a sequence of length 1", "test_mha_one_head", lambda case: case.args[0].shape[-2] == 1),
    FailureClass("two heads", "test_mha_two_heads", lambda case: case.args[5] == 2),
    FailureClass("three heads (d_head != n_heads)", "test_mha_two_heads",
                 lambda case: case.args[5] == 3 and case.args[0].shape[-1] // 3 != 3),
    FailureClass("a batch of sequences with a causal mask", "test_mha_batch_causal",
                 lambda case: case.args[0].ndim == 3 and _mask(case) is not None),
    FailureClass("a largest difference that is negative (the abs matters)", "test_equivariance",
                 lambda case: _equivariance_gap(case).max() < np.abs(_equivariance_gap(case)).max() - 1e-6),
    FailureClass("a largest difference that is positive (the abs matters, other order)", "test_equivariance",
                 lambda case: (-_equivariance_gap(case)).max() < np.abs(_equivariance_gap(case)).max() - 1e-6),
    FailureClass("a permutation that is not its own inverse, on a function that is not equivariant",
                 "test_equivariance",
                 lambda case: not np.array_equal(case.args[2][case.args[2]], np.arange(len(case.args[2])))
                 and np.abs(_equivariance_gap(case)).max() > 1e-6),
    FailureClass("an equivariant function (error 0 up to rounding)", "test_equivariance",
                 lambda case: np.abs(_equivariance_gap(case)).max() < 1e-9),
    FailureClass("differences of unequal size (max, not mean)", "test_equivariance",
                 lambda case: np.abs(_equivariance_gap(case)).mean() < np.abs(_equivariance_gap(case)).max() - 1e-6),
]
