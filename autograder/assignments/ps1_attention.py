"""Trusted checks of ps1-attention: fresh inputs for every hidden test cell, and llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps1-attention/ps1-attention.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import CallableArg, Case, Check
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
    return [Case((np.array([1.0, 0.0, 0.0]),)), Case((np.array([float(rng.uniform(-5, 5))]),)),  # one entry: [1]
            Case((np.full(int(rng.integers(2, 6)), a),)), Case((np.array([c, 0.0, 0.0]),)),
            Case((rng.normal(size=int(rng.integers(3, 9))),))]


def _softmax_stability(rng):
    x = rng.normal(size=7) * 3
    rows = rng.normal(size=(3, 5)) + np.array([[1000.0], [0.0], [-1000.0]])  # a shift by the global maximum underflows
    return [Case((np.array([1000.0, 0.0, -1000.0]),)),
            Case((np.array([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1003.0]]),)),
            Case((x + 1000.0,)), Case((x - 1000.0,)), Case((rows,)),
            Case((np.array([800.0, -800.0, 0.0, float(rng.uniform(700, 900))]),))]


def _softmax_axis(rng):
    x = rng.normal(size=(3, 4, 5))
    return [Case((rng.normal(size=(4, 6)),)), Case((x,), {"axis": 0}), Case((x,), {"axis": 1}), Case((x,), {"axis": -1})]


def _masks(rng):
    return [Case((int(t),)) for t in (1, *rng.integers(2, 12, size=3))]


def _sdpa_small(rng):
    d, n = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    return [Case((np.array([[1.0, 0.0]]), np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]))),
            Case((rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 1)))),  # d != d_v
            Case((rng.normal(size=(3, d)), rng.normal(size=(1, d)), rng.normal(size=(1, 2)))),  # a single key
            Case((rng.normal(size=(1, d)), rng.normal(size=(n, d)), rng.normal(size=(n, int(rng.integers(1, 4)))))),
            Case((rng.normal(size=(3, d)), rng.normal(size=(n, d)), rng.normal(size=(n, 2))))]


def _sdpa_mask(rng):
    t = int(rng.integers(3, 8))
    random_mask = rng.random((t, t)) < 0.6
    random_mask[:, 0] = True  # every query sees at least one key
    q, k, v = rng.normal(size=(t, 4)), rng.normal(size=(t, 4)), rng.normal(size=(t, 3))
    key_mask = rng.random(t) < 0.6
    key_mask[int(rng.integers(t))] = True
    return [Case((q, k, v), {"mask": causal_mask(t).numpy()}), Case((q, k, v), {"mask": random_mask}),
            Case((q, k, v), {"mask": key_mask})]  # shape (T_k,): broadcast over the queries


def _sdpa_batched(rng):
    b, h, tq, tk = (int(n) for n in rng.integers(2, 5, size=4))
    return [Case((rng.normal(size=(b, h, tq, 8)), rng.normal(size=(b, h, tk, 8)), rng.normal(size=(b, h, tk, 5)))),
            Case((rng.normal(size=(b, tq, 4)), rng.normal(size=(b, tk, 4)), rng.normal(size=(b, tk, 4))))]


def _weights(rng, d):
    return tuple(rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(4))


def _mha_one_head(rng):
    d = int(rng.choice([3, 4, 6]))
    return [Case((rng.normal(size=(5, d)), *_weights(rng, d), 1)),
            Case((rng.normal(size=(1, d)), *_weights(rng, d), 1))]  # a sequence of length 1


def _mha_heads(rng):
    return [Case((rng.normal(size=(6, 8)), *_weights(rng, 8), 2)), Case((rng.normal(size=(4, 12)), *_weights(rng, 12), 3))]


def _mha_batch_causal(rng):
    t = int(rng.integers(3, 8))
    return [Case((rng.normal(size=(2, t, 8)), *_weights(rng, 8), 4), {"mask": causal_mask(t).numpy()})]


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
        Case((CallableArg("cumsum"), big_first, swap)),
        Case((CallableArg("cumsum"), big_second, swap)),
        Case((CallableArg("attention", attention_arrays), x, cycle)),
        Case((CallableArg("cumsum"), x, cycle)),
        Case((CallableArg("attention", attention_arrays), x, perm)),
        Case((CallableArg("causal_attention", attention_arrays), x, perm)),
        Case((CallableArg("cumsum"), x, perm)),
        Case((CallableArg("scale", {"factor": np.array(rng.uniform(0.5, 3))}), x, perm)),
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
