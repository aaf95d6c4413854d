"""One ``attention(..., backend=...)`` entry point over the reference, SDPA, FlashAttention (torch and
Triton) and FlexAttention implementations, and the rule ``backend="auto"`` follows (:func:`select_backend`).
``llmarch.attention.MultiHeadAttention`` calls it for every backend but the reference, so it sits below the
models in the import graph: it imports only :mod:`llmarch.reference_attention` and the kernels.

Book: Efficient attention, "GPU paths".
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from llmarch._checks import check_tensor, shape_str
from llmarch.efficient._validation import _check_bool_mask, _check_qkv
from llmarch.efficient.caches import repeat_kv
from llmarch.efficient.flash import flash_attention
from llmarch.efficient.flex import (
    build_block_mask, causal_mask_mod, dense_bias_score_mod, dense_mask_mod, flex_attention_with,
)
from llmarch.efficient.triton_flash import triton_flash_attention
from llmarch.reference_attention import scaled_dot_product_attention

__all__ = ["BACKENDS", "MODEL_BACKENDS", "choose_backend", "select_backend", "attention"]


BACKENDS = ("reference", "sdpa", "flash", "triton", "flex")
MODEL_BACKENDS = (*BACKENDS, "auto")  # what a model's ``attn_backend`` may name

# What each backend accepts besides q, k, v and a causal mask; the error for anything else names the others.
_TAKES_MASK = {"reference", "sdpa", "flash", "flex"}
_TAKES_BIAS = {"reference", "sdpa", "flex"}
_TAKES_DROPOUT = {"reference", "sdpa"}


def choose_backend(device_type: str, has_mask: bool, dropout_p: float = 0.0, t_q: int = 2) -> str:
    """The rule of ``backend="auto"`` as a pure function of what it looks at.

    Book: Efficient attention, "GPU paths".

    On ``"cuda"``: ``"flex"`` (compiled) for a masked input of several queries, whose fully masked tiles it
    skips; ``"sdpa"`` (torch's FlashAttention-2 / cuDNN kernels) for everything else: no mask, attention dropout
    (``dropout_p > 0``, which flex cannot take) and single-token decoding steps (``t_q == 1``: one row of scores
    has no tiles to skip, and flex would build a block mask for it). Anywhere else: ``"sdpa"``, whose CPU kernel
    is itself a tiled, online-softmax FlashAttention in C++. ``"flash"`` and ``"triton"`` are the teaching
    implementations of the same algorithm and are used only when asked for.
    """
    if device_type == "cuda" and has_mask and dropout_p == 0 and t_q > 1:
        return "flex"
    return "sdpa"


def select_backend(q: torch.Tensor, mask: torch.Tensor | None = None, dropout_p: float = 0.0) -> str:
    """The backend ``attention(..., backend="auto")`` uses for queries ``q (B, H, t_q, d)``: :func:`choose_backend`
    of ``q``'s device, whether there is a ``mask``, ``dropout_p`` and ``t_q``.
    Book: Efficient attention, "GPU paths"."""
    return choose_backend(q.device.type, mask is not None, dropout_p, q.shape[-2])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              is_causal: bool = False, backend: str = "auto", scale: float | None = None, *,
              bias: torch.Tensor | None = None, causal_offset: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
    """``softmax(q k^T * scale + bias + M) v`` through one of :data:`BACKENDS`; every backend gives the same result.

    Book: Efficient attention, "GPU paths".

    Shapes: ``q (B, H, t_q, d)``, ``k, v (B, H_kv, t_k, d)`` (``H`` a multiple of ``H_kv``: grouped-query
    attention) -> ``(B, H, t_q, d)``. ``mask`` is boolean (True = may attend) and broadcasts to
    ``(B, H, t_q, t_k)``; ``is_causal`` keeps key ``j`` for query ``i`` iff ``j <= i + causal_offset`` (top-left
    aligned by default, like torch; ``causal_offset = t_k - t_q`` puts the queries at the end of the keys, as in
    cached decoding) and combines with ``mask``. ``bias`` is an additive float tensor broadcasting to
    ``(B, H, t_q, t_k)`` (ALiBi, T5 buckets); ``dropout_p`` drops attention weights (training).
    Backends: ``"reference"`` (``llmarch.attention.scaled_dot_product_attention``), ``"sdpa"``
    (``torch.nn.functional.scaled_dot_product_attention``, key/value heads shared with ``enable_gqa``; a bias
    joins its float mask in the input's dtype), ``"flash"`` (:func:`flash_attention`; no bias),
    ``"triton"`` (:func:`triton_flash_attention`; no mask, no bias), ``"flex"`` (:func:`flex_attention_with`;
    mask and bias become its ``mask_mod`` and ``score_mod``); ``"auto"`` follows :func:`select_backend`. Only
    the reference and SDPA take dropout. What a backend cannot take raises ``ValueError``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dims=4, floating=True)
    _check_qkv(q, k, v, same_batch=False)
    if k.shape[0] != q.shape[0] or v.shape[:2] != k.shape[:2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"q {shape_str(q.shape)}, k {shape_str(k.shape)} and v {shape_str(v.shape)}: expected "
                         "q (B, H, t_q, d) and k, v (B, H_kv, t_k, d) with H a multiple of H_kv")
    score_shape = (*q.shape[:-1], k.shape[-2])
    if mask is not None:
        _check_bool_mask(mask, score_shape)
    if bias is not None:
        check_tensor("bias", bias, floating=True)
        try:
            ok = torch.broadcast_shapes(bias.shape, score_shape) == score_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"bias has shape {shape_str(bias.shape)} but the attention scores have shape "
                             f"{shape_str(score_shape)}: bias must broadcast to (B, H, t_q, t_k)")
    if backend == "auto":
        backend = select_backend(q, mask, dropout_p)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    for what, given, able in (("a mask", mask is not None, _TAKES_MASK), ("a bias", bias is not None, _TAKES_BIAS),
                              ("attention dropout", dropout_p > 0, _TAKES_DROPOUT)):
        if given and backend not in able:
            raise ValueError(f"backend {backend!r} cannot take {what}: use one of {sorted(able)}")
    n_rep = q.shape[1] // k.shape[1]
    if backend == "sdpa":
        return _sdpa(q, k, v, mask, bias, is_causal, causal_offset, scale, dropout_p, n_rep)
    if backend == "flex":
        block_mask = _flex_block_mask(mask, score_shape, is_causal, causal_offset, q.device)
        score_mod = None if bias is None else dense_bias_score_mod(bias.expand(score_shape))
        return flex_attention_with(q, k, v, block_mask=block_mask, score_mod=score_mod, scale=scale)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    if backend == "reference":
        full = _with_causal(mask, score_shape, is_causal, causal_offset, q.device)
        if dropout_p == 0:
            return scaled_dot_product_attention(q, k, v, mask=full, bias=bias, scale=scale)
        _, weights = scaled_dot_product_attention(q, k, v, mask=full, bias=bias, scale=scale, return_weights=True)
        return F.dropout(weights, dropout_p) @ v
    if backend == "flash":
        return flash_attention(q, k, v, is_causal=is_causal, scale=scale, mask=mask, causal_offset=causal_offset)
    return triton_flash_attention(q, k, v, is_causal=is_causal, scale=scale, causal_offset=causal_offset)


