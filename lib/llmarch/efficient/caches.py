"""Key/value caches for inference: grouped-query sharing (``repeat_kv``), the size of a KV cache, and the
paged cache of vLLM with attention that reads it block by block. The model's contiguous cache is
:mod:`llmarch.kv_cache`.

Book: Efficient attention, "The KV cache", and "Paged attention".
"""

from __future__ import annotations

import math

import torch

from llmarch._checks import check_tensor, shape_str
from llmarch.efficient._validation import _check_int
from llmarch.efficient.flash import _finish, _online_softmax_step

__all__ = ["repeat_kv", "kv_cache_bytes", "PagedKVCache", "paged_attention"]


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
