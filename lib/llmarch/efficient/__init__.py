"""Efficient attention and inference, and the memory arithmetic that motivates them.

Book: Efficient attention (``book/efficient-attention.md``).

Modules (everything public is re-exported here, so ``from llmarch.efficient import X`` works for all of them):

- :mod:`~llmarch.efficient.masks`: sparse attention patterns as boolean masks, and blockwise attention;
- :mod:`~llmarch.efficient.lowrank`: low-rank attention (Linformer);
- :mod:`~llmarch.efficient.caches`: ``repeat_kv``, the size of a KV cache, the paged cache and paged attention;
- :mod:`~llmarch.efficient.flash`: FlashAttention in pure torch, and the memory of standard attention;
- :mod:`~llmarch.efficient.triton_flash`: FlashAttention as Triton kernels (optional dependency);
- :mod:`~llmarch.efficient.flex`: FlexAttention ``mask_mod`` / ``score_mod`` helpers and ``flex_*`` functions;
- :mod:`~llmarch.efficient.dispatch`: ``attention(..., backend=...)`` and ``select_backend``.

The model's caches, ``KVCache``, ``LayerKVCache`` and the rolling ``RollingKVCache`` (sliding window and attention
sinks), live in :mod:`llmarch.kv_cache` and are
re-exported here.

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

from llmarch.efficient.caches import PagedKVCache, kv_cache_bytes, paged_attention, repeat_kv
from llmarch.efficient.dispatch import BACKENDS, MODEL_BACKENDS, attention, choose_backend, select_backend
from llmarch.efficient.flash import _tiles, attention_memory_bytes, flash_attention  # _tiles: used by the book
from llmarch.efficient.flex import (
    alibi_score_mod,
    build_block_mask,
    kerple_score_mod,
    causal_mask_mod,
    dense_bias_score_mod,
    dense_mask_mod,
    flex_alibi,
    flex_attention_with,
    flex_sliding_window,
    flex_t5,
    sliding_window_mask_mod,
    t5_score_mod,
)
from llmarch.efficient.lowrank import LinformerSelfAttention
from llmarch.efficient.masks import (
    bigbird_mask,
    block_permutation_mask,
    blockwise_attention,
    dilated_window_mask,
    fixed_mask,
    global_local_mask,
    sliding_window_mask,
    strided_mask,
)
from llmarch.efficient.triton_flash import TRITON_VERSION, triton_flash_attention
from llmarch.kv_cache import KVCache, LayerKVCache, RollingKVCache, window_sink_mask

__all__ = [
    "LayerKVCache",
    "RollingKVCache",
    "window_sink_mask",
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
    "dense_bias_score_mod",
    "alibi_score_mod",
    "kerple_score_mod",
    "t5_score_mod",
    "build_block_mask",
    "flex_attention_with",
    "flex_sliding_window",
    "flex_alibi",
    "flex_t5",
    "BACKENDS",
    "MODEL_BACKENDS",
    "choose_backend",
    "select_backend",
    "attention",
]

# doctest.testmod(llmarch.efficient) only collects objects defined in this module itself; list the re-exported
# functions and classes so that it still runs their docstring examples (tests/test_efficient_attention.py).
__test__ = {name: obj for name, obj in globals().items()
            if name in __all__ and (isinstance(obj, type) or callable(obj)) and getattr(obj, "__doc__", None)}
