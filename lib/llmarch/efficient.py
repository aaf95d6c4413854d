"""Efficient attention and inference: sparse attention patterns, blockwise and low-rank (Linformer) attention,
FlashAttention (pure torch and Triton), FlexAttention, a backend dispatcher, contiguous and paged key/value
caches, and the memory arithmetic that motivates them.

Book: Efficient attention (``book/efficient-attention.md``); the contiguous cache is also used in Decoding,
"The KV cache".

Conventions (DESIGN.md), stated once here:
- per-head tensors are ``(B, H, T, d_head)``; a cache holds the *rotated* keys when the model uses RoPE, so a
  cached key never needs to be rotated again;
- positions are 0-based: query ``i``, key ``j``; a boolean mask holds **True where query i may attend to key j**
  (as ``torch.nn.functional.scaled_dot_product_attention`` and ``llmarch.attention`` do);
- causal masking is top-left aligned, ``j <= i + causal_offset`` with ``causal_offset = 0`` by default, as
  ``llmarch.attention.causal_mask(t_q, t_k, offset)`` and torch's ``is_causal=True``; when ``t_q`` new queries
  follow ``t_k - t_q`` cached keys, pass ``causal_offset = t_k - t_q`` (bottom-right alignment, what
  FlashAttention-2 >= 2.1 calls causal);
- a query that may attend to no key gets an output of zeros (as torch's SDPA does) and zero gradients;
- memory is counted in bytes; ``GiB = 2**30`` bytes.
"""

from __future__ import annotations

import math
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from llmarch._checks import check_qkv, check_tensor, shape_str
from llmarch.attention import scaled_dot_product_attention
from llmarch.positional import t5_relative_bucket

__all__ = [
    "LayerKVCache",
    "KVCache",
    # Sparse attention patterns
    "sliding_window_mask",
    "dilated_window_mask",
    "strided_mask",
    "fixed_mask",
    "global_local_mask",
    "bigbird_mask",
    "block_permutation_mask",
    "blockwise_attention",
    # Low-rank attention
    "LinformerSelfAttention",
    # The KV cache, paged attention
    "repeat_kv",
    "kv_cache_bytes",
    "PagedKVCache",
    "paged_attention",
    # FlashAttention
    "attention_memory_bytes",
    "flash_attention",
    # GPU paths
    "TRITON_VERSION",
    "triton_flash_attention",
    "causal_mask_mod",
    "sliding_window_mask_mod",
    "dense_mask_mod",
    "alibi_score_mod",
    "t5_score_mod",
    "flex_attention_with",
    "flex_sliding_window",
    "flex_alibi",
    "flex_t5",
    "BACKENDS",
    "select_backend",
    "attention",
]

class LayerKVCache:
    """Keys and values ``(B, H_kv, T_past, d_head)`` of one attention layer for the tokens seen so far."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' ``k, v (B, H_kv, T_new, d_head)``; return all keys and values so far."""
        check_tensor("k", k, dims=4)
        check_tensor("v", v, dims=4)
        if self.k is not None and (k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1]):
            raise ValueError(f"k has shape {shape_str(k.shape)} but the cache holds {shape_str(self.k.shape)}")
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v


