"""FlashAttention in pure torch: tiles, the online softmax and a custom autograd backward that recomputes
the tiles from the row logsumexp; and the activation memory of standard attention that motivates it.

Book: Efficient attention, "FlashAttention".
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from llmarch.efficient._validation import _check_bool_mask, _check_int, _check_qkv

__all__ = ["attention_memory_bytes", "flash_attention"]


def attention_memory_bytes(batch: int, seq_len: int, d_model: int, n_heads: int, bytes_per_elem: int = 2) -> int:
    """Activation memory of one standard attention layer, the material's formula:
    ``bytes_per_elem * (3 * B * T * d_model + 2 * B * n_heads * T^2)``.

    Book: Efficient attention, "FlashAttention".

    ``3 B T d_model`` holds ``Q, K, V`` (``n_heads`` heads of ``T x d_head``, ``d_head = d_model / n_heads``);
    ``B n_heads T^2`` the scores ``Z = Q K^T`` and as much again the weights ``A = softmax(Z)``. The ``T^2`` terms
    dominate once ``T > 1.5 d_model / n_heads``; FlashAttention never stores them (it keeps ``B n_heads T``
    logsumexps instead). Like the material, this leaves out the input, the output ``A V`` and the
    projection weights.
    """
    for name, value in (("batch", batch), ("d_model", d_model), ("n_heads", n_heads),
                        ("bytes_per_elem", bytes_per_elem)):
        _check_int(name, value)
    _check_int("seq_len", seq_len, minimum=0)
    return bytes_per_elem * (3 * batch * seq_len * d_model + 2 * batch * n_heads * seq_len**2)


def _online_softmax_step(m, l, acc, s, v):
    """Merge a tile of scores ``s (..., rows, cols)`` and values ``v (..., cols, d_v)`` into the running row
    maximum ``m``, normaliser ``l = sum exp(s - m)`` and unnormalised output ``acc``; -inf scores are masked."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # a row with nothing seen so far
    p = torch.exp(s - m_safe[..., None])
    alpha = torch.exp(m - m_safe)  # rescales what was accumulated against the old maximum; 0 when m = -inf
    return m_new, alpha * l + p.sum(dim=-1), alpha[..., None] * acc + p @ v


def _finish(l, acc):
    """``acc / l`` with 0 for rows that saw no key."""
    return acc / torch.where(l > 0, l, torch.ones_like(l))[..., None]


def _tiles(t_q, t_k, block_q, block_k, mask, causal_offset, device, key_major=False):
    """The tiles ``(qs, qe, ks, ke, allowed)`` with at least one visible score. ``allowed`` is a boolean tile
    (broadcasting to ``(..., qe-qs, ke-ks)``), or None when every score of the tile is visible. Tiles above the
    causal diagonal and tiles the mask hides entirely are skipped: that is block-sparse attention."""
    q_starts, k_starts = range(0, t_q, block_q), range(0, t_k, block_k)
    if key_major:
        pairs = [(qs, ks) for ks in k_starts for qs in q_starts]
    else:
        pairs = [(qs, ks) for qs in q_starts for ks in k_starts]
    for qs, ks in pairs:
        qe, ke = min(qs + block_q, t_q), min(ks + block_k, t_k)
        allowed = None
        if causal_offset is not None:
            if ks > qe - 1 + causal_offset:  # the tile lies entirely above the diagonal
                continue
            if ke - 1 > qs + causal_offset:  # the tile crosses the diagonal
                i = torch.arange(qs, qe, device=device)[:, None]
                j = torch.arange(ks, ke, device=device)[None, :]
                allowed = j <= i + causal_offset
        if mask is not None:
            tile = mask[..., qs:qe, ks:ke]
            if not tile.any():
                continue
            allowed = tile if allowed is None else tile & allowed
        yield qs, qe, ks, ke, allowed


def _flash_forward(q, k, v, scale, mask, causal_offset, block_q, block_k):
    cd = torch.promote_types(q.dtype, torch.float32)  # half inputs: statistics and sums in float32
    t_q, t_k = q.shape[-2], k.shape[-2]
    m = torch.full(q.shape[:-1], float("-inf"), dtype=cd, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=cd, device=q.device)
    for qs, qe, ks, ke, allowed in _tiles(t_q, t_k, block_q, block_k, mask, causal_offset, q.device):
        s = (q[..., qs:qe, :].to(cd) @ k[..., ks:ke, :].to(cd).transpose(-2, -1)) * scale
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        m[..., qs:qe], l[..., qs:qe], acc[..., qs:qe, :] = _online_softmax_step(
            m[..., qs:qe], l[..., qs:qe], acc[..., qs:qe, :], s, v[..., ks:ke, :].to(cd)
        )
    seen = l > 0
    lse = torch.where(seen, m + torch.log(torch.where(seen, l, torch.ones_like(l))), torch.full_like(l, float("-inf")))
    return _finish(l, acc).to(q.dtype), lse


