"""The per-layer and per-model key/value caches used by ``llmarch.model.GPT`` and
``llmarch.attention.MultiHeadAttention`` for incremental decoding: each step feeds only the new tokens and
attends over the keys and values the cache holds. :class:`LayerKVCache` keeps every key; :class:`RollingKVCache`
keeps at most ``window`` of them (Mistral's rolling buffer), the first ``sinks`` of which stay forever
(StreamingLLM's attention sinks).

Book: Decoding, "The KV cache". Book: Efficient attention, "The KV cache". Book: From GPT-2 to Llama 3,
"After Llama 3".

Shapes are ``(B, H_kv, T, d_head)`` per layer; a cache holds the *rotated* keys when the model uses RoPE, so a
cached key never needs to be rotated again: every key keeps the rotation of its original position.
"""

from __future__ import annotations

import torch

from llmarch._checks import check_tensor, shape_str

__all__ = ["LayerKVCache", "RollingKVCache", "KVCache", "window_sink_mask"]


def window_sink_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int,
                     sinks: int = 0) -> torch.Tensor:
    """Boolean ``(T_q, T_k)`` mask (True = may attend) of a sliding window with attention sinks.

    Book: From GPT-2 to Llama 3, "After Llama 3".

    Query position ``i`` sees key position ``j`` iff ``j <= i`` and (``j < sinks`` or ``i - j < window - sinks``):
    the first ``sinks`` tokens of the sequence and the last ``window - sinks`` tokens up to itself, at most
    ``window`` keys. ``sinks = 0`` is Mistral's window (``0 <= i - j < window``).
    """
    i, j = query_positions[:, None], key_positions[None, :]
    return (j <= i) & ((j < sinks) | (i - j < window - sinks))


class LayerKVCache:
    """Keys and values ``(B, H_kv, T_past, d_head)`` of one attention layer for the tokens seen so far."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Number of tokens seen, which is also the position of the next one."""
        return 0 if self.k is None else self.k.shape[-2]

    @property
    def held(self) -> int:
        """Number of keys (and values) the cache holds: every token seen."""
        return 0 if self.k is None else self.k.shape[-2]

    def key_positions(self, t_new: int, device=None) -> torch.Tensor:
        """Positions ``(T_k,)`` of the keys :meth:`update` returns when ``t_new`` tokens are added: all of them."""
        return torch.arange(self.length + t_new, device=device)

    def _check(self, k: torch.Tensor, v: torch.Tensor) -> None:
        check_tensor("k", k, dims=4)
        check_tensor("v", v, dims=4)
        if self.k is not None and (k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1]):
            raise ValueError(f"k has shape {shape_str(k.shape)} but the cache holds {shape_str(self.k.shape)}")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' ``k, v (B, H_kv, T_new, d_head)``; return all keys and values so far."""
        self._check(k, v)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v


class RollingKVCache(LayerKVCache):
    """A cache that holds at most ``window`` keys and values of one layer: the first ``sinks`` tokens of the
    sequence (attention sinks, Xiao et al., 2023) and the last ``window - sinks`` tokens.

    Book: From GPT-2 to Llama 3, "After Llama 3".

    Each key keeps the rotation of its original position (Mistral's rolling buffer; Jiang et al., 2023), so
    a model with this cache computes exactly what the full-cache model computes under :func:`window_sink_mask`.
    (StreamingLLM instead caches keys unrotated and gives them their slot in the cache as position, so that
    distances never exceed ``window``; that changes the logits and is not what this class does.) Keys are held
    in position order; Mistral writes token ``i`` to slot ``i mod window`` instead, which holds the same set.
    :meth:`update` returns the held keys followed by the new ones (``held + T_new`` of them: a prompt longer
    than the window needs keys it then drops), and keeps only those the next token can see.
    """

    def __init__(self, window: int, sinks: int = 0):
        super().__init__()
        if not 0 <= sinks < window:
            raise ValueError(f"a rolling cache needs 0 <= sinks < window, got window={window}, sinks={sinks}")
        self.window, self.sinks = window, sinks
        self.seen = 0
        self.positions = torch.zeros(0, dtype=torch.long)  # of the held keys, increasing

    @property
    def length(self) -> int:
        return self.seen

    def key_positions(self, t_new: int, device=None) -> torch.Tensor:
        """Positions ``(held + t_new,)`` of the keys :meth:`update` returns: the held ones, then the new ones."""
        new = torch.arange(self.seen, self.seen + t_new, device=self.positions.device)
        return torch.cat([self.positions, new]).to(device)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' ``k, v (B, H_kv, T_new, d_head)``; return the held keys and values followed by the
        new ones, then keep the sinks and the last ``window - sinks`` tokens (at most ``window``)."""
        self._check(k, v)
        positions = self.key_positions(k.shape[-2])
        all_k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        all_v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        self.seen += k.shape[-2]
        keep = (positions < self.sinks) | (positions >= self.seen - (self.window - self.sinks))
        self.positions = positions[keep]
        index = keep.nonzero().flatten().to(k.device)
        self.k, self.v = all_k.index_select(-2, index), all_v.index_select(-2, index)
        return all_k, all_v


class KVCache:
    """One cache per layer of a model: ``GPT.forward(idx, kv_cache=cache)`` feeds only the new tokens and reuses
    what the cache holds, so a decoding step costs O(T) instead of O(T^2). With ``window``, each layer is a
    :class:`RollingKVCache` that holds at most ``window`` keys (``sinks`` of them the first tokens): the cache
    of a model with ``GPTConfig(sliding_window=window, attention_sinks=sinks)`` (``GPT.new_kv_cache()``)."""

    def __init__(self, n_layers: int, window: int | None = None, sinks: int = 0):
        self.window, self.sinks = window, sinks
        if window is None and sinks:
            raise ValueError(f"sinks={sinks} needs a window: attention sinks are kept by a rolling cache")
        self.layers = [LayerKVCache() if window is None else RollingKVCache(window, sinks) for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Number of tokens seen (the position of the next one)."""
        return self.layers[0].length

    @property
    def held(self) -> int:
        """Number of keys each layer holds: ``length`` for a full cache, at most ``window`` for a rolling one."""
        return self.layers[0].held

    def nbytes(self) -> int:
        """Bytes of the keys and values held in every layer."""
        return sum(t.nbytes for layer in self.layers for t in (layer.k, layer.v) if t is not None)