class KVCache:
    """One :class:`LayerKVCache` per layer of a model: ``GPT.forward(idx, kv_cache=cache)`` feeds only the
    new tokens and reuses what the cache holds, so a decoding step costs O(T) instead of O(T^2)."""

    def __init__(self, n_layers: int):
        self.layers = [LayerKVCache() for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Number of tokens the cache holds."""
        return self.layers[0].length


# --- validation helpers ----------------------------------------------------------------------------------


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


# --- Sparse attention patterns --------------------------------------------------------------------------


def _grid(T: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Query indices ``i (T, 1)`` and key indices ``j (1, T)``."""
    _check_int("T", T, minimum=0)
    idx = torch.arange(T, device=device)
    return idx[:, None], idx[None, :]


def sliding_window_mask(T: int, w: int, causal: bool = True, device=None) -> torch.Tensor:
    """Local (sliding-window) attention, boolean ``(T, T)``.

    Book: Efficient attention, "Sparse attention patterns".

    Causal: query ``i`` sees keys ``i-w+1 .. i``, that is ``M[i, j] = 0 <= i - j < w`` (``w`` keys, itself
    included: the count of mistral-src's "at most W tokens"; the Mistral paper's "between i - W and i" would be
    ``W + 1``). Bidirectional: ``M[i, j] = |i - j| <= floor(w/2)``, the material's
    "window of c words, floor(c/2) to the left and floor(c/2) to the right" (``2*floor(w/2)+1`` keys: ``w + 1``
    when ``w`` is even).

    >>> sliding_window_mask(4, 2).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    _check_int("w", w)
    i, j = _grid(T, device)
    if causal:
        return (i - j >= 0) & (i - j < w)
    return (i - j).abs() <= w // 2


def dilated_window_mask(T: int, w: int, dilation: int, causal: bool = True, device=None) -> torch.Tensor:
    """Dilated sliding window (Longformer, Beltagy et al., 2020), boolean ``(T, T)``: ``w`` keys spaced
    ``dilation`` apart.

    Book: Efficient attention, "Sparse attention patterns".

    Causal: ``M[i, j] = (i - j) in {0, dilation, ..., (w-1)*dilation}``. Bidirectional:
    ``M[i, j] = |i - j| <= floor(w/2)*dilation and (i - j) mod dilation == 0``. ``dilation = 1`` is
    :func:`sliding_window_mask`; the receptive field grows to ``(w-1)*dilation + 1`` at the same cost.
    """
    _check_int("w", w)
    _check_int("dilation", dilation)
    i, j = _grid(T, device)
    d = i - j
    on_grid = d % dilation == 0
    if causal:
        return (d >= 0) & (d <= (w - 1) * dilation) & on_grid
    return (d.abs() <= (w // 2) * dilation) & on_grid


def strided_mask(T: int, stride: int, device=None) -> torch.Tensor:
    """The Sparse Transformer's *strided* pattern (Child et al., 2019), causal, boolean ``(T, T)``.

    Book: Efficient attention, "Sparse attention patterns".

    ``M[i, j] = j <= i and ((i - j) < stride or (i - j) mod stride == 0)``: the union of the local head
    ``A1 = {j : 0 <= i - j < stride}`` and the strided head ``A2 = {j : (i - j) mod stride == 0}`` (the paper's
    "merged head"). The paper writes ``A1 = {max(0, i - l), ..., i}`` (``l + 1`` keys) and its released code
    ``i - j < l``; the union is the same because ``j = i - l`` is in ``A2`` anyway. Meant for ``stride ~ sqrt(T)``.
    """
    _check_int("stride", stride)
    i, j = _grid(T, device)
    d = i - j
    return (d >= 0) & ((d < stride) | (d % stride == 0))


def fixed_mask(T: int, stride: int, c: int = 1, device=None) -> torch.Tensor:
    """The Sparse Transformer's *fixed* pattern (Child et al., 2019), causal, boolean ``(T, T)``.

    Book: Efficient attention, "Sparse attention patterns".

    ``M[i, j] = j <= i and (floor(j/stride) == floor(i/stride) or j mod stride in {stride-c, ..., stride-1})``:
    every query sees its own block of ``stride`` positions and the last ``c`` positions ("summary cells") of
    every earlier block. The paper writes ``{t, t+1, ..., l}`` with ``t = l - c``, which would be ``c + 1``
    values; ``j mod l`` never equals ``l``, so it is the ``c`` values above. ``1 <= c <= stride``.
    """
    _check_int("stride", stride)
    _check_int("c", c)
    if c > stride:
        raise ValueError(f"c={c} summary positions do not fit in a block of stride={stride}")
    i, j = _grid(T, device)
    same_block = torch.div(j, stride, rounding_mode="floor") == torch.div(i, stride, rounding_mode="floor")
    summary = j % stride >= stride - c
    return (j <= i) & (same_block | summary)


def global_local_mask(T: int, w: int, global_tokens, causal: bool = False, device=None) -> torch.Tensor:
    """Local window plus global tokens (Longformer; the material's "Global+Local"), boolean ``(T, T)``.

    Book: Efficient attention, "Sparse attention patterns".

    ``M[i, j] = window(i, j) or i in G or j in G`` with ``window`` from :func:`sliding_window_mask(T, w, causal)`
    and ``G = global_tokens`` (a sequence of positions, e.g. ``[0]`` for ``[CLS]``): a global token sees every
    key and every query sees it. With ``causal=True`` everything is intersected with ``j <= i``.
    """
    m = sliding_window_mask(T, w, causal=causal, device=device)
    g = torch.as_tensor(list(global_tokens) if not isinstance(global_tokens, torch.Tensor) else global_tokens,
                        dtype=torch.long).reshape(-1)
    if g.numel() and (g.min() < 0 or g.max() >= T):
        raise ValueError(f"global_tokens must be positions in 0..{T - 1}, got {g.tolist()}")
    is_global = torch.zeros(T, dtype=torch.bool, device=m.device)
    is_global[g.to(m.device)] = True
    m = m | is_global[:, None] | is_global[None, :]
    if causal:
        i, j = _grid(T, m.device)
        m = m & (j <= i)
    return m


def bigbird_mask(T: int, w: int, n_global: int, n_random: int, seed: int = 0, causal: bool = False,
                 device=None) -> torch.Tensor:
    """BigBird's pattern (Zaheer et al., 2020) at token level: global + window + random, boolean ``(T, T)``.

    Book: Efficient attention, "Sparse attention patterns".

    Starts from :func:`global_local_mask(T, w, range(n_global), causal)` (the first ``n_global`` tokens are
    global, as in BigBird-ITC); then every other query ``i`` also sees ``min(n_random, available)`` keys drawn
    uniformly without replacement from the keys it does not see yet (``j <= i`` only, when causal). The draw uses
    ``torch.Generator().manual_seed(seed)`` row by row, so the mask is deterministic for a given ``seed``.
    (BigBird itself draws random *blocks* of keys, which is what makes it fast on accelerators.)
    """
    _check_int("n_global", n_global, minimum=0)
    _check_int("n_random", n_random, minimum=0)
    if n_global > T:
        raise ValueError(f"n_global={n_global} exceeds the sequence length T={T}")
    m = global_local_mask(T, w, range(n_global), causal=causal)
    gen = torch.Generator().manual_seed(seed)
    for i in range(n_global, T):
        allowed = ~m[i]
        if causal:
            allowed[i + 1 :] = False
        candidates = allowed.nonzero().flatten()
        take = min(n_random, candidates.numel())
        if take:
            m[i, candidates[torch.randperm(candidates.numel(), generator=gen)[:take]]] = True
    return m.to(device) if device is not None else m


def _block_starts(T: int, n_blocks: int) -> list[int]:
    """``starts[b]`` is the first position of block ``b = floor(i * n / T)``: ``ceil(b * T / n)``; block ``b`` is
    ``starts[b] .. starts[b+1]-1`` (empty when ``T < n`` for some ``b``)."""
    return [(b * T + n_blocks - 1) // n_blocks for b in range(n_blocks + 1)]


def _check_perm(perm, n_blocks: int) -> torch.Tensor:
    p = torch.arange(n_blocks) if perm is None else torch.as_tensor(perm, dtype=torch.long).cpu()
    rows = p.reshape(-1, p.shape[-1]) if p.dim() else p.reshape(1, 1)
    if p.dim() not in (1, 2) or p.shape[-1] != n_blocks or any(
        sorted(r.tolist()) != list(range(n_blocks)) for r in rows
    ):
        raise ValueError(
            f"perm has shape {shape_str(p.shape)} and values {p.tolist()}: it must be a permutation of "
            f"0..{n_blocks - 1} (shape ({n_blocks},)), or one per head (shape (H, {n_blocks}))"
        )
    return p


def block_permutation_mask(T: int, n_blocks: int, perm=None, device=None) -> torch.Tensor:
    """Local block attention with permuted blocks, boolean ``(T, T)`` (the material's "Local Block Attention").

    Book: Efficient attention, "Sparse attention patterns".

    With ``n = n_blocks`` and ``perm`` a permutation of ``0..n-1`` (default: the identity, plain local block
    attention): ``M[i, j] = perm[floor(i*n/T)] == floor(j*n/T)``. The queries of block ``b`` see exactly the keys
    of block ``perm[b]``. When ``n`` does not divide ``T`` the blocks differ in size by one; when ``T < n`` some
    blocks are empty and the queries mapped to an empty block see nothing.

    >>> block_permutation_mask(4, 2, perm=[1, 0]).int()
    tensor([[0, 0, 1, 1],
            [0, 0, 1, 1],
            [1, 1, 0, 0],
            [1, 1, 0, 0]], dtype=torch.int32)
    """
    _check_int("n_blocks", n_blocks)
    p = _check_perm(perm, n_blocks)
    if p.dim() != 1:
        raise ValueError(
            f"perm has shape {shape_str(p.shape)}: block_permutation_mask takes one permutation ({n_blocks},)"
        )
    i, j = _grid(T)
    block_i, block_j = (i * n_blocks) // max(T, 1), (j * n_blocks) // max(T, 1)
    return (p[block_i] == block_j).to(device) if device is not None else p[block_i] == block_j


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_blocks: int, perm=None,
                        scale: float | None = None) -> torch.Tensor:
    """Block-permuted local attention that computes only the ``n`` needed blocks of scores.

    Book: Efficient attention, "Sparse attention patterns".

    Shapes: ``q, k (..., T, d)``, ``v (..., T, d_v)`` (same leading dimensions) -> ``(..., T, d_v)``. Query block
    ``b`` attends to key block ``perm[b]`` only: ``O_b = softmax(Q_b K_{perm[b]}^T * scale) V_{perm[b]}``, which is
    dense attention masked by :func:`block_permutation_mask(T, n_blocks, perm)` at ``n`` blocks of
    ``(T/n)^2`` scores instead of ``T^2``. ``perm`` of shape ``(H, n)`` gives each head (dimension -3) its own
    permutation ("blocked multi-head attention"). Queries whose key block is empty (``T < n``) get zeros.
    """
    _check_qkv(q, k, v)
    _check_int("n_blocks", n_blocks)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"q has shape {shape_str(q.shape)} but k has shape {shape_str(k.shape)}: blockwise attention is "
            "self-attention and needs the same sequence length"
        )
    p = _check_perm(perm, n_blocks)
    if p.dim() == 2:
        if q.dim() < 3 or q.shape[-3] != p.shape[0]:
            raise ValueError(
                f"perm has shape {shape_str(p.shape)} (one permutation per head) but q has shape "
                f"{shape_str(q.shape)}: dimension -3 must be the {p.shape[0]} heads"
            )
        heads = [blockwise_attention(q[..., h, :, :], k[..., h, :, :], v[..., h, :, :], n_blocks, p[h], scale)
                 for h in range(p.shape[0])]
        return torch.stack(heads, dim=-3)
    T = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    starts = _block_starts(T, n_blocks)
    pieces = []
    for b in range(n_blocks):
        rows = slice(starts[b], starts[b + 1])
        cols = slice(starts[int(p[b])], starts[int(p[b]) + 1])
        qb = q[..., rows, :]
        if qb.shape[-2] == 0:
            continue
        if cols.stop == cols.start:  # the key block is empty: nothing to attend to
            pieces.append(v.new_zeros(*qb.shape[:-1], v.shape[-1]))
            continue
        weights = torch.softmax(qb @ k[..., cols, :].transpose(-2, -1) * scale, dim=-1)
        pieces.append(weights @ v[..., cols, :])
    return torch.cat(pieces, dim=-2) if pieces else v.new_zeros(*q.shape[:-1], v.shape[-1])


# --- Low-rank attention ----------------------------------------------------------------------------------


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


# --- The KV cache ----------------------------------------------------------------------------------------


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Grouped-query attention's sharing: ``(B, H_kv, T, d) -> (B, H_kv * n_rep, T, d)``, each key/value head
    repeated for ``n_rep`` consecutive query heads (``n_rep = H`` with one key/value head is multi-query attention).

    Book: Efficient attention, "The KV cache" (Shazeer, 2019; Ainslie et al., 2023). Only the ``H_kv`` heads are
    cached; the repetition is a view-like step at attention time, as in ``MultiHeadAttention.attend``.
    """
    check_tensor("x", x, min_dim=3)
    _check_int("n_rep", n_rep)
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=-3)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, d_head: int, seq_len: int, batch: int = 1,
                   bytes_per_elem: int = 2) -> int:
    """Bytes of a KV cache: ``2 * n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_elem``.

    Book: Efficient attention, "The KV cache".

    The 2 counts keys and values. The material's "per token" formula ``2 x num_layers x (num_heads x dim_head) x
    precision_in_bytes`` is this with ``seq_len = batch = 1``, where ``num_heads`` must be the number of
    *key/value* heads: GQA and MQA shrink the cache by ``n_heads / n_kv_heads``.

    >>> kv_cache_bytes(32, 32, 128, 4096) / 2**30  # Llama-2-7B, 4096 tokens, fp16
    2.0
    """
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("d_head", d_head),
                        ("batch", batch), ("bytes_per_elem", bytes_per_elem)):
        _check_int(name, value)
    _check_int("seq_len", seq_len, minimum=0)
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_elem


