"""Trusted checks of ps7-modern: fresh inputs for every hidden test cell, llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps7-modern/ps7-modern.ipynb``.
References: ``llmarch.layers.rms_norm``; ``llmarch.layers.SwiGLU`` with the three matrices copied in (``w1`` the
gate, ``w3`` the up projection, ``w2`` the down projection); ``llmarch.positional.apply_rope(..., interleaved=False)``;
grouped-query attention as ``MultiHeadAttention.attend`` computes it (key/value heads repeated with
``repeat_interleave``) with the causal mask aligned at the bottom right (``causal_mask(T, T_k, offset=T_k - T)``);
``llmarch.positional.rope_frequencies`` with ``rope_type="llama3"``; and the rolling cache with attention sinks as
``llmarch.kv_cache.window_sink_mask`` defines it (the cases' caches come from ``llmarch.kv_cache.RollingKVCache``).

Every check states the notebook's float64 contract (``Check.dtype``): a float32 answer fails, with a message that
names its dtype, exactly as the notebook's ``check_close`` fails it, so visible and hidden tests agree.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from autograder.checks import Case, Check, FailureClass
from llmarch.attention import causal_mask, scaled_dot_product_attention
from llmarch.kv_cache import RollingKVCache, window_sink_mask
from llmarch.layers import SwiGLU, rms_norm
from llmarch.positional import apply_rope, rope_frequencies

NOTEBOOK = "ps7-modern.ipynb"
TRUSTED_CALLABLES: dict = {}


def _t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


# --- references ---------------------------------------------------------------------------------------------


def ref_rms_norm(x, weight, eps=1e-6):
    return rms_norm(_t(x), _t(weight), eps=float(eps)).numpy()


def ref_swiglu(x, w_gate, w_up, w_down):
    d_ff, d = w_gate.shape
    ffn = SwiGLU(d, d_ff).to(torch.float64)
    with torch.no_grad():
        ffn.w1.weight.copy_(_t(w_gate))
        ffn.w3.weight.copy_(_t(w_up))
        ffn.w2.weight.copy_(_t(w_down))
        return ffn(_t(x)).numpy()


def ref_rope(x, positions, base=10000.0):
    return apply_rope(_t(x), torch.as_tensor(np.asarray(positions)), base=float(base), interleaved=False).numpy()


def ref_gqa(q, k, v, is_causal=False):
    q, k, v = _t(q), _t(k), _t(v)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    t, t_k = q.shape[-2], k.shape[-2]
    mask = causal_mask(t, t_k, offset=t_k - t) if is_causal else None  # query i at position t_k - t + i
    return scaled_dot_product_attention(q, k, v, mask=mask).numpy()


def ref_llama3(d, base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192):
    scaling = {"rope_type": "llama3", "factor": float(factor), "low_freq_factor": float(low_freq_factor),
               "high_freq_factor": float(high_freq_factor),
               "original_max_position_embeddings": original_max_position_embeddings}
    inv_freq, _ = rope_frequencies(int(d), float(base), scaling)
    return inv_freq.numpy()


def ref_rolling_cache_step(keys, values, positions, q, k_new, v_new, window, sinks=4):
    """Attention of the new queries over the held and new keys under the window-and-sinks mask of their original
    positions, and the keys the newest query may see (the sinks and the last ``window - sinks``): the new cache."""
    positions = torch.as_tensor(np.asarray(positions), dtype=torch.long)
    start = int(positions[-1]) + 1 if len(positions) else 0
    new_positions = torch.arange(start, start + q.shape[-2])
    all_positions = torch.cat([positions, new_positions])
    k, v = torch.cat([_t(keys), _t(k_new)], dim=-2), torch.cat([_t(values), _t(v_new)], dim=-2)
    mask = window_sink_mask(new_positions, all_positions, int(window), int(sinks))
    out = scaled_dot_product_attention(_t(q), k, v, mask=mask)
    keep = mask[-1]
    return out.numpy(), k[:, keep].numpy(), v[:, keep].numpy(), all_positions[keep].numpy()


# --- fresh inputs -------------------------------------------------------------------------------------------

# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _rows_with_rms(rng, shape, low, high):
    """Random rows with a non-zero mean (so centring changes them) and an RMS between ``low`` and ``high``."""
    z = rng.normal(size=shape) + rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5)
    return z / np.sqrt(np.mean(z**2, axis=-1, keepdims=True)) * rng.uniform(low, high, size=shape[:-1] + (1,))


def _rms_norm(rng):
    # RMS between 1 and 4 with eps = 1e-6 or 0: putting eps outside the square root changes the result by at most
    # 5e-7 relative there (it is the small-input cell that tells the two apart)
    d = int(rng.integers(4, 17))
    worked = (np.array([1.0, 2.0, 2.0, 4.0]), np.array([1.0, 1.0, 0.5, 2.0]))
    return [Case(worked, {"eps": 0.0}, note="the worked example"),
            Case((_rows_with_rms(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 5)), d), 1, 4), rng.normal(size=d)),
                 note="rows of RMS 1 to 4, three axes, a random weight"),
            Case((_rows_with_rms(rng, (d,), 1, 4), rng.uniform(0.5, 2, size=d)), {"eps": 0.0}, note="one vector"),
            Case((np.full((2, 5), 3.0), np.ones(5)), note="constant rows: RMS, not standard deviation")]


def _rms_norm_eps(rng):
    d = int(rng.integers(2, 13))
    return [Case((np.zeros((2, 4)), np.ones(4)), note="zero rows: eps keeps the result finite"),
            Case((np.ones(4), np.ones(4)), {"eps": 3.0}, note="eps inside the square root"),
            Case((_rows_with_rms(rng, (3, d), 1e-4, 3e-3), rng.normal(size=d)), note="tiny rows, where eps matters"),
            Case((rng.normal(size=(2, d)), rng.normal(size=d)), {"eps": float(rng.uniform(0.1, 2.0))},
                 note="a large eps")]


def _swiglu_weights(rng, d, d_ff):
    return (rng.normal(size=(d_ff, d)), rng.normal(size=(d_ff, d)) / np.sqrt(d), rng.normal(size=(d, d_ff)) / np.sqrt(d_ff))


def _swiglu(rng):
    worked = (np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
              np.array([[1.0, 1.0], [2.0, 0.0], [0.0, -1.0]]), np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]))
    d, d_ff = int(rng.integers(2, 9)), int(rng.integers(3, 17))
    return [Case(worked, note="the worked example"),
            Case((rng.normal(size=(int(rng.integers(1, 7)), d)), *_swiglu_weights(rng, d, d_ff)), note="(T, d) rows"),
            Case((rng.normal(size=(5, 4)) * 3, *_swiglu_weights(rng, 4, 6)), note="large inputs")]


def _swiglu_batched(rng):
    d, d_ff = int(rng.integers(2, 9)), int(rng.integers(3, 17))
    return [Case((rng.normal(size=(2, int(rng.integers(1, 5)), d)), *_swiglu_weights(rng, d, d_ff)),
                 note="a batch (B, T, d)"),
            Case((rng.normal(size=d), *_swiglu_weights(rng, d, d_ff)), note="one vector (d,)")]


def _unit_vectors(t):
    x = np.zeros((1, 2, t, 4))
    x[0, 0, :, 0] = x[0, 1, :, 1] = 1.0
    return x


def _rope(rng):
    t, d = int(rng.integers(2, 9)), 2 * int(rng.integers(1, 9))
    return [Case((_unit_vectors(101), np.arange(101)), note="the worked example's unit vectors"),
            Case((rng.normal(size=(2, 3, 6, 8)), np.arange(6)), {"base": 100.0}, note="base 100"),
            Case((rng.normal(size=(int(rng.integers(1, 3)), int(rng.integers(1, 4)), t, d)), np.arange(t)),
                 {"base": float(np.exp(rng.uniform(np.log(100), np.log(1e6))))}, note="a random base"),
            Case((rng.normal(size=(t, d)), np.arange(t)), note="x of shape (T, d), no batch or head axes")]


def _rope_offset(rng):
    t, d = int(rng.integers(1, 6)), 2 * int(rng.integers(1, 9))
    past = int(rng.integers(1, 100_000))
    return [Case((rng.normal(size=(1, 2, 3, 8)), np.arange(6, 9)), {"base": 500.0}, note="3 tokens after a cache of 6"),
            Case((_unit_vectors(1), np.array([100])), note="one token at position 100"),
            Case((rng.normal(size=(int(rng.integers(1, 3)), int(rng.integers(1, 4)), t, d)), np.arange(past, past + t)),
                 {"base": float(np.exp(rng.uniform(np.log(100), np.log(1e6))))}, note="a long cache"),
            Case((rng.normal(size=(2, 8)), rng.integers(1, 5000, size=2)), note="two tokens at random positions"),
            Case((rng.normal(size=(1, 2, 4, 8)), np.array([7, 2, 30, 31])), {"base": 500.0},
                 note="positions that are neither consecutive nor sorted")]


def _heads(rng):
    return [(4, 2), (6, 3), (6, 2), (8, 2), (4, 1), (3, 3)][int(rng.integers(0, 6))]


def _gqa_inputs(rng, h, h_kv, t, t_k):
    b, d, d_v = int(rng.integers(1, 3)), int(rng.integers(2, 9)), int(rng.integers(1, 6))
    return rng.normal(size=(b, h, t, d)), rng.normal(size=(b, h_kv, t_k, d)), rng.normal(size=(b, h_kv, t_k, d_v))


def _gqa(rng):
    t = int(rng.integers(2, 8))
    h, h_kv = _heads(rng)
    return [Case(_gqa_inputs(rng, 6, 2, t, t), {"is_causal": True}, note="6 query heads on 2: h // g, not h % H_kv"),
            Case(_gqa_inputs(rng, 4, 1, 3, 6), {"is_causal": False}, note="multi-query attention, not causal"),
            Case(_gqa_inputs(rng, 3, 3, 4, 4), {"is_causal": True}, note="multi-head attention (H_kv = H)"),
            Case(_gqa_inputs(rng, h, h_kv, int(rng.integers(1, 7)), int(rng.integers(1, 9))), {"is_causal": False},
                 note="random heads, not causal"),
            Case(_gqa_inputs(rng, h, h_kv, t, t), {"is_causal": True}, note="random heads, causal")]


def _gqa_cache(rng):
    h, h_kv = _heads(rng)
    t = int(rng.integers(1, 5))
    return [Case(_gqa_inputs(rng, 4, 2, 2, 4), {"is_causal": True}, note="the worked example: 2 new tokens after 2"),
            Case(_gqa_inputs(rng, 6, 3, 1, 5), {"is_causal": True}, note="one new token sees the whole cache"),
            Case(_gqa_inputs(rng, h, h_kv, t, t + int(rng.integers(1, 9))), {"is_causal": True},
                 note="random heads, new tokens after a random cache")]


def _llama3_args(rng, low, high):
    """A random configuration whose three regions (kept, divided, blended) all hold at least one pair."""
    while True:
        d = int(rng.choice([16, 32, 64, 128]))
        base = float(np.exp(rng.uniform(np.log(1e4), np.log(1e6))))
        original = int(round(2 * math.pi * base ** rng.uniform(0.2, 0.8)))
        wavelength = 2 * math.pi * base ** (np.arange(0, d, 2) / d)
        kept, divided = wavelength < original / high, wavelength > original / low
        if kept.any() and divided.any() and not (kept | divided).all():
            return (d, base, float(rng.uniform(2, 32)), low, high, original)


def _llama3(rng):
    return [Case((128, 500000.0, 8.0, 1.0, 4.0, 8192), note="Llama 3.1's configuration"),
            Case(_llama3_args(rng, 1.0, 4.0), note="a random configuration with all three regions"),
            Case(_llama3_args(rng, 1.0, 4.0), note="a random configuration with all three regions")]


def _llama3_factors(rng):
    low = float(rng.uniform(0.5, 3.0))
    return [Case((64, 10000.0, 4.0, 2.0, 8.0, 4096), note="low_freq_factor 2, high_freq_factor 8"),
            Case(_llama3_args(rng, low, low * float(rng.uniform(2, 8))), note="random thresholds")]


def _rolling_case(rng, seen, t, window, sinks, note, default_sinks=False):
    """A cache of ``window`` and ``sinks`` after ``seen`` tokens (fed to ``RollingKVCache`` in random chunks) and
    ``t`` new tokens: ``Case((keys, values, positions, q, k_new, v_new, window), {"sinks": sinks})``."""
    h, d, d_v = int(rng.integers(1, 4)), int(rng.integers(2, 9)), int(rng.integers(1, 6))
    k_all, v_all = rng.normal(size=(1, h, seen + t, d)), rng.normal(size=(1, h, seen + t, d_v))
    cache = RollingKVCache(window, sinks)
    done = 0
    while done < seen:
        step = min(seen - done, int(rng.integers(1, window + 2)))
        cache.update(torch.from_numpy(k_all[:, :, done:done + step]), torch.from_numpy(v_all[:, :, done:done + step]))
        done += step
    held = (cache.k[0].numpy(), cache.v[0].numpy()) if seen else (np.zeros((h, 0, d)), np.zeros((h, 0, d_v)))
    args = (*held, cache.positions.numpy(), rng.normal(size=(h, t, d)), k_all[0, :, seen:], v_all[0, :, seen:], window)
    return Case(args, {} if default_sinks else {"sinks": sinks}, note=note)


def _rolling(rng):
    window = int(rng.integers(3, 9))
    sinks = int(rng.integers(1, window))
    return [_rolling_case(rng, 7, 1, 4, 1, "the worked example: window 4, 1 sink, the 8th token"),
            _rolling_case(rng, 2, 1, 6, 2, "a cache that is not full yet"),
            _rolling_case(rng, 4, 1, 5, 2, "the step that fills the cache exactly"),
            _rolling_case(rng, 41, 1, 8, 4, "a cache wrapped many times, the default 4 sinks", default_sinks=True),
            _rolling_case(rng, 23, 1, 5, 0, "no sinks (Mistral's window)"),
            _rolling_case(rng, 17, 1, 3, 2, "window = sinks + 1: the newest token and the sinks"),
            _rolling_case(rng, int(rng.integers(0, 6 * window)), 1, window, sinks, "a random window and sinks")]


def _rolling_chunks(rng):
    window = int(rng.integers(3, 9))
    sinks = int(rng.integers(0, window))
    return [_rolling_case(rng, 0, 11, 5, 2, "a prompt longer than the window, into an empty cache"),
            _rolling_case(rng, 30, 6, 6, 2, "a chunk longer than window - sinks after a wrapped cache"),
            _rolling_case(rng, 2, 7, 6, 4, "a chunk that completes the sinks and wraps"),
            _rolling_case(rng, 3, 3, 5, 1, "a chunk into a cache that is not full yet"),
            _rolling_case(rng, int(rng.integers(0, 6 * window)), int(rng.integers(2, 2 * window)), window, sinks,
                          "a random chunk, window and sinks")]


ROLLING_RETURNS = ("out", "keys", "values", "positions")

CHECKS = {
    "test_rms_norm": Check("rms_norm", _rms_norm, ref_rms_norm, dtype="float64"),
    "test_rms_norm_eps": Check("rms_norm", _rms_norm_eps, ref_rms_norm, dtype="float64"),
    "test_swiglu": Check("swiglu", _swiglu, ref_swiglu, dtype="float64"),
    "test_swiglu_batched": Check("swiglu", _swiglu_batched, ref_swiglu, dtype="float64"),
    "test_rope": Check("rope_rotate_half", _rope, ref_rope, dtype="float64"),
    "test_rope_offset": Check("rope_rotate_half", _rope_offset, ref_rope, dtype="float64"),
    "test_gqa": Check("grouped_query_attention", _gqa, ref_gqa, dtype="float64"),
    "test_gqa_cache": Check("grouped_query_attention", _gqa_cache, ref_gqa, dtype="float64"),
    "test_llama3": Check("llama3_inv_freq", _llama3, ref_llama3, dtype="float64"),
    "test_llama3_factors": Check("llama3_inv_freq", _llama3_factors, ref_llama3, dtype="float64"),
    "test_rolling_cache": Check("rolling_cache_step", _rolling, ref_rolling_cache_step, dtype="float64",
                                returns=ROLLING_RETURNS),
    "test_rolling_cache_chunks": Check("rolling_cache_step", _rolling_chunks, ref_rolling_cache_step,
                                       dtype="float64", returns=ROLLING_RETURNS),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _rms(case):
    return np.sqrt(np.mean(np.asarray(case.args[0]) ** 2, axis=-1))


def _llama3_regions(case):
    """Whether the configuration has pairs kept, divided by the factor, and blended (all three regions)."""
    d, base, _, low, high, original = case.args
    wavelength = 2 * math.pi * base ** (np.arange(0, d, 2) / d)
    kept, divided = wavelength < original / high, wavelength > original / low
    return bool(kept.any() and divided.any() and not (kept | divided).all())


def _gqa_heads(case):
    """(H, H_kv, T, T_k, is_causal) of a grouped-query case."""
    q, k = case.args[0], case.args[1]
    return q.shape[1], k.shape[1], q.shape[2], k.shape[2], case.kwargs.get("is_causal", False)


def _rolling_shape(case):
    """(tokens seen before the step, new tokens, window, sinks) of a rolling-cache case."""
    positions, q, window = case.args[2], case.args[3], case.args[6]
    return (int(positions[-1]) + 1 if len(positions) else 0), q.shape[-2], window, case.kwargs.get("sinks", 4)


def _wrapped(case):
    """Whether the cache had already evicted keys before the step (it holds fewer keys than tokens seen)."""
    seen = _rolling_shape(case)[0]
    return len(case.args[2]) < seen


FAILURE_CLASSES = [
    FailureClass("rows of non-zero mean and a weight other than ones", "test_rms_norm",
                 lambda case: (np.abs(np.mean(case.args[0], axis=-1)) > 0.1).all() and (case.args[1] != 1).any()),
    FailureClass("constant rows (RMS, not standard deviation)", "test_rms_norm",
                 lambda case: (np.ptp(case.args[0], axis=-1) == 0).all() and (_rms(case) > 0).all()),
    FailureClass("three axes (normalised along the last)", "test_rms_norm", lambda case: np.ndim(case.args[0]) == 3),
    FailureClass("zero rows", "test_rms_norm_eps", lambda case: (_rms(case) == 0).any()),
    FailureClass("an eps of 1 or more (inside the square root)", "test_rms_norm_eps",
                 lambda case: case.kwargs.get("eps", 1e-6) >= 1 and (_rms(case) > 0).all()),
    FailureClass("rows of RMS below 1e-2 with the default eps", "test_rms_norm_eps",
                 lambda case: "eps" not in case.kwargs and (0 < _rms(case)).all() and (_rms(case) < 1e-2).all()),
    FailureClass("two axes (T, d), d_ff != d", "test_swiglu",
                 lambda case: np.ndim(case.args[0]) == 2 and case.args[1].shape[0] != case.args[1].shape[1]),
    FailureClass("gate pre-activations beyond +-3 (SiLU, not GELU or a sigmoid)", "test_swiglu",
                 lambda case: np.abs(case.args[0] @ case.args[1].T).max() > 3),
    FailureClass("a batch (B, T, d)", "test_swiglu_batched", lambda case: np.ndim(case.args[0]) == 3),
    FailureClass("one vector (d,)", "test_swiglu_batched", lambda case: np.ndim(case.args[0]) == 1),
    FailureClass("d of 4 or more (the rotate-half layout), the default base", "test_rope",
                 lambda case: case.args[0].shape[-1] >= 4 and "base" not in case.kwargs),
    FailureClass("a base other than 10000", "test_rope", lambda case: case.kwargs.get("base", 10000.0) != 10000.0),
    FailureClass("x of two axes (T, d)", "test_rope", lambda case: case.args[0].ndim == 2),
    FailureClass("positions that do not start at 0", "test_rope_offset", lambda case: case.args[1][0] != 0),
    FailureClass("positions that are neither consecutive nor sorted", "test_rope_offset",
                 lambda case: (np.diff(case.args[1]) < 0).any()),
    FailureClass("query heads grouped on several key/value heads, causal", "test_gqa",
                 lambda case: _gqa_heads(case)[1] >= 2 and _gqa_heads(case)[0] // _gqa_heads(case)[1] >= 2
                 and _gqa_heads(case)[4] and _gqa_heads(case)[2] > 1),
    FailureClass("not causal, several queries (is_causal=False is honoured)", "test_gqa",
                 lambda case: not _gqa_heads(case)[4] and _gqa_heads(case)[2] > 1),
    FailureClass("as many key/value heads as query heads, causal", "test_gqa",
                 lambda case: _gqa_heads(case)[0] == _gqa_heads(case)[1] and _gqa_heads(case)[4]),
    FailureClass("several new tokens after a cache, causal (the mask's bottom-right alignment)", "test_gqa_cache",
                 lambda case: 1 < _gqa_heads(case)[2] < _gqa_heads(case)[3] and _gqa_heads(case)[4]),
    FailureClass("one new token after a cache, causal", "test_gqa_cache",
                 lambda case: _gqa_heads(case)[2] == 1 < _gqa_heads(case)[3] and _gqa_heads(case)[4]),
    FailureClass("the default factors, all three regions", "test_llama3",
                 lambda case: case.args[3:5] == (1.0, 4.0) and _llama3_regions(case)),
    FailureClass("other factors, all three regions", "test_llama3_factors",
                 lambda case: case.args[3:5] != (1.0, 4.0) and _llama3_regions(case)),
    FailureClass("a cache not full yet after the step", "test_rolling_cache",
                 lambda case: sum(_rolling_shape(case)[:2]) < _rolling_shape(case)[2]),
    FailureClass("the step that fills the cache exactly", "test_rolling_cache",
                 lambda case: sum(_rolling_shape(case)[:2]) == _rolling_shape(case)[2]),
    FailureClass("wrapped many times (4 windows and more), with sinks", "test_rolling_cache",
                 lambda case: _rolling_shape(case)[0] >= 4 * _rolling_shape(case)[2] and _rolling_shape(case)[3] > 0),
    FailureClass("no sinks, wrapped", "test_rolling_cache",
                 lambda case: _rolling_shape(case)[3] == 0 and _wrapped(case)),
    FailureClass("window = sinks + 1, wrapped", "test_rolling_cache",
                 lambda case: _rolling_shape(case)[2] == _rolling_shape(case)[3] + 1 and _wrapped(case)),
    FailureClass("the default sinks (4), wrapped", "test_rolling_cache",
                 lambda case: "sinks" not in case.kwargs and _wrapped(case)),
    FailureClass("a prompt longer than the window into an empty cache", "test_rolling_cache_chunks",
                 lambda case: _rolling_shape(case)[0] == 0 and _rolling_shape(case)[1] > _rolling_shape(case)[2]),
    FailureClass("a chunk longer than window - sinks after a wrapped cache", "test_rolling_cache_chunks",
                 lambda case: _wrapped(case)
                 and _rolling_shape(case)[1] > _rolling_shape(case)[2] - _rolling_shape(case)[3]),
    FailureClass("a chunk that completes the sinks and wraps", "test_rolling_cache_chunks",
                 lambda case: 0 < _rolling_shape(case)[0] < _rolling_shape(case)[3]
                 and sum(_rolling_shape(case)[:2]) > _rolling_shape(case)[2]),
]
