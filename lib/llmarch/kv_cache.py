"""The per-layer and per-model key/value cache used by ``llmarch.model.GPT`` and
``llmarch.attention.MultiHeadAttention`` for incremental decoding: each step feeds only the new tokens and
attends over the keys and values the cache holds.

Book: Decoding, "The KV cache". Book: Efficient attention, "The KV cache".

Shapes are ``(B, H_kv, T, d_head)`` per layer; a cache holds the *rotated* keys when the model uses RoPE, so a
cached key never needs to be rotated again.
"""

from __future__ import annotations

import torch

from llmarch._checks import check_tensor, shape_str

__all__ = ["LayerKVCache", "KVCache"]


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
