"""Sparse attention patterns as boolean ``(T, T)`` masks (True = may attend): sliding, dilated, strided,
fixed, global+local, BigBird and permuted-block patterns, and blockwise attention, which computes only the
blocks of scores a permuted-block pattern keeps.

Book: Efficient attention, "Sparse attention patterns".
"""

from __future__ import annotations

import math

import torch

from llmarch._checks import shape_str
from llmarch.efficient._validation import _check_int, _check_qkv

__all__ = [
    "sliding_window_mask",
    "dilated_window_mask",
    "strided_mask",
    "fixed_mask",
    "global_local_mask",
    "bigbird_mask",
    "block_permutation_mask",
    "blockwise_attention",
]


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
