"""FlexAttention (``torch.nn.attention.flex_attention``): ``mask_mod`` and ``score_mod`` builders for the
causal, sliding-window, dense-mask, ALiBi, KERPLE and T5 cases, and the ``flex_*`` attention functions that use them.

Book: Efficient attention, "GPU paths".
"""

from __future__ import annotations

import warnings

import torch

from llmarch._checks import check_tensor, shape_str
from llmarch.efficient._validation import _check_int, _check_qkv
from llmarch.positional import KERPLE_VARIANTS, t5_relative_bucket

__all__ = [
    "causal_mask_mod",
    "sliding_window_mask_mod",
    "dense_mask_mod",
    "dense_bias_score_mod",
    "alibi_score_mod",
    "kerple_score_mod",
    "t5_score_mod",
    "build_block_mask",
    "flex_attention_with",
    "flex_sliding_window",
    "flex_alibi",
    "flex_t5",
]


def causal_mask_mod(causal_offset: int = 0):
    """FlexAttention ``mask_mod``: ``kv_idx <= q_idx + causal_offset`` (see :func:`llmarch.attention.causal_mask`).

    Book: Efficient attention, "GPU paths".
    """

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + causal_offset

    return mask_mod


def sliding_window_mask_mod(w: int, causal: bool = True):
    """FlexAttention ``mask_mod`` of :func:`sliding_window_mask`: ``0 <= q_idx - kv_idx < w`` (causal) or
    ``|q_idx - kv_idx| <= floor(w/2)``.

    Book: Efficient attention, "GPU paths".
    """
    _check_int("w", w)

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return ((d >= 0) & (d < w)) if causal else ((d <= w // 2) & (d >= -(w // 2)))

    return mask_mod


def dense_mask_mod(mask: torch.Tensor):
    """FlexAttention ``mask_mod`` that looks a boolean mask up, e.g. one of the pattern builders'
    ``(T_q, T_k)`` masks or a ``(B, H, T_q, T_k)`` one: ``mask[b, h, q_idx, kv_idx]`` (size-1 dimensions broadcast).

    Book: Efficient attention, "GPU paths".
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool or mask.dim() > 4 or mask.dim() < 2:
        raise ValueError(f"mask has shape {shape_str(mask.shape)} and dtype {mask.dtype}: expected a boolean "
                         "(T_q, T_k), (H, T_q, T_k) or (B, H, T_q, T_k) mask")
    m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    per_b, per_h = m4.shape[0] > 1, m4.shape[1] > 1

    def mask_mod(b, h, q_idx, kv_idx):
        return m4[b if per_b else 0, h if per_h else 0, q_idx, kv_idx]

    return mask_mod


def dense_bias_score_mod(bias: torch.Tensor):
    """FlexAttention ``score_mod`` that adds a dense additive bias: ``score + bias[b, h, q_idx, kv_idx]`` for a
    float ``(T_q, T_k)``, ``(H, T_q, T_k)`` or ``(B, H, T_q, T_k)`` bias (size-1 dimensions broadcast), e.g. the
    ALiBi or T5 bias a model has already formed. Book: Efficient attention, "GPU paths".
    """
    check_tensor("bias", bias, floating=True)
    if bias.dim() > 4 or bias.dim() < 2:
        raise ValueError(f"bias has shape {shape_str(bias.shape)}: expected (T_q, T_k), (H, T_q, T_k) or "
                         "(B, H, T_q, T_k)")
    b4 = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    per_b, per_h = b4.shape[0] > 1, b4.shape[1] > 1

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + b4[b if per_b else 0, h if per_h else 0, q_idx, kv_idx].to(score.dtype)

    return score_mod


def alibi_score_mod(slopes: torch.Tensor, offset: int = 0):
    """FlexAttention ``score_mod`` of ALiBi: ``score - slopes[h] * (q_idx + offset - kv_idx)``, the bias of
    :func:`llmarch.positional.alibi_bias` (query ``i`` at position ``i + offset``).

    Book: Efficient attention, "GPU paths".
    """
    check_tensor("slopes", slopes, dims=1)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h].to(score.dtype) * (q_idx + offset - kv_idx).to(score.dtype)

    return score_mod


def t5_score_mod(bias_table: torch.Tensor, num_buckets: int, max_distance: int, bidirectional: bool = False,
                 offset: int = 0):
    """FlexAttention ``score_mod`` of T5's relative bias: ``score + bias_table[bucket(kv_idx - q_idx - offset), h]``
    with :func:`llmarch.positional.t5_relative_bucket`; ``bias_table (num_buckets, H)`` is the layout of
    ``T5RelativeBias.embedding.weight``.

    Book: Efficient attention, "GPU paths".
    """
    check_tensor("bias_table", bias_table, dims=2, floating=True)
    if bias_table.shape[0] != num_buckets:
        raise ValueError(f"bias_table has shape {shape_str(bias_table.shape)} but num_buckets={num_buckets}: "
                         "expected (num_buckets, H)")

    def score_mod(score, b, h, q_idx, kv_idx):
        bucket = t5_relative_bucket(kv_idx - q_idx - offset, bidirectional, num_buckets, max_distance)
        return score + bias_table[bucket, h].to(score.dtype)

    return score_mod


def kerple_score_mod(r1: torch.Tensor, r2: torch.Tensor, variant: str = "log", offset: int = 0):
    """FlexAttention ``score_mod`` of KERPLE, the bias of :func:`llmarch.positional.kerple_bias` with
    ``n = |q_idx + offset - kv_idx|``: ``score - r1[h] log(1 + r2[h] n)`` (``log``) or ``score - r1[h] n^r2[h]``
    (``power``). ``r1, r2 (H,)``, e.g. ``KerpleBias.r1`` and ``.r2`` (detached).

    Book: Positional encodings, "KERPLE: kernels of the distance".
    """
    check_tensor("r1", r1, dims=1, floating=True)
    check_tensor("r2", r2, dims=1, floating=True)
    if variant not in KERPLE_VARIANTS:
        raise ValueError(f"KERPLE variant must be one of {KERPLE_VARIANTS}, got {variant!r}")

    def score_mod(score, b, h, q_idx, kv_idx):
        distance = (q_idx + offset - kv_idx).abs().to(score.dtype)
        if variant == "log":
            return score - r1[h].to(score.dtype) * torch.log1p(r2[h].to(score.dtype) * distance)
        return score - r1[h].to(score.dtype) * distance.pow(r2[h].to(score.dtype))

    return score_mod


_FLEX_COMPILED = {}


def build_block_mask(mask_mod, b: int, h: int, t_q: int, t_k: int, device=None):
    """FlexAttention's block mask of ``mask_mod`` for scores ``(b, h, t_q, t_k)`` (``create_block_mask``): which
    tiles are fully hidden, partly hidden or fully visible. Book: Efficient attention, "GPU paths"."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod, b, h, t_q, t_k, device=device)


def flex_attention_with(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_mod=None, score_mod=None,
                        scale: float | None = None, compile: bool | None = None, block_mask=None) -> torch.Tensor:
    """``torch.nn.attention.flex_attention`` with a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = may
    attend) and a ``score_mod(score, b, h, q_idx, kv_idx) -> score``.

    Book: Efficient attention, "GPU paths".

    Shapes: ``q (B, H, t_q, d)``, ``k, v (B, H_kv, t_k, d)`` with ``H`` a multiple of ``H_kv`` -> ``(B, H, t_q, d)``.
    The ``mask_mod`` becomes a block mask (:func:`build_block_mask`), so tiles it hides entirely are skipped by the
    fused kernel; a ``block_mask`` already built for these shapes (the layers of a model share one) is used as
    it is, in place of ``mask_mod``. ``compile`` (default: True on CUDA, False elsewhere) runs
    ``torch.compile(flex_attention)``; uncompiled, torch evaluates the same definition densely (``O(T^2)``
    memory), which is what CPU tests use.
    Torch 2.13 has no FlexAttention backward on CPU: inputs that require grad raise there.
    """
    from torch.nn.attention.flex_attention import flex_attention

    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dims=4, floating=True)
    _check_qkv(q, k, v, same_batch=False)
    b, h, t_q, _ = q.shape
    if k.shape[0] != b or v.shape[:2] != k.shape[:2] or h % k.shape[1]:
        raise ValueError(f"q {shape_str(q.shape)}, k {shape_str(k.shape)} and v {shape_str(v.shape)}: expected "
                         "q (B, H, t_q, d) and k, v (B, H_kv, t_k, d) with H a multiple of H_kv")
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("FlexAttention has no backward on CPU in torch 2.13: use flash_attention or sdpa for "
                           "gradients, or call flex under torch.no_grad()")
    compile = q.device.type == "cuda" if compile is None else compile
    if mask_mod is not None and block_mask is not None:
        raise ValueError("pass either mask_mod or block_mask, not both")
    if mask_mod is not None:
        block_mask = build_block_mask(mask_mod, b, h, t_q, k.shape[-2], device=q.device)
    fn = flex_attention
    if compile:
        fn = _FLEX_COMPILED.setdefault("fn", torch.compile(flex_attention))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=h != k.shape[1])


