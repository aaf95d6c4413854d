"""Softmax, attention masks, scaled dot-product attention and multi-head attention.

Book: Attention (``book/attention.md``).

Conventions (DESIGN.md): tensors are laid out ``(batch..., seq, features)``; per-head tensors are
``(B, H, T, d_head)``; a boolean mask holds **True where a query may attend to a key** (the convention
of ``torch.nn.functional.scaled_dot_product_attention``); an additive mask holds 0 and -inf.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmarch._checks import check_qkv, check_tensor, shape_str
from llmarch.positional import POS_ENCODINGS, KerpleBias, RotaryEmbedding, T5RelativeBias, alibi_bias

__all__ = [
    "softmax",
    "causal_mask",
    "to_additive_mask",
    "scaled_dot_product_attention",
    "MultiHeadAttention",
    "multi_head_attention_additive",
]


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
    A query whose keys are all masked gets an output of zeros (as torch's SDPA does).
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

    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        check_tensor("bias", bias, floating=True)
        _broadcast_or_raise("bias", bias, score_shape)
        scores = scores + bias
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
    out = torch.matmul(weights, v)
    return (out, weights) if return_weights else out


class MultiHeadAttention(nn.Module):
    """Multi-head attention in the "concatenate, then project" form of Vaswani et al. (2017).

    Book: Attention, "Multi-head attention".

    ``head_h = Attention(x W_Q^h, c W_K^h, c W_V^h)``, ``MHA(x, c) = concat(head_1..head_H) W_O``, where
    ``c = x`` for self-attention and ``c = context`` for cross-attention. With ``n_kv_heads < n_heads``
    (grouped-query attention; ``n_kv_heads=1`` is multi-query attention) each key/value head is shared by
    ``n_heads / n_kv_heads`` consecutive query heads.

    Submodules (``nn.Linear``): ``q_proj (d_model -> n_heads*d_head)``, ``k_proj`` and ``v_proj``
    (``d_context -> n_kv_heads*d_head``), ``o_proj (n_heads*d_head -> d_model)``.

    ``pos_encoding`` (one of ``llmarch.positional.POS_ENCODINGS``) acts inside self-attention only for the
    relative schemes: ``rope`` rotates q and k (never v), ``alibi``, ``t5`` and ``kerple`` add a bias to the
    scores (``t5`` and ``kerple`` with their own learned parameters, ``relative_bias``; ``kerple_variant`` is
    ``log`` or ``power``). ``none``, ``learned`` and ``sinusoidal`` change
    nothing here: absolute encodings are added to the input embeddings (see ``llmarch.model.GPT``).
    RoPE is ``rotary`` (a ``llmarch.positional.RotaryEmbedding``: layout, partial rotation, scaling); by
    default the full, interleaved, unscaled rotation with base ``rope_base``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        d_head: int | None = None,
        d_context: int | None = None,
        dropout: float = 0.0,
        pos_encoding: str = "none",
        rope_base: float = 10000.0,
        t5_num_buckets: int = 32,
        t5_max_distance: int = 128,
        rotary: RotaryEmbedding | None = None,
        kerple_variant: str = "log",
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
    ):
        super().__init__()
        if pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"pos_encoding must be one of {POS_ENCODINGS}, got {pos_encoding!r}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a positive multiple of n_kv_heads={n_kv_heads}")
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head")
            d_head = d_model // n_heads
        d_context = d_model if d_context is None else d_context
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, n_kv_heads, d_head
        self.d_context = d_context
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.k_proj = nn.Linear(d_context, n_kv_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(d_context, n_kv_heads * d_head, bias=bias)
        self.o_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.pos_encoding, self.rope_base = pos_encoding, rope_base
        self.rotary = None
        if pos_encoding == "rope":
            self.rotary = RotaryEmbedding(d_head, base=rope_base) if rotary is None else rotary
            if self.rotary.d_head != d_head:
                raise ValueError(f"rotary is built for d_head={self.rotary.d_head} but the heads have d_head={d_head}")
        self.relative_bias = None
        if pos_encoding == "t5":
            self.relative_bias = T5RelativeBias(n_heads, t5_num_buckets, t5_max_distance)
        elif pos_encoding == "kerple":
            self.relative_bias = KerpleBias(n_heads, kerple_variant)
        # QK-norm (Dehghani et al., 2023; Gemma 3, Qwen3): RMSNorm of each head's query and key, before RoPE,
        # which bounds the attention logits by |g_q| |g_k| sqrt(d_head) whatever the weights grow to.
        self.q_norm = nn.RMSNorm(d_head, eps=qk_norm_eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(d_head, eps=qk_norm_eps) if qk_norm else None

    def split_heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        """``(B, T, n_heads * d_head) -> (B, n_heads, T, d_head)``."""
        b, t, _ = x.shape
        return x.view(b, t, n_heads, self.d_head).transpose(1, 2)

    def project_qkv(self, x: torch.Tensor, context: torch.Tensor | None = None):
        """Per-head queries ``(B, H, T_q, d_head)`` and keys/values ``(B, H_kv, T_k, d_head)``."""
        check_tensor("x", x, dims=3, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {shape_str(x.shape)} but d_model is {self.d_model}: expected (B, T, {self.d_model})")
        context = x if context is None else context
        check_tensor("context", context, dims=3, floating=True)
        if context.shape[-1] != self.d_context or context.shape[0] != x.shape[0]:
            raise ValueError(
                f"context has shape {shape_str(context.shape)} but x has shape {shape_str(x.shape)}: "
                f"expected ({x.shape[0]}, T_context, {self.d_context})"
            )
        q = self.split_heads(self.q_proj(x), self.n_heads)
        k = self.split_heads(self.k_proj(context), self.n_kv_heads)
        v = self.split_heads(self.v_proj(context), self.n_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def rotate_qk(self, q, k, positions=None, past: int = 0):
        """RoPE (when ``pos_encoding == "rope"``) on per-head q, k ``(B, H, T_new, d_head)`` of the new tokens, at
        ``positions``: ``(T_new,)`` for every row, or ``(B, T_new)`` per row (default ``past .. past + T_new - 1``);
        other encodings return q, k unchanged."""
        if self.pos_encoding != "rope":
            return q, k
        if positions is None:
            positions = torch.arange(past, past + q.shape[-2], device=q.device)
        batch, t_new = q.shape[0], q.shape[-2]
        if tuple(positions.shape) not in ((t_new,), (batch, t_new)):
            raise ValueError(f"positions has shape {shape_str(positions.shape)}: expected ({t_new},) for every row "
                             f"or ({batch}, {t_new}) for each row of the batch")
        if positions.dim() == 2:
            positions = positions[:, None, :]  # (B, 1, T): the same positions for every head of a row
        return self.rotary(q, positions), self.rotary(k, positions)

    def position_bias(self, t_q: int, t_k: int, bias=None, like: torch.Tensor | None = None):
        """Add ALiBi's, T5's or KERPLE's bias ``(H, t_q, t_k)`` to ``bias``; queries are the last ``t_q`` of
        the ``t_k`` positions. Other encodings return ``bias`` unchanged."""
        if self.pos_encoding not in ("alibi", "t5", "kerple"):
            return bias
        extra = alibi_bias(self.n_heads, t_q, t_k) if self.pos_encoding == "alibi" else self.relative_bias(t_q, t_k)
        if like is not None:
            extra = extra.to(device=like.device, dtype=like.dtype)
        return extra if bias is None else bias + extra

    def attend(self, q, k, v, mask=None, bias=None, is_causal=False, return_weights=False):
        """Attention of per-head q ``(B, H, T_q, d)`` over k, v ``(B, H_kv, T_k, d)``; key/value heads
        are repeated for grouped-query attention. Returns ``(B, H, T_q, d)`` (and weights)."""
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if mask is not None and mask.dim() == 3:  # (B, T_q, T_k): the same mask for every head
            mask = mask.unsqueeze(1)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask=mask, bias=bias, is_causal=is_causal, return_weights=True
        )
        if self.training and self.dropout.p > 0:
            weights = self.dropout(weights)
            out = torch.matmul(weights, v)
        return out, weights

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
        kv_cache: "LayerKVCache | None" = None,
    ):
        """``x (B, T_q, d_model)``, optional ``context (B, T_k, d_context)`` -> ``(B, T_q, d_model)``.

        ``mask`` broadcasts to ``(B, H, T_q, T_k)``; a 3-d mask ``(B, T_q, T_k)`` applies to every head.
        ``bias`` is added to the scores (shape broadcastable to ``(B, H, T_q, T_k)``).
        ``positions`` (long ``(T_q,)``, or ``(B, T_q)`` per row) are the positions RoPE uses for the new tokens.
        ``kv_cache`` (a ``llmarch.kv_cache.LayerKVCache``): the keys and values of earlier tokens are
        reused and these tokens' are appended; the new queries are the last positions, so ``is_causal``
        lets them see every cached key. ``return_weights=True`` also returns the weights ``(B, H, T_q, T_k)``.
        """
        q, k, v = self.project_qkv(x, context)
        if context is None:
            q, k = self.rotate_qk(q, k, positions, past=0 if kv_cache is None else kv_cache.length)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        t_q, t_k = q.shape[-2], k.shape[-2]
        if context is None:
            bias = self.position_bias(t_q, t_k, bias, like=q)
        if is_causal and t_q != t_k:  # queries at the end: query i is position t_k - t_q + i
            tri = causal_mask(t_q, t_k, offset=t_k - t_q, device=q.device)
            mask, is_causal = (tri if mask is None else mask & tri), False
        heads, weights = self.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
        b, _, t, _ = heads.shape
        out = self.o_proj(heads.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head))
        return (out, weights) if return_weights else out


def multi_head_attention_additive(
    mha: MultiHeadAttention,
    x: torch.Tensor,
    context: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """The "additive view" of multi-head attention: ``a_t = sum_h W_O^h head_h(t) + b_O``.

    Book: Attention, "Two views of multi-head attention" (the material's eq. (4), after Elhage et al., 2021).

    ``W_O^h`` is the block of columns ``h*d_head:(h+1)*d_head`` of ``o_proj.weight``; since
    ``concat(head_1..head_H) W_O = sum_h head_h W_O^h``, this equals ``mha(x, context, mask, is_causal)``.
    Returns ``(B, T_q, d_model)``.
    """
    q, k, v = mha.project_qkv(x, context)
    bias = None
    if context is None:
        q, k = mha.rotate_qk(q, k)
        bias = mha.position_bias(q.shape[-2], k.shape[-2], like=q)
    heads, _ = mha.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
    out = 0
    for h in range(mha.n_heads):
        w_o_h = mha.o_proj.weight[:, h * mha.d_head : (h + 1) * mha.d_head]  # (d_model, d_head)
        out = out + heads[:, h] @ w_o_h.T
    if mha.o_proj.bias is not None:
        out = out + mha.o_proj.bias
    return out
