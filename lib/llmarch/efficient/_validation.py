"""Argument checks shared by the modules of :mod:`llmarch.efficient`."""

from __future__ import annotations

import torch

from llmarch._checks import check_qkv, check_tensor, shape_str


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, same_batch: bool = True) -> None:
    """q ``(..., t_q, d)``, k ``(..., t_k, d)``, v ``(..., t_k, d_v)``; with ``same_batch`` the leading
    dimensions must be equal (no broadcasting)."""
    check_qkv(q, k, v)
    if same_batch and not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q {shape_str(q.shape)}, k {shape_str(k.shape)} and v {shape_str(v.shape)} must have the same leading "
            "(batch, head) dimensions; repeat key/value heads with repeat_kv for grouped-query attention"
        )
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")


def _check_bool_mask(mask: torch.Tensor, score_shape: tuple[int, ...]) -> torch.Tensor:
    """A boolean mask that broadcasts to ``score_shape = (..., t_q, t_k)``, expanded (no copy) to
    ``(..., t_q, t_k)`` in its last two dimensions so that it can be sliced into tiles."""
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
            "an additive bias goes to llmarch.attention.scaled_dot_product_attention(bias=...) or a score_mod"
        )
    try:
        ok = torch.broadcast_shapes(mask.shape, score_shape) == tuple(score_shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask has shape {shape_str(mask.shape)} but the attention scores have shape {shape_str(score_shape)}: "
            "mask must broadcast to (..., t_q, t_k)"
        )
    while mask.dim() < 2:
        mask = mask.unsqueeze(0)
    return mask.expand(*mask.shape[:-2], *score_shape[-2:])