def flex_sliding_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, causal: bool = True,
                        compile: bool | None = None) -> torch.Tensor:
    """Sliding-window attention with FlexAttention: dense attention masked by :func:`sliding_window_mask(T, w)`.

    Book: Efficient attention, "GPU paths". Shapes as in :func:`flex_attention_with`.
    """
    return flex_attention_with(q, k, v, mask_mod=sliding_window_mask_mod(w, causal), compile=compile)


def flex_alibi(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor, is_causal: bool = True,
               compile: bool | None = None) -> torch.Tensor:
    """ALiBi attention with FlexAttention: ``softmax(q k^T / sqrt(d) + alibi_bias) v``, the queries being the last
    ``t_q`` positions (``offset = t_k - t_q``, as :func:`llmarch.positional.alibi_bias`); causal by default
    (bottom-right: query ``i`` sees keys ``j <= i + t_k - t_q``).

    Book: Efficient attention, "GPU paths". ``slopes (H,)``, e.g. ``llmarch.positional.alibi_slopes(H)``.
    """
    check_tensor("slopes", slopes, dims=1)
    if slopes.shape[0] != q.shape[1]:
        raise ValueError(f"slopes has shape {shape_str(slopes.shape)} but q has shape {shape_str(q.shape)}: "
                         "one slope per head")
    offset = k.shape[-2] - q.shape[-2]
    return flex_attention_with(q, k, v, mask_mod=causal_mask_mod(offset) if is_causal else None,
                               score_mod=alibi_score_mod(slopes.to(q.device), offset), compile=compile)


def flex_t5(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias_table: torch.Tensor, num_buckets: int,
            max_distance: int, bidirectional: bool = False, is_causal: bool = True,
            compile: bool | None = None) -> torch.Tensor:
    """T5 relative-bias attention with FlexAttention: ``softmax(q k^T / sqrt(d) + b) v`` with
    ``b[h, i, j] = bias_table[bucket(j - i - offset), h]`` (``offset = t_k - t_q``, as ``T5RelativeBias``);
    causal (bottom-right) by default.

    Book: Efficient attention, "GPU paths".
    """
    offset = k.shape[-2] - q.shape[-2]
    return flex_attention_with(
        q, k, v, mask_mod=causal_mask_mod(offset) if is_causal else None,
        score_mod=t5_score_mod(bias_table.to(q.device), num_buckets, max_distance, bidirectional, offset),
        compile=compile,
    )