# --- Paged attention -------------------------------------------------------------------------------------


class PagedKVCache:
    """A paged key/value cache for one attention layer (vLLM, Kwon et al., 2023).

    Book: Efficient attention, "Paged attention".

    Keys and values live in a preallocated pool of ``n_blocks`` fixed-size blocks, ``k_pool, v_pool
    (n_blocks, H_kv, block_size, d_head)``. Each sequence owns a *block table*, the list of its blocks in order:
    its token ``t`` is slot ``t % block_size`` of block ``block_table[t // block_size]``. Blocks are taken from the
    free list only when a sequence needs one and return to it when the sequence is freed, so memory is never
    reserved for tokens that are not generated: at most ``block_size - 1`` slots per sequence sit unused
    (:meth:`wasted_slots`), and a sequence's blocks need not be contiguous. A model keeps one such cache per
    attention layer, with the same block tables.
    """

    def __init__(self, n_blocks: int, block_size: int, n_kv_heads: int, d_head: int,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, value in (("n_blocks", n_blocks), ("block_size", block_size), ("n_kv_heads", n_kv_heads),
                            ("d_head", d_head)):
            _check_int(name, value)
        self.block_size, self.n_kv_heads, self.d_head = block_size, n_kv_heads, d_head
        self.k_pool = torch.zeros(n_blocks, n_kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.v_pool = torch.zeros_like(self.k_pool)
        self.free_blocks: list[int] = list(range(n_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    @property
    def n_free_blocks(self) -> int:
        return len(self.free_blocks)

    def length(self, seq_id: int) -> int:
        """Number of tokens sequence ``seq_id`` holds (0 for an unknown sequence)."""
        return self.lengths.get(seq_id, 0)

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append the new tokens' ``k, v (H_kv, T_new, d_head)`` to sequence ``seq_id`` (created if new),
        taking blocks from the free list as needed. Raises ``RuntimeError`` (and changes nothing) when the pool
        has too few free blocks."""
        expected = (self.n_kv_heads, k.shape[-2] if k.dim() == 3 else -1, self.d_head)
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, dims=3, floating=True)
            if tuple(t.shape) != expected or t.shape != k.shape:
                raise ValueError(
                    f"{name} has shape {shape_str(t.shape)} but the cache holds (H_kv, T_new, d_head) = "
                    f"({self.n_kv_heads}, T_new, {self.d_head}) and k, v must match"
                )
        table = self.block_tables.setdefault(seq_id, [])
        start, t_new = self.lengths.setdefault(seq_id, 0), k.shape[-2]
        needed = -(-(start + t_new) // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError(
                f"sequence {seq_id} needs {needed} more blocks of {self.block_size} tokens but only "
                f"{len(self.free_blocks)} are free: free finished sequences or make the pool larger"
            )
        for _ in range(needed):
            table.append(self.free_blocks.pop(0))
        pos = torch.arange(start, start + t_new)
        blocks = torch.tensor(table, dtype=torch.long)[pos // self.block_size].to(self.k_pool.device)
        slots = (pos % self.block_size).to(self.k_pool.device)
        # advanced indices on dimensions 0 and 2, separated by the head dimension: the result is (T_new, H_kv, d)
        self.k_pool[blocks, :, slots] = k.transpose(0, 1).to(self.k_pool.dtype)
        self.v_pool[blocks, :, slots] = v.transpose(0, 1).to(self.v_pool.dtype)
        self.lengths[seq_id] = start + t_new

    def free(self, seq_id: int) -> None:
        """Forget sequence ``seq_id`` and return its blocks to the free list."""
        if seq_id not in self.block_tables:
            raise KeyError(f"sequence {seq_id} is not in the cache (known: {sorted(self.block_tables)})")
        self.free_blocks.extend(self.block_tables.pop(seq_id))
        del self.lengths[seq_id]

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of ``seq_id`` copied into contiguous ``(H_kv, T, d_head)`` tensors."""
        if seq_id not in self.block_tables:
            raise KeyError(f"sequence {seq_id} is not in the cache (known: {sorted(self.block_tables)})")
        n = self.lengths[seq_id]
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long, device=self.k_pool.device)

        def flat(pool):
            return pool[table].transpose(0, 1).reshape(self.n_kv_heads, -1, self.d_head)[:, :n]

        return flat(self.k_pool), flat(self.v_pool)

    def wasted_slots(self) -> int:
        """Allocated but unused token slots: ``sum(len(table) * block_size - length)``, below ``block_size`` per
        sequence (a contiguous cache that reserves ``max_len`` per sequence wastes ``max_len - length``)."""
        return sum(len(t) * self.block_size - self.lengths[s] for s, t in self.block_tables.items())


def paged_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids, is_causal: bool = True,
                    scale: float | None = None) -> torch.Tensor:
    """Attention of each sequence's new queries over its keys and values in a :class:`PagedKVCache`.

    Book: Efficient attention, "Paged attention".

    ``q (N, H, T_q, d_head)``, one row per sequence in ``seq_ids`` (length ``N``) -> ``(N, H, T_q, d_head)``.
    The queries are the sequence's last ``T_q`` tokens (append their keys and values first), so with
    ``is_causal`` query ``t`` of a sequence of length ``L`` sees keys ``0 .. L - T_q + t``; ``T_q = 1`` is a
    decoding step. ``H`` must be a multiple of ``H_kv`` (grouped-query attention). The result equals
    contiguous attention over ``cache.gather(seq_id)``, but keys are read block by block through the block
    tables, with the online softmax of FlashAttention merging the blocks, as vLLM's kernel does.
    """
    check_tensor("q", q, dims=4, floating=True)
    seq_ids = list(seq_ids)
    n, h, t_q, d = q.shape
    if n != len(seq_ids) or d != cache.d_head or h % cache.n_kv_heads:
        raise ValueError(
            f"q has shape {shape_str(q.shape)} but expected ({len(seq_ids)}, H, T_q, {cache.d_head}) for "
            f"{len(seq_ids)} sequences, with H a multiple of the cache's {cache.n_kv_heads} key/value heads"
        )
    unknown = [s for s in seq_ids if s not in cache.block_tables]
    if unknown:
        raise KeyError(f"sequences {unknown} are not in the cache (known: {sorted(cache.block_tables)})")
    lengths = torch.tensor([cache.lengths[s] for s in seq_ids], device=q.device)
    if (lengths < t_q).any():
        raise ValueError(f"q has shape {shape_str(q.shape)} but some sequences hold fewer than T_q={t_q} tokens: "
                         f"lengths {lengths.tolist()}; append the new tokens' keys and values first")
    n_table = max(len(cache.block_tables[s]) for s in seq_ids)
    tables = torch.zeros(n, n_table, dtype=torch.long)
    for r, s in enumerate(seq_ids):
        tables[r, : len(cache.block_tables[s])] = torch.tensor(cache.block_tables[s], dtype=torch.long)
    tables = tables.to(cache.k_pool.device)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = h // cache.n_kv_heads
    cd = torch.promote_types(q.dtype, torch.float32)
    qc = q.to(cd)
    m = torch.full((n, h, t_q), float("-inf"), dtype=cd, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(n, h, t_q, d, dtype=cd, device=q.device)
    query_pos = lengths[:, None] - t_q + torch.arange(t_q, device=q.device)[None, :]  # (N, T_q)
    bs = cache.block_size
    for b in range(n_table):  # logical block b of every sequence at once
        kb = repeat_kv(cache.k_pool[tables[:, b]], group).to(device=q.device, dtype=cd)  # (N, H, bs, d)
        vb = repeat_kv(cache.v_pool[tables[:, b]], group).to(device=q.device, dtype=cd)
        key_pos = b * bs + torch.arange(bs, device=q.device)  # (bs,)
        allowed = key_pos[None, None, :] < lengths[:, None, None]  # (N, 1, bs)
        if is_causal:
            allowed = allowed & (key_pos[None, None, :] <= query_pos[:, :, None])  # (N, T_q, bs)
        s = (qc @ kb.transpose(-2, -1)) * scale
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        m, l, acc = _online_softmax_step(m, l, acc, s, vb)
    return _finish(l, acc).to(q.dtype)


# --- FlashAttention --------------------------------------------------------------------------------------


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
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.config = (scale, causal_offset, block_q, block_k)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, mask = ctx.saved_tensors
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


# --- GPU paths: Triton ------------------------------------------------------------------------------------

TRITON_VERSION = "3.7.1"  # the version torch 2.13 pins (its CUDA wheel's requirement)
_TRITON = {}


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_kernels():
    """Import triton and define the kernels on first use, so that ``llmarch`` imports without triton.

    ``TRITON_INTERPRET=1`` must be set before anything imports triton: ``triton.language`` builds its helpers
    (``tl.zeros``, ...) for the GPU compiler or for the interpreter when it is imported, and importing
    ``torch.utils.flop_counter`` or using ``torch.compile`` imports it. Setting it later raises a RuntimeError
    that says so (instead of the interpreter's "Cannot call @triton.jit'd outside of the scope of a kernel")."""
    if _TRITON:
        return _TRITON
    try:
        import triton
        import triton.language as tl
    except ImportError as err:
        raise ImportError(
            "triton_flash_attention needs the triton package: pip install triton==" + TRITON_VERSION +
            " (the version torch 2.13 pins; wheels for Linux x86_64 only). On a machine without a CUDA GPU, set "
            "TRITON_INTERPRET=1 before triton is imported to run the kernel in triton's interpreter."
        ) from err
    from triton.runtime.jit import JITFunction

    if _triton_interpreting() and isinstance(tl.zeros, JITFunction):
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton had been imported (importing torch.utils.flop_counter or "
            "using torch.compile imports it), so triton.language is built for the GPU compiler and the "
            "interpreter cannot run the kernels: set TRITON_INTERPRET=1 before anything imports triton, "
            "e.g. in the environment of the process or before `import torch`"
        )

    @triton.jit
    def fwd_kernel(Q, K, V, O, LSE, scale, T_Q, T_K, D, causal_offset,
                   stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                   IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   DOT_DTYPE: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :],
                    mask=(rows[:, None] < T_Q) & d_ok[None, :], other=0.0).to(DOT_DTYPE)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = T_K
        if IS_CAUSAL:  # the last query of this tile sees keys up to (pid_m + 1) * BLOCK_M - 1 + causal_offset
            hi = tl.minimum(T_K, (pid_m + 1) * BLOCK_M + causal_offset)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            kt = tl.load(K + bh * stride_kb + cols[None, :] * stride_kt + offs_d[:, None],
                         mask=(cols[None, :] < T_K) & d_ok[:, None], other=0.0).to(DOT_DTYPE)
            s = tl.dot(q, kt, input_precision="ieee") * scale
            ok = (cols[None, :] < T_K) & (rows[:, None] >= 0)
            if IS_CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + causal_offset)
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            vb = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :],
                         mask=(cols[:, None] < T_K) & d_ok[None, :], other=0.0).to(DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), vb, input_precision="ieee")
            m_i = m_new
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(seen, m_i + tl.log(l_safe), float("-inf"))
        tl.store(O + bh * stride_ob + rows[:, None] * stride_ot + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=(rows[:, None] < T_Q) & d_ok[None, :])
        tl.store(LSE + bh * T_Q + rows, lse, mask=rows < T_Q)

    @triton.jit
    def bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, scale, T_Q, T_K, D, causal_offset,
                        stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                        IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
        # one program per tile of keys: loops over the query tiles that can see it (no atomics needed)
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        kv_mask = (cols[:, None] < T_K) & d_ok[None, :]
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo = 0
        if IS_CAUSAL:  # the first query that sees key pid_n * BLOCK_N is i = pid_n * BLOCK_N - causal_offset
            lo = tl.maximum(0, pid_n * BLOCK_N - causal_offset)
            lo = (lo // BLOCK_M) * BLOCK_M
        for start_m in range(lo, T_Q, BLOCK_M):
            rows = start_m + offs_m
            q_mask = (rows[:, None] < T_Q) & d_ok[None, :]
            q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
            do = tl.load(DO + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
            q, do = q.to(DOT_DTYPE), do.to(DOT_DTYPE)
            lse = tl.load(LSE + bh * T_Q + rows, mask=rows < T_Q, other=float("inf"))
            delta = tl.load(DELTA + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            ok = (rows[:, None] < T_Q) & (cols[None, :] < T_K)
            if IS_CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p).to(DOT_DTYPE), do, input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(DOT_DTYPE), q, input_precision="ieee")
        tl.store(DK + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], dv.to(DV.dtype.element_ty),
                 mask=kv_mask)

    @triton.jit
    def bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, scale, T_Q, T_K, D, causal_offset,
                      stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                      IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q_mask = (rows[:, None] < T_Q) & d_ok[None, :]
        q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
        q, do = q.to(DOT_DTYPE), do.to(DOT_DTYPE)
        lse = tl.load(LSE + bh * T_Q + rows, mask=rows < T_Q, other=float("inf"))
        delta = tl.load(DELTA + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = T_K
        if IS_CAUSAL:
            hi = tl.minimum(T_K, (pid_m + 1) * BLOCK_M + causal_offset)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            kv_mask = (cols[:, None] < T_K) & d_ok[None, :]
            k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
            k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            ok = (rows[:, None] < T_Q) & (cols[None, :] < T_K)
            if IS_CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(DOT_DTYPE), k, input_precision="ieee")
        tl.store(DQ + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)

    _TRITON.update(triton=triton, tl=tl, fwd=fwd_kernel, bwd_dkdv=bwd_dkdv_kernel, bwd_dq=bwd_dq_kernel,
                   interpret=_triton_interpreting())
    return _TRITON


