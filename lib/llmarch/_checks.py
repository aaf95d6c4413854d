"""Input validation shared by every public ``llmarch`` function: errors name the argument and its shape."""

from __future__ import annotations

import numpy as np
import torch


def shape_str(shape) -> str:
    """``torch.Size([2, 4, 8]) -> "(2, 4, 8)"``, the form error messages use."""
    dims = tuple(shape)
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def check_tensor(name: str, t, dims: int | None = None, min_dim: int | None = None, floating: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``name`` unless ``t`` is a tensor of the stated rank and kind."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} has shape {shape_str(t.shape)} but must have {dims} dimensions")
    if min_dim is not None and t.dim() < min_dim:
        raise ValueError(f"{name} has shape {shape_str(t.shape)} but must have at least {min_dim} dimensions")
    if floating and not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def has_values(t: torch.Tensor) -> bool:
    """False for a tensor on the meta device (shapes only): checks that read values skip it."""
    return t.device.type != "meta"


def check_text(name: str, text) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``text`` is a ``str`` (bytes and None are refused)."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a str, got {type(text).__name__}")


def check_int(name: str, value, low: int = 0) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer (not a bool) at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        kind = "a positive" if low == 1 else "a non-negative" if low == 0 else f"an integer >= {low}, i.e. a"
        raise ValueError(f"{name} must be {kind} integer, got {value!r}")


def check_qkv(q, k, v) -> None:
    """Attention inputs ``q (..., t_q, d_k)``, ``k (..., t_k, d_k)``, ``v (..., t_k, d_v)``: floating tensors of
    rank >= 2 whose key dimension and key length agree (leading dimensions are checked by the caller)."""
    check_tensor("q", q, min_dim=2, floating=True)
    check_tensor("k", k, min_dim=2, floating=True)
    check_tensor("v", v, min_dim=2, floating=True)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q has shape {shape_str(q.shape)} but k has shape {shape_str(k.shape)}: the last dimensions (d_k) must match"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k has shape {shape_str(k.shape)} but v has shape {shape_str(v.shape)}: "
            "k and v need the same sequence length (dimension -2)"
        )
