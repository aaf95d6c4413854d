"""Low-rank attention: Linformer's keys and values projected along the sequence.

Book: Efficient attention, "Low-rank attention".
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.efficient._validation import _check_int

__all__ = ["LinformerSelfAttention"]


class LinformerSelfAttention(nn.Module):
    """Linformer self-attention (Wang et al., 2020): keys and values projected along the sequence to length k.

    Book: Efficient attention, "Low-rank attention".

    Per head, with ``Q, K, V (T, d)`` and learned ``E, F (k, T)`` (shared by the heads, the paper's "headwise
    sharing"; ``share_kv=True`` also sets ``F = E``): ``A = softmax(Q (E K)^T / sqrt(d))`` of shape ``(T, k)``
    and ``head = A (F V)`` of shape ``(T, d)``; then ``concat(heads) W_O`` as in multi-head attention. Cost
    ``O(T k d)`` instead of ``O(T^2 d)``. ``E, F`` are initialised ``N(0, 1/k)``, the Johnson-Lindenstrauss
    projection of the paper's Theorem 1.

    ``forward(x)``: ``x (B, T, d_model)`` with ``T <= seq_len`` -> ``(B, T, d_model)``; a shorter input uses the
    first ``T`` columns of ``E`` and ``F`` (the same as padding keys and values with zero rows). Linformer cannot
    be causal: every projected key mixes all positions, future ones included.
    """

    def __init__(self, d_model: int, n_heads: int, seq_len: int, k: int, bias: bool = True, share_kv: bool = False):
        super().__init__()
        _check_int("d_model", d_model)
        _check_int("n_heads", n_heads)
        _check_int("seq_len", seq_len)
        _check_int("k", k)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head, self.seq_len, self.k = d_model, n_heads, d_model // n_heads, seq_len, k
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)
        self.E = nn.Parameter(torch.randn(k, seq_len) / math.sqrt(k))
        self.F = self.E if share_kv else nn.Parameter(torch.randn(k, seq_len) / math.sqrt(k))

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``; with ``return_weights`` also ``A (B, H, T, k)``."""
        check_tensor("x", x, dims=3, floating=True)
        b, t, d = x.shape
        if d != self.d_model or t > self.seq_len:
            raise ValueError(
                f"x has shape {shape_str(x.shape)} but expected (B, T, {self.d_model}) with T <= seq_len={self.seq_len}"
            )

        def heads(y):
            return y.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        k_low = self.E[:, :t] @ k  # (k, T) @ (B, H, T, d) -> (B, H, k, d)
        v_low = self.F[:, :t] @ v
        weights = torch.softmax(q @ k_low.transpose(-2, -1) / math.sqrt(self.d_head), dim=-1)  # (B, H, T, k)
        out = self.o_proj((weights @ v_low).transpose(1, 2).reshape(b, t, d))
        return (out, weights) if return_weights else out
