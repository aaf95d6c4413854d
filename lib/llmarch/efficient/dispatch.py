"""One ``attention(..., backend=...)`` entry point over the reference, SDPA, FlashAttention (torch and
Triton) and FlexAttention implementations, and the rule ``backend="auto"`` follows (:func:`select_backend`).

Book: Efficient attention, "GPU paths".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmarch._checks import check_tensor, shape_str
from llmarch.attention import scaled_dot_product_attention
from llmarch.efficient._validation import _check_bool_mask, _check_qkv
from llmarch.efficient.caches import repeat_kv
from llmarch.efficient.flash import flash_attention
from llmarch.efficient.flex import dense_mask_mod, flex_attention_with
from llmarch.efficient.triton_flash import triton_flash_attention

__all__ = ["BACKENDS", "select_backend", "attention"]


BACKENDS = ("reference", "sdpa", "flash", "triton", "flex")


def select_backend(q: torch.Tensor, mask: torch.Tensor | None = None) -> str:
    """The backend ``attention(..., backend="auto")`` uses.

    Book: Efficient attention, "GPU paths".

    On a CUDA tensor: ``"flex"`` (compiled) when there is a mask, whose fully masked tiles it skips, and
    ``"sdpa"`` otherwise (torch's FlashAttention-2 / cuDNN kernels). Anywhere else: ``"sdpa"``, whose CPU kernel
    is itself a tiled, online-softmax FlashAttention in C++. ``"flash"`` and ``"triton"`` are the teaching
    implementations of the same algorithm and are used only when asked for.
    """
    if q.is_cuda:
        return "flex" if mask is not None else "sdpa"
    return "sdpa"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              is_causal: bool = False, backend: str = "auto", scale: float | None = None) -> torch.Tensor:
    """``softmax(q k^T * scale + M) v`` through one of :data:`BACKENDS`; every backend gives the same result.

    Book: Efficient attention, "GPU paths".

    Shapes: ``q (B, H, t_q, d)``, ``k, v (B, H_kv, t_k, d)`` (``H`` a multiple of ``H_kv``: grouped-query
    attention) -> ``(B, H, t_q, d)``. ``mask`` is boolean (True = may attend) and broadcasts to
    ``(B, H, t_q, t_k)``; ``is_causal`` is top-left aligned (``j <= i``, like torch) and combines with ``mask``.
    Backends: ``"reference"`` (``llmarch.attention.scaled_dot_product_attention``), ``"sdpa"``
    (``torch.nn.functional.scaled_dot_product_attention``), ``"flash"`` (:func:`flash_attention`), ``"triton"``
    (:func:`triton_flash_attention`; no mask), ``"flex"`` (:func:`flex_attention_with`); ``"auto"`` follows
    :func:`select_backend`.
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
    if backend == "auto":
        backend = select_backend(q, mask)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    n_rep = q.shape[1] // k.shape[1]
    if backend == "sdpa":
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=n_rep > 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_with_causal(mask, score_shape, is_causal, q.device),
                                              scale=scale, enable_gqa=n_rep > 1)
    if backend == "flex":
        full = _with_causal(mask, score_shape, is_causal, q.device)
        mask_mod = None if full is None else dense_mask_mod(full.expand(score_shape))
        return flex_attention_with(q, k, v, mask_mod=mask_mod, scale=scale)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    if backend == "reference":
        return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    if backend == "flash":
        return flash_attention(q, k, v, is_causal=is_causal, scale=scale, mask=mask)
    if mask is not None:
        raise ValueError("backend 'triton' takes no mask (only is_causal); use 'flash', 'flex' or 'sdpa'")
    return triton_flash_attention(q, k, v, is_causal=is_causal, scale=scale)


def _with_causal(mask, score_shape, is_causal, device):
    """``mask & causal_mask`` (top-left), or either alone, or None."""
    if not is_causal:
        return mask
    i = torch.arange(score_shape[-2], device=device)[:, None]
    tri = torch.arange(score_shape[-1], device=device)[None, :] <= i
    return tri if mask is None else mask & tri