def _flash_backward(q, k, v, out, lse, dout, scale, mask, causal_offset, block_q, block_k):
    cd = torch.promote_types(q.dtype, torch.float32)
    dout = dout.to(cd)
    delta = (dout * out.to(cd)).sum(dim=-1)  # D_i = rowsum(dO * O) = sum_j P_ij dP_ij
    lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))  # rows that saw nothing: P = 0
    dq = torch.zeros(q.shape, dtype=cd, device=q.device)
    dk = torch.zeros(k.shape, dtype=cd, device=k.device)
    dv = torch.zeros(v.shape, dtype=cd, device=v.device)
    for qs, qe, ks, ke, allowed in _tiles(q.shape[-2], k.shape[-2], block_q, block_k, mask, causal_offset, q.device,
                                             key_major=True):
        qb, kb, vb = q[..., qs:qe, :].to(cd), k[..., ks:ke, :].to(cd), v[..., ks:ke, :].to(cd)
        s = (qb @ kb.transpose(-2, -1)) * scale
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        p = torch.exp(s - lse[..., qs:qe, None])  # the attention weights, recomputed from the saved logsumexp
        dv[..., ks:ke, :] += p.transpose(-2, -1) @ dout[..., qs:qe, :]
        dp = dout[..., qs:qe, :] @ vb.transpose(-2, -1)
        ds = p * (dp - delta[..., qs:qe, None])  # softmax backward: dS = P * (dP - rowsum(dO * O))
        dq[..., qs:qe, :] += (ds @ kb) * scale
        dk[..., ks:ke, :] += (ds.transpose(-2, -1) @ qb) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _FlashAttentionFunction(torch.autograd.Function):
    """FlashAttention's forward (tiles, online softmax) and backward (tiles recomputed from the logsumexp)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, causal_offset, block_q, block_k):
        out, lse = _flash_forward(q, k, v, scale, mask, causal_offset, block_q, block_k)
        # only tensors, never None: tests elsewhere read saved_tensors to find the logsumexp
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.config = (scale, causal_offset, block_q, block_k)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, *mask = ctx.saved_tensors
        mask = mask[0] if mask else None
        scale, causal_offset, block_q, block_k = ctx.config
        dq, dk, dv = _flash_backward(q, k, v, out, lse, dout, scale, mask, causal_offset, block_q, block_k)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None, block_q: int = 64, block_k: int = 64, *,
                    mask: torch.Tensor | None = None, causal_offset: int = 0) -> torch.Tensor:
    """Exact attention ``softmax(q k^T * scale + M) v`` computed tile by tile, never forming the ``t_q x t_k``
    scores (FlashAttention, Dao et al., 2022; FlashAttention-2, Dao, 2023), in pure torch.

    Book: Efficient attention, "FlashAttention".

    Shapes: ``q (..., t_q, d)``, ``k (..., t_k, d)``, ``v (..., t_k, d_v)`` with equal leading dimensions ->
    ``(..., t_q, d_v)``; ``scale`` defaults to ``1/sqrt(d)``. For each tile of ``block_q`` queries the keys come
    in tiles of ``block_k``; a running row maximum ``m`` and normaliser ``l`` let each tile's
    ``exp(s - m)`` be added to the output and the earlier sum be rescaled by ``exp(m_old - m_new)`` when the
    maximum grows (the online softmax). Extra memory is ``O(t_q (d_v + 1) + block_q * block_k)`` per
    (batch, head), linear in ``T``. ``is_causal``: key ``j`` is visible to query ``i`` iff
    ``j <= i + causal_offset`` (top-left aligned by default, like torch; ``causal_offset = t_k - t_q`` aligns
    the last query with the last key). ``mask``: an optional boolean mask (True = may attend) broadcasting to
    ``(..., t_q, t_k)``; tiles it hides entirely are skipped.

    Differentiable through a custom ``torch.autograd.Function``: the forward saves only ``q, k, v``, the
    output and the row logsumexp ``L = m + log l``; the backward recomputes each tile's ``P = exp(S - L)`` and
    accumulates ``dV += P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``, ``dQ += dS K * scale``,
    ``dK += dS^T Q * scale`` (Algorithm 4 of the FlashAttention paper, with FlashAttention-2's ``rowsum(dO * O)``).
    """
    _check_qkv(q, k, v)
    _check_int("block_q", block_q)
    _check_int("block_k", block_k)
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, int):
        raise ValueError(f"causal_offset must be an integer, got {causal_offset!r}")
    score_shape = (*q.shape[:-1], k.shape[-2])
    if mask is not None:
        mask = _check_bool_mask(mask, score_shape)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _FlashAttentionFunction.apply(q, k, v, mask, scale, causal_offset if is_causal else None, block_q, block_k)
