"""Softmax, attention masks, scaled dot-product attention and multi-head attention.

Book: Attention (``book/attention.md``).

Conventions (DESIGN.md): tensors are laid out ``(batch..., seq, features)``; per-head tensors are
``(B, H, T, d_head)``; a boolean mask holds **True where a query may attend to a key** (the convention
of ``torch.nn.functional.scaled_dot_product_attention``); an additive mask holds 0 and -inf.

The reference functions live in :mod:`llmarch.reference_attention` and are re-exported here; the kernels of
the other attention backends (``llmarch.efficient``) sit between them and ``MultiHeadAttention``:
``reference_attention -> efficient -> attention``, with no cycle.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.efficient.dispatch import MODEL_BACKENDS, attention, select_backend
from llmarch.positional import POS_ENCODINGS, ALiBi, KerpleBias, RotaryEmbedding, T5RelativeBias
from llmarch.reference_attention import causal_mask, scaled_dot_product_attention, softmax, to_additive_mask
from llmarch.stability import soft_cap

__all__ = [
    "softmax",
    "causal_mask",
    "to_additive_mask",
    "scaled_dot_product_attention",
    "MultiHeadAttention",
    "multi_head_attention_additive",
    "softcapped_attention",
    "set_attention_backend",
    "attention_backend",
]

# doctest.testmod(llmarch.attention) only collects objects defined here: list the re-exported functions too.
__test__ = {f.__name__: f for f in (softmax, causal_mask, to_additive_mask, scaled_dot_product_attention)}


class MultiHeadAttention(nn.Module):
    """Multi-head attention in the "concatenate, then project" form of Vaswani et al. (2017).

    Book: Attention, "Multi-head attention".

    ``head_h = Attention(x W_Q^h, c W_K^h, c W_V^h)``, ``MHA(x, c) = concat(head_1..head_H) W_O``, where
    ``c = x`` for self-attention and ``c = context`` for cross-attention. With ``n_kv_heads < n_heads``
    (grouped-query attention; ``n_kv_heads=1`` is multi-query attention) each key/value head is shared by
    ``n_heads / n_kv_heads`` consecutive query heads.

    Submodules (``nn.Linear``): ``q_proj (d_model -> n_heads*d_head)``, ``k_proj`` and ``v_proj``
    (``d_context -> n_kv_heads*d_head``), ``o_proj (n_heads*d_head -> d_model)``.

    ``pos_encoding`` (one of ``llmarch.positional.POS_ENCODINGS``) acts inside self-attention only for the
    relative schemes: ``rope`` rotates q and k (never v), ``alibi``, ``t5`` and ``kerple`` add a bias to the
    scores (``t5`` and ``kerple`` with their own learned parameters, ``relative_bias``; ``kerple_variant`` is
    ``log`` or ``power``). ``none``, ``learned`` and ``sinusoidal`` change
    nothing here: absolute encodings are added to the input embeddings (see ``llmarch.model.GPT``).
    RoPE is ``rotary`` (a ``llmarch.positional.RotaryEmbedding``: layout, partial rotation, scaling); by
    default the full, interleaved, unscaled rotation with base ``rope_base``.

    ``backend`` picks the attention kernel (``llmarch.efficient.attention``): ``"reference"`` (default) is
    :func:`scaled_dot_product_attention` and the only one that returns the weights; ``"sdpa"``, ``"flash"``,
    ``"triton"``, ``"flex"`` and ``"auto"`` compute the same result without forming them (SDPA and Flex share
    key/value heads without repeating them). A mask, a bias or attention dropout that a backend cannot take
    raises an error that names the backends that can. Change it later with :func:`set_attention_backend`.

    Later families: ``d_head`` need not be ``d_model / n_heads`` (Qwen3, Gemma, Mistral-Nemo); ``out_bias`` is
    ``o_proj``'s bias (default ``bias``; Qwen2 has q, k, v biases and none on ``o_proj``); ``scale`` replaces
    ``1/sqrt(d_head)`` (Gemma: ``query_pre_attn_scalar^-1/2``); ``softcap`` soft-caps the scores before the mask,
    ``cap * tanh(s / cap)`` (Gemma 2, :func:`softcapped_attention`; reference backend only). ``qk_norm`` is
    ``"head"`` (``True``; Qwen3, Gemma 3: each head's q and k normalised over its ``d_head`` features, before
    RoPE) or ``"projection"`` (OLMo 2: the whole q and k projections, all heads together, before the split);
    ``qk_norm_kind`` is ``rmsnorm`` or Gemma's ``rmsnorm_offset`` (see ``llmarch.layers.make_norm``).

    ``last_backend`` names the kernel the last forward pass used (what ``"auto"`` chose: see
    ``llmarch.efficient.choose_backend``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        d_head: int | None = None,
        d_context: int | None = None,
        dropout: float = 0.0,
        pos_encoding: str = "none",
        rope_base: float = 10000.0,
        t5_num_buckets: int = 32,
        t5_max_distance: int = 128,
        rotary: RotaryEmbedding | None = None,
        kerple_variant: str = "log",
        qk_norm: bool | str = False,
        qk_norm_eps: float = 1e-6,
        backend: str = "reference",
        out_bias: bool | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        qk_norm_kind: str = "rmsnorm",
    ):
        super().__init__()
        _check_backend(backend)
        self.backend = backend
        self.last_backend: str | None = None  # the kernel the last forward used ("auto" resolved)
        if pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"pos_encoding must be one of {POS_ENCODINGS}, got {pos_encoding!r}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a positive multiple of n_kv_heads={n_kv_heads}")
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head")
            d_head = d_model // n_heads
        d_context = d_model if d_context is None else d_context
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, n_kv_heads, d_head
        self.d_context = d_context
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.k_proj = nn.Linear(d_context, n_kv_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(d_context, n_kv_heads * d_head, bias=bias)
        self.o_proj = nn.Linear(n_heads * d_head, d_model, bias=bias if out_bias is None else out_bias)
        self.scale, self.softcap = scale, softcap
        if softcap is not None and not softcap > 0:
            raise ValueError(f"softcap must be positive or None, got {softcap!r}")
        self.dropout = nn.Dropout(dropout)
        self.pos_encoding, self.rope_base = pos_encoding, rope_base
        self.rotary = None
        if pos_encoding == "rope":
            self.rotary = RotaryEmbedding(d_head, base=rope_base) if rotary is None else rotary
            if self.rotary.d_head != d_head:
                raise ValueError(f"rotary is built for d_head={self.rotary.d_head} but the heads have d_head={d_head}")
        self.relative_bias = None
        if pos_encoding == "t5":
            self.relative_bias = T5RelativeBias(n_heads, t5_num_buckets, t5_max_distance)
        elif pos_encoding == "kerple":
            self.relative_bias = KerpleBias(n_heads, kerple_variant)
        # QK-norm (Dehghani et al., 2023; Gemma 3, Qwen3): RMSNorm of each head's query and key, before RoPE,
        # which bounds the attention logits by |g_q| |g_k| sqrt(d_head) whatever the weights grow to. OLMo 2
        # normalises the whole projections instead: a head's q may then be large if the others' are small.
        self.qk_norm = {True: "head", False: None}.get(qk_norm, qk_norm)
        if self.qk_norm not in (None, "head", "projection"):
            raise ValueError(f"qk_norm must be False, True/'head' or 'projection', got {qk_norm!r}")
        self.q_norm = self.k_norm = None
        if self.qk_norm is not None:
            from llmarch.layers import make_norm  # llmarch.layers imports this module

            per_head = self.qk_norm == "head"
            self.q_norm = make_norm(qk_norm_kind, d_head if per_head else n_heads * d_head, qk_norm_eps)
            self.k_norm = make_norm(qk_norm_kind, d_head if per_head else n_kv_heads * d_head, qk_norm_eps)
        self.alibi = ALiBi(n_heads) if pos_encoding == "alibi" else None

    def split_heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        """``(B, T, n_heads * d_head) -> (B, n_heads, T, d_head)``."""
        b, t, _ = x.shape
        return x.view(b, t, n_heads, self.d_head).transpose(1, 2)

    def project_qkv(self, x: torch.Tensor, context: torch.Tensor | None = None):
        """Per-head queries ``(B, H, T_q, d_head)`` and keys/values ``(B, H_kv, T_k, d_head)``."""
        check_tensor("x", x, dims=3, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {shape_str(x.shape)} but d_model is {self.d_model}: expected (B, T, {self.d_model})")
        context = x if context is None else context
        check_tensor("context", context, dims=3, floating=True)
        if context.shape[-1] != self.d_context or context.shape[0] != x.shape[0]:
            raise ValueError(
                f"context has shape {shape_str(context.shape)} but x has shape {shape_str(x.shape)}: "
                f"expected ({x.shape[0]}, T_context, {self.d_context})"
            )
        q, k = self.q_proj(x), self.k_proj(context)
        if self.qk_norm == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.split_heads(q, self.n_heads), self.split_heads(k, self.n_kv_heads)
        v = self.split_heads(self.v_proj(context), self.n_kv_heads)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def rotate_qk(self, q, k, positions=None, past: int = 0):
        """RoPE (when ``pos_encoding == "rope"``) on per-head q, k ``(B, H, T_new, d_head)`` of the new tokens, at
        ``positions``: ``(T_new,)`` for every row, or ``(B, T_new)`` per row (default ``past .. past + T_new - 1``);
        other encodings return q, k unchanged."""
        if self.pos_encoding != "rope":
            return q, k
        seq_len = key = None  # known without reading the positions back from the device
        if positions is None:
            positions = torch.arange(past, past + q.shape[-2], device=q.device)
            seq_len = key = past + q.shape[-2]  # the table of positions past..seq_len-1, shared by the layers
        batch, t_new = q.shape[0], q.shape[-2]
        if tuple(positions.shape) not in ((t_new,), (batch, t_new)):
            raise ValueError(f"positions has shape {shape_str(positions.shape)}: expected ({t_new},) for every row "
                             f"or ({batch}, {t_new}) for each row of the batch")
        if positions.dim() == 2:
            positions = positions[:, None, :]  # (B, 1, T): the same positions for every head of a row
        return self.rotary.rotate(q, k, positions, seq_len, key=None if key is None else (past, key))

    def position_bias(self, t_q: int, t_k: int, bias=None, like: torch.Tensor | None = None):
        """Add ALiBi's, T5's or KERPLE's bias ``(H, t_q, t_k)`` to ``bias``; queries are the last ``t_q`` of
        the ``t_k`` positions. Other encodings return ``bias`` unchanged."""
        if self.pos_encoding not in ("alibi", "t5", "kerple"):
            return bias
        extra = self.alibi(t_q, t_k) if self.pos_encoding == "alibi" else self.relative_bias(t_q, t_k)
        if like is not None:  # half precision keeps the bias in float32, as the scores are
            extra = extra.to(device=like.device, dtype=torch.promote_types(like.dtype, torch.float32))
        return extra if bias is None else bias + extra

    def attend(self, q, k, v, mask=None, bias=None, is_causal=False, return_weights=False):
        """Attention of per-head q ``(B, H, T_q, d)`` over k, v ``(B, H_kv, T_k, d)``; key/value heads
        are repeated for grouped-query attention. Returns ``(B, H, T_q, d)`` (and weights)."""
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if mask is not None and mask.dim() == 3:  # (B, T_q, T_k): the same mask for every head
            mask = mask.unsqueeze(1)
        if self.softcap is not None:
            out, weights = softcapped_attention(q, k, v, self.softcap, mask=mask, bias=bias, is_causal=is_causal,
                                                scale=self.scale)
        else:
            out, weights = scaled_dot_product_attention(
                q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=self.scale, return_weights=True
            )
        if self.training and self.dropout.p > 0:
            weights = self.dropout(weights)
            out = torch.matmul(weights, v)
        return out, weights

    def attend_fast(self, q, k, v, mask=None, bias=None, is_causal=False):
        """:meth:`attend` through ``self.backend`` (:func:`llmarch.efficient.attention`): key/value heads are
        shared, not repeated, where the kernel allows it; with ``is_causal`` the queries are the last ``T_q`` of
        the ``T_k`` positions (bottom-right causal mask, as in cached decoding); an additive (float) mask joins
        the bias. Returns ``(B, H, T_q, d)``."""
        if self.softcap is not None:
            raise ValueError(f"backend {self.backend!r} cannot soft-cap the attention scores: use backend='reference'")
        if mask is not None and mask.dim() == 3:  # (B, T_q, T_k): the same mask for every head
            mask = mask.unsqueeze(1)
        if mask is not None and mask.dtype != torch.bool:
            check_tensor("mask", mask, floating=True)
            bias, mask = (mask if bias is None else bias + mask), None
        dropout_p = self.dropout.p if self.training else 0.0
        backend = select_backend(q, mask, dropout_p) if self.backend == "auto" else self.backend
        self.last_backend = backend
        return attention(q, k, v, mask=mask, is_causal=is_causal, backend=backend, scale=self.scale, bias=bias,
                         causal_offset=k.shape[-2] - q.shape[-2], dropout_p=dropout_p)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
        kv_cache: "LayerKVCache | None" = None,
    ):
        """``x (B, T_q, d_model)``, optional ``context (B, T_k, d_context)`` -> ``(B, T_q, d_model)``.

        ``mask`` broadcasts to ``(B, H, T_q, T_k)``; a 3-d mask ``(B, T_q, T_k)`` applies to every head.
        ``bias`` is added to the scores (shape broadcastable to ``(B, H, T_q, T_k)``).
        ``positions`` (long ``(T_q,)``, or ``(B, T_q)`` per row) are the positions RoPE uses for the new tokens.
        ``kv_cache`` (a ``llmarch.kv_cache.LayerKVCache``): the keys and values of earlier tokens are
        reused and these tokens' are appended; the new queries are the last positions, so ``is_causal``
        lets them see every cached key. ``return_weights=True`` also returns the weights ``(B, H, T_q, T_k)``
        (``backend="reference"`` only).
        """
        if return_weights and self.backend != "reference":
            raise ValueError(f"return_weights=True needs backend='reference': backend {self.backend!r} never forms "
                             "the attention weights (switch with llmarch.attention.set_attention_backend)")
        q, k, v = self.project_qkv(x, context)
        if context is None:
            q, k = self.rotate_qk(q, k, positions, past=0 if kv_cache is None else kv_cache.length)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        t_q, t_k = q.shape[-2], k.shape[-2]
        if context is None:
            bias = self.position_bias(t_q, t_k, bias, like=q)
        if self.backend != "reference":
            heads, weights = self.attend_fast(q, k, v, mask=mask, bias=bias, is_causal=is_causal), None
        else:
            self.last_backend = "reference"
            if is_causal and t_q != t_k:  # queries at the end: query i is position t_k - t_q + i
                tri = causal_mask(t_q, t_k, offset=t_k - t_q, device=q.device)
                mask, is_causal = (tri if mask is None else mask & tri), False
            heads, weights = self.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
        b, _, t, _ = heads.shape
        out = self.o_proj(heads.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head))
        return (out, weights) if return_weights else out