def _sdpa(q, k, v, mask, bias, is_causal, causal_offset, scale, dropout_p, n_rep):
    """torch's SDPA. Its own ``is_causal`` is top-left, so it is used for ``causal_offset == 0`` and no mask; a
    causal mask that hides nothing (``causal_offset >= t_k - 1``: one query after the cache) is dropped."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    if is_causal and causal_offset >= t_k - 1:
        is_causal = False
    kwargs = dict(scale=scale, dropout_p=dropout_p, enable_gqa=n_rep > 1)
    if mask is None and bias is None and (not is_causal or causal_offset == 0):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, **kwargs)
    allowed = _with_causal(mask, (*q.shape[:-1], t_k), is_causal, causal_offset, q.device)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, **kwargs)
    additive = bias.to(q.dtype)
    if allowed is not None:
        additive = additive.masked_fill(~allowed, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=additive, **kwargs)


def _with_causal(mask, score_shape, is_causal, causal_offset, device):
    """``mask & (j <= i + causal_offset)``, or either alone, or None."""
    if not is_causal:
        return mask
    i = torch.arange(score_shape[-2], device=device)[:, None]
    tri = torch.arange(score_shape[-1], device=device)[None, :] <= i + causal_offset
    return tri if mask is None else mask & tri


_LAST_BLOCK_MASK: list = []  # [(weak reference to the mask's base tensor or None, key, block mask)]


def _flex_block_mask(mask, score_shape, is_causal, causal_offset, device):
    """Flex's block mask of ``mask`` combined with the causal rule (``None`` when there is neither), built once
    for all the layers of a forward pass: a model builds its mask once and hands the same tensor to every layer,
    so the block mask of the last mask seen is kept and reused while that tensor (the same base, view and
    version, so the same values) comes back with the same shapes."""
    if mask is None and not is_causal:
        return None
    base = None if mask is None else (mask if mask._base is None else mask._base)
    key = (tuple(score_shape), is_causal, causal_offset, str(device)) + (
        () if mask is None else (tuple(mask.shape), mask.stride(), mask.storage_offset(), mask._version))
    if _LAST_BLOCK_MASK:
        ref, last_key, block_mask = _LAST_BLOCK_MASK[0]
        if last_key == key and (ref is None if base is None else ref is not None and ref() is base):
            return block_mask
    if mask is None:
        mask_mod = causal_mask_mod(causal_offset)
    else:
        mask_mod = dense_mask_mod(_with_causal(mask, score_shape, is_causal, causal_offset, device).expand(score_shape))
    block_mask = build_block_mask(mask_mod, *score_shape, device=device)
    _LAST_BLOCK_MASK[:] = [(None if base is None else weakref.ref(base), key, block_mask)]
    return block_mask