def _triton_launch_config(kern, q, block_q, block_k):
    tl = kern["tl"]
    # The interpreter's bf16/fp16 dot is wrong: under it every dot runs in float32.
    dot_dtype = tl.float32 if kern["interpret"] or q.dtype == torch.float32 else {
        torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[q.dtype]
    block_d = max(16, 1 << (q.shape[-1] - 1).bit_length())
    return dict(BLOCK_M=block_q, BLOCK_N=block_k, BLOCK_D=block_d, DOT_DTYPE=dot_dtype)


class _TritonFlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal_offset, block_q, block_k):
        kern = _triton_kernels()
        lead, t_q, t_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
        q3, k3, v3 = (x.reshape(-1, x.shape[-2], d).contiguous() for x in (q, k, v))
        bh = q3.shape[0]
        o3 = torch.empty_like(q3)
        lse = torch.empty(bh, t_q, dtype=torch.float32, device=q.device)
        cfg = _triton_launch_config(kern, q, block_q, block_k)
        grid = (kern["triton"].cdiv(t_q, block_q), bh)
        is_causal = causal_offset is not None
        kern["fwd"][grid](q3, k3, v3, o3, lse, scale, t_q, t_k, d, causal_offset or 0,
                          q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
                          o3.stride(0), o3.stride(1), IS_CAUSAL=is_causal, **cfg)
        ctx.save_for_backward(q3, k3, v3, o3, lse)
        ctx.config = (scale, causal_offset, block_q, block_k, q.shape, k.shape)
        return o3.reshape(*lead, t_q, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        kern = _triton_kernels()
        q3, k3, v3, o3, lse = ctx.saved_tensors
        scale, causal_offset, block_q, block_k, q_shape, k_shape = ctx.config
        bh, t_q, d = q3.shape
        t_k = k3.shape[1]
        do3 = dout.reshape(bh, t_q, d).contiguous()
        delta = (do3.float() * o3.float()).sum(-1)  # rowsum(dO * O), computed once outside the kernels
        dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        cfg = _triton_launch_config(kern, q3, block_q, block_k)
        is_causal = causal_offset is not None
        strides = (q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1))
        cdiv = kern["triton"].cdiv
        kern["bwd_dkdv"][(cdiv(t_k, block_k), bh)](q3, k3, v3, do3, lse, delta, dk, dv, scale, t_q, t_k, d,
                                                   causal_offset or 0, *strides, IS_CAUSAL=is_causal, **cfg)
        kern["bwd_dq"][(cdiv(t_q, block_q), bh)](q3, k3, v3, do3, lse, delta, dq, scale, t_q, t_k, d,
                                                 causal_offset or 0, *strides, IS_CAUSAL=is_causal, **cfg)
        return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(k_shape), None, None, None, None


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                           scale: float | None = None, *, causal_offset: int = 0, block_q: int | None = None,
                           block_k: int | None = None) -> torch.Tensor:
    """:func:`flash_attention` as Triton kernels: the forward and both backward passes (FlashAttention-2).

    Book: Efficient attention, "GPU paths".

    Shapes: ``q, k, v (..., T, d)`` with equal leading dimensions (``t_q`` and ``t_k`` may differ; ``v`` has
    the same ``d``) -> ``(..., t_q, d)``; float16, bfloat16 or float32. ``is_causal`` and ``causal_offset`` as
    in :func:`flash_attention`. One program per tile of ``block_q`` queries (default 64; 32 in the interpreter)
    walks the key tiles of ``block_k`` with the online softmax and stores the output and row logsumexp; the
    backward has one kernel per key tile (``dK, dV``) and one per query tile (``dQ``), so no atomics.
    Accumulation is in float32; float32 inputs use exact ("ieee") dot products, not TF32.

    Needs ``triton`` (``pip install triton==3.7.1``) and either a CUDA GPU or ``TRITON_INTERPRET=1`` set before
    triton is first imported, e.g. before ``import torch`` (triton's interpreter runs the same kernels on CPU
    tensors, slowly; every dot in float32).
    """
    _check_qkv(q, k, v)
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"q has shape {shape_str(q.shape)} but v has shape {shape_str(v.shape)}: "
                         "triton_flash_attention needs d_v == d_k")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"triton_flash_attention supports float16, bfloat16 and float32, got {q.dtype}")
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, int):
        raise ValueError(f"causal_offset must be an integer, got {causal_offset!r}")
    kern = _triton_kernels()
    if q.device.type != "cuda" and not kern["interpret"]:
        raise RuntimeError(
            f"q is on {q.device}: triton_flash_attention runs on a CUDA GPU; to run it on CPU tensors set "
            "TRITON_INTERPRET=1 in the environment before triton is imported (slow, for testing)"
        )
    default = 32 if kern["interpret"] else 64
    block_q, block_k = block_q or default, block_k or default
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name}={b} must be a power of two >= 16 (tl.dot and tl.arange need it)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _TritonFlashAttentionFunction.apply(q, k, v, scale, causal_offset if is_causal else None, block_q, block_k)


# --- GPU paths: FlexAttention -----------------------------------------------------------------------------


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


_FLEX_COMPILED = {}


def flex_attention_with(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_mod=None, score_mod=None,
                        scale: float | None = None, compile: bool | None = None) -> torch.Tensor:
    """``torch.nn.attention.flex_attention`` with a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = may
    attend) and a ``score_mod(score, b, h, q_idx, kv_idx) -> score``.

    Book: Efficient attention, "GPU paths".

    Shapes: ``q (B, H, t_q, d)``, ``k, v (B, H_kv, t_k, d)`` with ``H`` a multiple of ``H_kv`` -> ``(B, H, t_q, d)``.
    The ``mask_mod`` becomes a block mask (``create_block_mask``), so tiles it hides entirely are skipped by the
    fused kernel. ``compile`` (default: True on CUDA, False elsewhere) runs ``torch.compile(flex_attention)``;
    uncompiled, torch evaluates the same definition densely (``O(T^2)`` memory), which is what CPU tests use.
    Torch 2.13 has no FlexAttention backward on CPU: inputs that require grad raise there.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

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
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, b, h, t_q, k.shape[-2], device=q.device)
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


# --- GPU paths: the dispatcher ----------------------------------------------------------------------------

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
