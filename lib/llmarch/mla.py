"""Multi-head latent attention (MLA; DeepSeek-V2, 2024, and DeepSeek-V3): keys and values compressed into one
latent vector per token, which is all the KV cache holds.

Book: From GPT-2 to Llama 3, "After Llama 3" (multi-head latent attention).

For token ``x`` (``r = kv_lora_rank``, ``d_n = qk_nope_head_dim``, ``d_r = qk_rope_head_dim``, ``d_v = v_head_dim``):

- queries: ``q = W_qb RMSNorm(W_qa x)`` (low rank ``q_lora_rank``; or ``q = W_q x`` without it), split per head
  into ``q_n (d_n)`` and ``q_r (d_r)``;
- latent: ``[c ; k_r] = W_kva x``, ``c = RMSNorm(c) (r)``; ``k_r (d_r)`` is one RoPE key shared by every head;
- per head: ``k_n = W_uk^h c``, ``v = W_uv^h c`` (the rows of ``W_kvb``), and
  ``score = (q_n . k_n + RoPE(q_r) . RoPE(k_r)) / sqrt(d_n + d_r)``.

The cache holds ``c`` and the rotated ``k_r``: ``r + d_r`` numbers per token and layer (576 in DeepSeek-V3,
against ``2 * n_kv_heads * d_head = 2048`` for Llama 3 8B's GQA; :func:`kv_cache_numbers_per_token`).
Absorption: ``q_n . (W_uk^h c) = ((W_uk^h)^T q_n) . c`` and ``W_o^h W_uv^h sum_s a_s c_s``, so decoding can
attend over the cached latents directly, with ``W_uk`` folded into the query and ``W_uv`` into the output
projection, never forming per-head keys and values (``MultiHeadLatentAttention.absorb = True``); the result is
the same to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.positional import RotaryEmbedding
from llmarch.reference_attention import causal_mask, scaled_dot_product_attention

__all__ = ["MLAConfig", "MultiHeadLatentAttention", "kv_cache_numbers_per_token", "cached_numbers_per_token"]


@dataclass
class MLAConfig:
    """The latent attention of a :class:`llmarch.model.GPTConfig` (``GPTConfig(mla=...)``), with DeepSeek's
    names: ``kv_lora_rank`` (the cached latent), ``q_lora_rank`` (``None``: a full-rank query projection),
    ``qk_nope_head_dim``, ``qk_rope_head_dim`` (the decoupled RoPE part, shared by the heads for keys),
    ``v_head_dim``; ``rope_interleave`` pairs RoPE features ``(2i, 2i+1)`` (DeepSeek's checkpoints) rather than
    ``(i, i + d_r/2)``; ``latent_norm_eps`` is the eps of the two latent RMSNorms (1e-6 in transformers)."""

    kv_lora_rank: int
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    rope_interleave: bool = True
    latent_norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"MLAConfig.{name} must be positive, got {getattr(self, name)}")
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise ValueError(f"MLAConfig.q_lora_rank must be None or positive, got {self.q_lora_rank}")
        if self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
            raise ValueError(f"MLAConfig.qk_rope_head_dim must be even and >= 2, got {self.qk_rope_head_dim}")


class MultiHeadLatentAttention(nn.Module):
    """MLA self-attention (see the module docstring), called like :class:`llmarch.attention.MultiHeadAttention`.

    Submodules (transformers' names): ``q_proj`` or ``q_a_proj``/``q_a_norm``/``q_b_proj``; ``kv_a_proj``
    (``d_model -> r + d_r``), ``kv_a_norm``, ``kv_b_proj`` (``r -> n_heads * (d_n + d_v)``, per head the rows of
    ``W_uk`` then ``W_uv``), ``o_proj`` (``n_heads * d_v -> d_model``); ``rotary`` (RoPE on ``d_r`` features).
    ``bias``: biases of ``q_a_proj``, ``kv_a_proj`` and ``o_proj`` (DeepSeek's ``attention_bias``). The softmax
    scale is ``(d_n + d_r)^-0.5``, times ``m^2`` under YaRN scaling with ``mscale_all_dim`` (``m = 0.1
    mscale_all_dim ln(factor) + 1``), as DeepSeek does. A ``kv_cache`` (``llmarch.kv_cache.LayerKVCache``) stores
    the latent ``c (B, 1, T, r)`` as its keys and the rotated ``k_r (B, 1, T, d_r)`` as its values. It always
    uses the reference attention (:func:`llmarch.reference_attention.scaled_dot_product_attention`), without
    attention dropout.
    """

    def __init__(self, d_model: int, n_heads: int, config: MLAConfig, rope_base: float = 10000.0,
                 rope_scaling: dict | None = None, max_position_embeddings: int | None = None, bias: bool = False):
        super().__init__()
        self.d_model, self.n_heads, self.config = d_model, n_heads, config
        c = config
        d_qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * d_qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, c.q_lora_rank, bias=bias)
            self.q_a_norm = nn.RMSNorm(c.q_lora_rank, eps=c.latent_norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, n_heads * d_qk, bias=False)
        self.kv_a_proj = nn.Linear(d_model, c.kv_lora_rank + c.qk_rope_head_dim, bias=bias)
        self.kv_a_norm = nn.RMSNorm(c.kv_lora_rank, eps=c.latent_norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, n_heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * c.v_head_dim, d_model, bias=bias)
        self.rotary = RotaryEmbedding(c.qk_rope_head_dim, base=rope_base, interleaved=c.rope_interleave,
                                      scaling=rope_scaling, max_position_embeddings=max_position_embeddings)
        self.scale = d_qk**-0.5
        scaling = self.rotary.scaling or {}
        if scaling.get("mscale_all_dim"):
            self.scale *= (0.1 * scaling["mscale_all_dim"] * math.log(scaling["factor"]) + 1.0) ** 2
        self.absorb = False

    def queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (B, T, d_model)`` -> ``q_n (B, H, T, d_n)`` and ``q_r (B, H, T, d_r)`` (not yet rotated)."""
        q = self.q_proj(x) if self.config.q_lora_rank is None else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        q = q.view(*x.shape[:2], self.n_heads, -1).transpose(1, 2)
        return q.split([self.config.qk_nope_head_dim, self.config.qk_rope_head_dim], dim=-1)

    def latents(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (B, T, d_model)`` -> what the cache holds: ``c (B, 1, T, r)`` and ``k_r (B, 1, T, d_r)`` (not yet
        rotated)."""
        c, k_r = self.kv_a_proj(x).split([self.config.kv_lora_rank, self.config.qk_rope_head_dim], dim=-1)
        return self.kv_a_norm(c)[:, None], k_r[:, None]

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_uk (H, d_n, r)`` and ``W_uv (H, d_v, r)``, views of ``kv_b_proj.weight``."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.config.qk_nope_head_dim + self.config.v_head_dim, -1)
        return w.split([self.config.qk_nope_head_dim, self.config.v_head_dim], dim=1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
                bias: torch.Tensor | None = None, positions: torch.Tensor | None = None, kv_cache=None):
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``. ``mask`` (boolean, True = may attend) broadcasts to
        ``(B, H, T, T_k)``; with ``is_causal`` and a cache the new queries are the last positions; ``positions``
        default to ``past .. past + T - 1``; ``bias`` must be None (MLA's positions are its RoPE)."""
        check_tensor("x", x, dims=3, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {shape_str(x.shape)} but d_model is {self.d_model}")
        if bias is not None:
            raise ValueError("multi-head latent attention takes no additive position bias: its positions are RoPE")
        past = 0 if kv_cache is None else kv_cache.length
        q_n, q_r = self.queries(x)
        c, k_r = self.latents(x)
        key = None
        if positions is None:
            positions, key = torch.arange(past, past + x.shape[1], device=x.device), (past, past + x.shape[1])
        q_r, k_r = self.rotary.rotate(q_r, k_r, positions, key=key)
        if kv_cache is not None:
            c, k_r = kv_cache.update(c, k_r)
        t_q, t_k = x.shape[1], c.shape[-2]
        if is_causal and t_q != t_k:  # queries at the end: query i is position t_k - t_q + i
            tri = causal_mask(t_q, t_k, offset=t_k - t_q, device=x.device)
            mask, is_causal = (tri if mask is None else mask & tri), False
        if mask is not None and mask.dim() == 3:  # (B, T_q, T_k): the same mask for every head
            mask = mask.unsqueeze(1)
        w_uk, w_uv = self.up_projections()
        if self.absorb:
            return self._absorbed(q_n, q_r, c, k_r, w_uk, w_uv, mask, is_causal)
        k_n, v = (torch.einsum("bxtr,hdr->bhtd", c, w) for w in (w_uk, w_uv))
        k = torch.cat([k_n, k_r.expand(-1, self.n_heads, -1, -1)], dim=-1)
        heads = scaled_dot_product_attention(torch.cat([q_n, q_r], dim=-1), k, v, mask=mask, is_causal=is_causal,
                                             scale=self.scale)
        return self.o_proj(heads.transpose(1, 2).reshape(*x.shape[:2], -1))

    def _absorbed(self, q_n, q_r, c, k_r, w_uk, w_uv, mask, is_causal):
        """Attention over the latents: query ``[(W_uk^h)^T q_n ; q_r]`` against the one-head keys ``[c ; k_r]``,
        values ``c``; then ``W_o^h W_uv^h`` maps each head's latent mixture to the output."""
        q_latent = torch.einsum("bhtd,hdr->bhtr", q_n, w_uk)
        mixed = scaled_dot_product_attention(torch.cat([q_latent, q_r], dim=-1), torch.cat([c, k_r], dim=-1), c,
                                             mask=mask, is_causal=is_causal, scale=self.scale)  # (B, H, T, r)
        w_o = self.o_proj.weight.view(self.d_model, self.n_heads, self.config.v_head_dim)
        w_out = torch.einsum("mhd,hdr->mhr", w_o, w_uv).reshape(self.d_model, -1)  # (d_model, H * r)
        b, _, t, _ = mixed.shape
        return nn.functional.linear(mixed.transpose(1, 2).reshape(b, t, -1), w_out, self.o_proj.bias)


def kv_cache_numbers_per_token(config) -> int:
    """Numbers one layer caches per token for a :class:`llmarch.model.GPTConfig`: ``kv_lora_rank +
    qk_rope_head_dim`` with MLA, else ``2 * n_kv_heads * d_head`` (keys and values; MHA, GQA, MQA).

    >>> from llmarch.model import llama_config
    >>> kv_cache_numbers_per_token(llama_config("llama-3-8b"))
    2048
    """
    if getattr(config, "mla", None) is not None:
        return config.mla.kv_lora_rank + config.mla.qk_rope_head_dim
    return 2 * (config.n_kv_heads or config.n_heads) * config.d_head


def cached_numbers_per_token(kv_cache) -> float:
    """Numbers a filled ``llmarch.kv_cache.KVCache`` holds per token, row and layer, measured from its tensors."""
    layers = [layer for layer in kv_cache.layers if layer.k is not None]
    if not layers:
        raise ValueError("the cache is empty: run the model with it first")
    numbers = sum(t.numel() for layer in layers for t in (layer.k, layer.v))
    batch, tokens = layers[0].k.shape[0], layers[0].k.shape[-2]
    return numbers / (batch * tokens * len(layers))
