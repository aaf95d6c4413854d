"""The reference attention functions: softmax, attention masks and scaled dot-product attention.

Book: Attention (``book/attention.md``).

They sit at the bottom of the attention import graph: :mod:`llmarch.efficient` (the kernels and the backend
switch) and :mod:`llmarch.attention` (``MultiHeadAttention``, which re-exports them) both build on them.
Conventions (DESIGN.md): per-head tensors are ``(B, H, T, d_head)``; a boolean mask holds **True where a query
may attend to a key**; an additive mask holds 0 and -inf. Half-precision inputs are computed in float32 (scores,
softmax, the weighted sum) and the result is cast back, as transformers and torch's SDPA do.
"""

from __future__ import annotations

import math

import torch

from llmarch._checks import check_qkv, check_tensor, shape_str

__all__ = ["softmax", "causal_mask", "to_additive_mask", "scaled_dot_product_attention"]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax along ``dim``.

    Book: Attention, "Softmax".

    ``softmax(x)_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)``; subtracting the maximum changes
    nothing mathematically (numerator and denominator share the factor ``exp(-max)``) but keeps every
    exponent <= 0, so ``softmax([1000., 0.])`` is ``[1., 0.]`` instead of ``nan``.
    A slice that is entirely -inf (nothing to attend to) gives all zeros rather than ``nan``.

    >>> softmax(torch.tensor([2.0, 2.0, 2.0]))
    tensor([0.3333, 0.3333, 0.3333])
    """
    check_tensor("x", x, floating=True)
    row_max = x.amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exps = torch.exp(x - row_max)
    total = exps.sum(dim=dim, keepdim=True)
    return exps / torch.where(total > 0, total, torch.ones_like(total))


def causal_mask(t_q: int, t_k: int | None = None, offset: int = 0, device=None) -> torch.Tensor:
    """Boolean causal mask of shape ``(t_q, t_k)``: ``mask[i, j] = j <= i + offset`` (True = may attend).

    Book: Attention, "Masked attention".

    With ``offset=0`` this is the lower-triangular mask that ``is_causal=True`` means in
    ``torch.nn.functional.scaled_dot_product_attention`` (top-left aligned). When ``t_q`` new queries
    follow ``t_k - t_q`` cached keys, pass ``offset = t_k - t_q`` so query ``i`` sits at absolute
    position ``i + offset``.

    >>> causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    t_k = t_q if t_k is None else t_k
    if t_q < 0 or t_k < 0:
        raise ValueError(f"causal_mask needs non-negative lengths, got t_q={t_q}, t_k={t_k}")
    i = torch.arange(t_q, device=device).unsqueeze(1)
    j = torch.arange(t_k, device=device).unsqueeze(0)
    return j <= i + offset


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Turn a boolean mask (True = may attend) into the additive mask ``M`` with 0 and -inf.

    Book: Attention, "Masked attention": ``M_ij = 0`` if query ``i`` may see key ``j``, else ``-inf``;
    ``M`` is added to the scores before the softmax. A floating mask is returned unchanged (cast to
    ``dtype``).
    """
    check_tensor("mask", mask)
    if mask.dtype == torch.bool:
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return additive.masked_fill(~mask, float("-inf"))
    if not mask.is_floating_point():
        raise ValueError(f"mask must be bool (True = may attend) or floating (additive), got dtype {mask.dtype}")
    return mask.to(dtype)


def _broadcast_or_raise(name: str, t: torch.Tensor, target: tuple[int, ...]) -> None:
    try:
        shape = torch.broadcast_shapes(t.shape, target)
    except RuntimeError:
        shape = None
    if shape != tuple(target):
        raise ValueError(
            f"{name} has shape {shape_str(t.shape)} but the attention scores have shape {shape_str(target)}: "
            f"{name} must broadcast to (..., t_q, t_k)"
        )


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
):
    """``softmax(q k^T * scale + bias + M) v``, with ``scale = 1 / sqrt(d_k)`` by default.

    Book: Attention, "Scaled dot-product attention" (Vaswani et al., 2017, eq. 1).

    Shapes: ``q (..., t_q, d_k)``, ``k (..., t_k, d_k)``, ``v (..., t_k, d_v)`` -> ``(..., t_q, d_v)``;
    leading dimensions broadcast. ``mask`` is boolean (True = may attend) or additive (0 / -inf) and
    broadcasts to ``(..., t_q, t_k)``; ``bias`` is an additive float tensor of the same broadcast shape
    (ALiBi, T5 buckets). ``is_causal`` applies ``causal_mask(t_q, t_k)`` on top of ``mask``.
    A query whose keys are all masked gets an output of zeros (as torch's SDPA does). Float16 and bfloat16
    inputs are computed in float32 and the output (and weights) cast back to ``q``'s dtype.
    With ``return_weights=True`` also returns the attention weights ``(..., t_q, t_k)``.
    """
    check_qkv(q, k, v)
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"q {shape_str(q.shape)}, k {shape_str(k.shape)} and v {shape_str(v.shape)} have batch "
            "dimensions that do not broadcast"
        ) from None
    score_shape = (*batch, q.shape[-2], k.shape[-2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    compute = torch.promote_types(q.dtype, torch.float32)  # half inputs: everything below in float32

    scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * scale
    if bias is not None:
        check_tensor("bias", bias, floating=True)
        _broadcast_or_raise("bias", bias, score_shape)
        scores = scores + bias.to(compute)
    allowed = None
    if mask is not None:
        check_tensor("mask", mask)
        _broadcast_or_raise("mask", mask, score_shape)
        if mask.dtype == torch.bool:
            allowed = mask
        else:
            scores = scores + to_additive_mask(mask, scores.dtype)
    if is_causal:
        tri = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        allowed = tri if allowed is None else allowed & tri
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = softmax(scores, dim=-1)
    out = torch.matmul(weights, v.to(compute)).to(q.dtype)
    return (out, weights.to(q.dtype)) if return_weights else out