def softcapped_attention(q, k, v, cap: float, mask=None, bias=None, is_causal: bool = False, scale=None):
    """Attention with soft-capped scores (Gemma 2): ``softmax(cap * tanh(s / cap) + bias + M) v`` with
    ``s = q k^T * scale`` (default ``1/sqrt(d)``), so no score leaves ``(-cap, cap)`` before the mask.

    Book: From GPT-2 to Llama 3, "After Llama 3". Shapes and ``mask``/``bias``/``is_causal`` as
    :func:`scaled_dot_product_attention` (per-head ``q (..., t_q, d)``, ``k, v (..., t_k, d)``); returns the
    output and the weights ``(..., t_q, t_k)``.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    compute = torch.promote_types(q.dtype, torch.float32)
    capped = soft_cap(torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1)) * scale, cap)
    bias = capped if bias is None else capped + bias.to(compute)
    # the capped scores are the bias of attention with zero queries: the mask logic stays in one place
    out, weights = scaled_dot_product_attention(torch.zeros_like(q, dtype=compute), k.to(compute), v.to(compute),
                                                mask=mask, bias=bias, is_causal=is_causal, return_weights=True)
    return out.to(q.dtype), weights.to(q.dtype)


def multi_head_attention_additive(
    mha: MultiHeadAttention,
    x: torch.Tensor,
    context: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """The "additive view" of multi-head attention: ``a_t = sum_h W_O^h head_h(t) + b_O``.

    Book: Attention, "Two views of multi-head attention" (the material's eq. (4), after Elhage et al., 2021).

    ``W_O^h`` is the block of columns ``h*d_head:(h+1)*d_head`` of ``o_proj.weight``; since
    ``concat(head_1..head_H) W_O = sum_h head_h W_O^h``, this equals ``mha(x, context, mask, is_causal)``.
    Returns ``(B, T_q, d_model)``.
    """
    q, k, v = mha.project_qkv(x, context)
    bias = None
    if context is None:
        q, k = mha.rotate_qk(q, k)
        bias = mha.position_bias(q.shape[-2], k.shape[-2], like=q)
    heads, _ = mha.attend(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
    out = 0
    for h in range(mha.n_heads):
        w_o_h = mha.o_proj.weight[:, h * mha.d_head : (h + 1) * mha.d_head]  # (d_model, d_head)
        out = out + heads[:, h] @ w_o_h.T
    if mha.o_proj.bias is not None:
        out = out + mha.o_proj.bias
    return out


def _check_backend(backend) -> None:
    if backend not in MODEL_BACKENDS:
        raise ValueError(f"attention backend must be one of {MODEL_BACKENDS}, got {backend!r}")


def set_attention_backend(model: nn.Module, backend: str) -> nn.Module:
    """Switch every :class:`MultiHeadAttention` in ``model`` (and ``model.config.attn_backend``, if it has one)
    to ``backend``, one of ``"reference"``, ``"sdpa"``, ``"flash"``, ``"triton"``, ``"flex"``, ``"auto"``.
    Returns ``model``. Book: Efficient attention, "GPU paths"."""
    _check_backend(backend)
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.backend = backend
    if hasattr(getattr(model, "config", None), "attn_backend"):
        model.config.attn_backend = backend
    return model


@contextlib.contextmanager
def attention_backend(model: nn.Module, backend: str | None):
    """``with attention_backend(model, "sdpa"):`` every :class:`MultiHeadAttention` of ``model`` uses
    ``backend`` inside the block and its own backend again after it (``None``: no change). Book: Efficient
    attention, "GPU paths"."""
    layers = {m: m.backend for m in model.modules() if isinstance(m, MultiHeadAttention)}
    if backend is not None:
        _check_backend(backend)
        for m in layers:
            m.backend = backend
    try:
        yield model
    finally:
        for m, own in layers.items():
            m.backend = own
