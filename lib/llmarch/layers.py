"""Normalisation layers, the position-wise feed-forward network and the Transformer block.

Book: The Transformer block (``book/transformer-block.md``).

Conventions (DESIGN.md): tensors are ``(batch..., seq, features)``; normalisations act on the last
(feature) dimension, except batch normalisation, which averages over every other dimension.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.attention import MultiHeadAttention
from llmarch.positional import RotaryEmbedding

__all__ = [
    "layer_norm",
    "batch_norm",
    "rms_norm",
    "FeedForward",
    "SwiGLU",
    "swiglu_hidden_size",
    "OffsetRMSNorm",
    "make_norm",
    "TransformerBlock",
    "TransformerBlockEq3",
]


def _affine(x_hat, weight, bias, name):
    d = x_hat.shape[-1]
    for label, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != (d,):
            raise ValueError(f"{name} {label} has shape {shape_str(p.shape)} but x has {d} features: expected ({d},)")
    if weight is not None:
        x_hat = x_hat * weight
    if bias is not None:
        x_hat = x_hat + bias
    return x_hat


def _float32_at_least(x: torch.Tensor) -> torch.Tensor:
    """Half-precision inputs in float32: normalisation statistics are taken in float32 and the normalised
    values cast back before the affine map (as transformers' norms and ``torch.nn.functional`` do)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def layer_norm(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """Layer normalisation over the last dimension (Ba et al., 2016).

    Book: The Transformer block, "LayerNorm and BatchNorm".

    ``mu = mean_i x_i``, ``sigma^2 = mean_i (x_i - mu)^2`` (biased), ``y = gamma * (x - mu) / sqrt(sigma^2 + eps) + beta``.
    Shapes: ``x (..., d)``, ``weight``/``bias`` ``(d,)`` -> ``(..., d)``. Statistics are per example and
    per position, so the result does not depend on the rest of the batch. Half-precision inputs: statistics in
    float32.
    """
    check_tensor("x", x, min_dim=1, floating=True)
    xf = _float32_at_least(x)
    mu = xf.mean(dim=-1, keepdim=True)
    var = ((xf - mu) ** 2).mean(dim=-1, keepdim=True)
    return _affine(((xf - mu) / torch.sqrt(var + eps)).to(x.dtype), weight, bias, "layer_norm")


def batch_norm(x: torch.Tensor, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """Batch normalisation with training-time (batch) statistics (Ioffe & Szegedy, 2015).

    Book: The Transformer block, "LayerNorm and BatchNorm".

    For each feature ``i``: ``mu_i`` and the biased ``sigma_i^2`` are taken over every example and
    position in the batch, then ``y = gamma_i * (x_i - mu_i) / sqrt(sigma_i^2 + eps) + beta_i``.
    Shapes: ``x (N, ..., d)`` -> same. With a single value per feature (batch size 1, one position) the
    output is exactly ``beta``: the input is erased, which is why BatchNorm fails at batch size 1.
    """
    check_tensor("x", x, min_dim=2, floating=True)
    dims = tuple(range(x.dim() - 1))
    mu = x.mean(dim=dims, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=dims, keepdim=True)
    return _affine((x - mu) / torch.sqrt(var + eps), weight, bias, "batch_norm")


def rms_norm(x: torch.Tensor, weight=None, eps: float = 1e-6) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension (Zhang & Sennrich, 2019).

    Book: The Transformer block, "LayerNorm and BatchNorm".

    ``y = gamma * x / sqrt(mean_i x_i^2 + eps)``: LayerNorm without re-centring and without ``beta``.
    Shapes: ``x (..., d)``, ``weight (d,)`` -> ``(..., d)``.
    """
    check_tensor("x", x, min_dim=1, floating=True)
    xf = _float32_at_least(x)
    return _affine((xf / torch.sqrt((xf**2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype), weight, None, "rms_norm")


_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``FFN(x) = W_2 sigma(W_1 x + b_1) + b_2``.

    Book: The Transformer block, "The feed-forward network".

    ``w1: Linear(d_model, d_ff)``, ``w2: Linear(d_ff, d_model)``, ``d_ff = 4 d_model`` by default;
    ``activation`` is one of ``relu``, ``gelu`` (exact), ``gelu_tanh`` (GPT-2's approximation), ``silu``.
    Shapes: ``(..., d_model) -> (..., d_model)``; every position is transformed independently.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "gelu", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.w1.in_features:
            raise ValueError(f"x has shape {shape_str(x.shape)} but the FFN expects {self.w1.in_features} features")
        return self.w2(self.dropout(_ACTIVATIONS[self.activation](self.w1(x))))


def swiglu_hidden_size(d_model: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU hidden size as Llama computes it: ``2/3 * 4 d_model`` (so that three matrices hold as many
    parameters as the two of a ``4 d_model`` MLP), times ``ffn_dim_multiplier`` if given, rounded up to a
    multiple of ``multiple_of``. Llama 2 7B: ``swiglu_hidden_size(4096) == 11008``.
    Book: From GPT-2 to Llama 3, "SwiGLU"."""
    if d_model < 1 or multiple_of < 1:
        raise ValueError(f"swiglu_hidden_size needs d_model >= 1 and multiple_of >= 1, got {d_model}, {multiple_of}")
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


class SwiGLU(nn.Module):
    """The gated feed-forward network of Shazeer (2020), as Llama uses it:

    ``FFN(x) = W_2 (silu(W_1 x) * W_3 x)``  (``*`` elementwise; ``silu(z) = z sigmoid(z)``).

    Book: From GPT-2 to Llama 3, "SwiGLU".

    ``w1`` (the gate) and ``w3`` (the value): ``Linear(d_model, d_ff)``; ``w2``: ``Linear(d_ff, d_model)``;
    ``d_ff`` defaults to :func:`swiglu_hidden_size`. ``activation`` replaces silu (``gelu`` gives GeGLU).
    Shapes: ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "silu", bias: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        d_ff = swiglu_hidden_size(d_model) if d_ff is None else d_ff
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.w1.in_features:
            raise ValueError(f"x has shape {shape_str(x.shape)} but the FFN expects {self.w1.in_features} features")
        return self.w2(self.dropout(_ACTIVATIONS[self.activation](self.w1(x)) * self.w3(x)))


NORMS = ("layernorm", "rmsnorm", "rmsnorm_offset")
FFNS = ("mlp", "swiglu")
# Where a block's norms sit (see TransformerBlock); "pre"/"post" are norm_first=True/False.
NORM_PLACEMENTS = ("pre", "post", "sandwich", "output")


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose gain is ``1 + w`` (Gemma; ``w`` starts at zero): ``y = x / sqrt(mean_i x_i^2 + eps) * (1 + w)``.

    Book: From GPT-2 to Llama 3, "After Llama 3". As Gemma's code does, the gain multiplies in float32 (at least)
    before the cast back to ``x``'s dtype. Shapes: ``(..., d) -> (..., d)``.
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _float32_at_least(x)
        normed = xf * torch.rsqrt((xf**2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.to(xf.dtype))).to(x.dtype)


def make_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """The norm ``kind`` (one of ``NORMS``) over ``d_model`` features."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    if kind == "rmsnorm_offset":
        return OffsetRMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")


class TransformerBlock(nn.Module):
    """One Transformer layer: self-attention, optional cross-attention, feed-forward; residuals and norms.

    Book: The Transformer block, "Post-LN and pre-LN".

    Post-LN (``norm_first=False``, Vaswani et al., 2017):
        ``x = LN(x + SelfAttn(x))``; ``x = LN(x + CrossAttn(x, c))``; ``x = LN(x + FFN(x))``.
    Pre-LN (``norm_first=True``, GPT-2 and later; Xiong et al., 2020):
        ``x = x + SelfAttn(LN(x))``; ``x = x + CrossAttn(LN(x), c)``; ``x = x + FFN(LN(x))``.
    ``norm_placement`` (when given, it replaces ``norm_first``) also has two later forms:
        ``"sandwich"`` (Gemma 2 and 3): ``x = x + N'(SelfAttn(N(x)))``, ``x = x + N'(FFN(N(x)))``, four norms;
        ``"output"`` (OLMo 2): ``x = x + N(SelfAttn(x))``, ``x = x + N(FFN(x))``, a norm on each output only.
    ``parallel_residual`` (GPT-J, GPT-NeoX/Pythia; pre-norm only): ``x = x + SelfAttn(LN_1(x)) + FFN(LN_2(x))``.
    The cross-attention sub-layer exists only with ``cross_attention=True`` (a decoder of an
    encoder-decoder model). Submodules: ``attn``, ``norm1``, ``cross_attn``/``norm_cross``, ``ffn``, ``norm2``
    (``"sandwich"`` adds ``post_norm1`` and ``post_norm2``; ``"output"`` applies ``norm1``/``norm2`` to the outputs).
    ``norm`` is ``layernorm`` or ``rmsnorm`` (eps ``eps``); ``ffn`` is ``mlp`` (:class:`FeedForward`) or
    ``swiglu`` (:class:`SwiGLU`, with ``activation`` as its gate); ``bias`` is the attention's, ``mlp_bias``
    the FFN's (default: ``bias``). ``pos_encoding``, ``rotary``, ``kerple_variant``, ``qk_norm``, ``d_head``,
    ``attn_out_bias``, ``attn_scale`` and ``attn_softcap`` go to the self-attention, ``attn_backend`` to both
    attentions (see ``MultiHeadAttention``); QK-norm is an ``rmsnorm_offset`` when ``norm`` is, else an RMSNorm.
    ``attn_module`` and ``ffn_module`` replace the self-attention and the FFN (e.g.
    ``llmarch.mla``'s latent attention, ``llmarch.moe``'s mixture of experts). Shapes: ``x (B, T, d_model)``, ``context (B, T_c, d_model)`` -> ``(B, T, d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        activation: str = "gelu",
        norm_first: bool = True,
        cross_attention: bool = False,
        norm: str = "layernorm",
        bias: bool = True,
        eps: float = 1e-5,
        pos_encoding: str = "none",
        rope_base: float = 10000.0,
        ffn: str = "mlp",
        mlp_bias: bool | None = None,
        rotary: RotaryEmbedding | None = None,
        kerple_variant: str = "log",
        qk_norm: bool | str = False,
        attn_backend: str = "reference",
        attn_module: nn.Module | None = None,
        ffn_module: nn.Module | None = None,
        norm_placement: str | None = None,
        parallel_residual: bool = False,
        d_head: int | None = None,
        attn_out_bias: bool | None = None,
        attn_scale: float | None = None,
        attn_softcap: float | None = None,
    ):
        super().__init__()
        if ffn not in FFNS:
            raise ValueError(f"ffn must be one of {FFNS}, got {ffn!r}")
        placement = norm_placement or ("pre" if norm_first else "post")
        if placement not in NORM_PLACEMENTS:
            raise ValueError(f"norm_placement must be one of {NORM_PLACEMENTS}, got {norm_placement!r}")
        if cross_attention and placement in ("sandwich", "output"):
            raise ValueError(f"norm_placement={placement!r} is for decoder-only blocks: no cross-attention")
        if parallel_residual and (placement != "pre" or cross_attention):
            raise ValueError("parallel_residual needs pre-norm placement and no cross-attention")
        self.norm_placement, self.parallel_residual = placement, parallel_residual
        self.norm_first = placement != "post"
        self.attn = attn_module if attn_module is not None else MultiHeadAttention(
            d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias, dropout=dropout,
                                       pos_encoding=pos_encoding, rope_base=rope_base, rotary=rotary,
                                       kerple_variant=kerple_variant, qk_norm=qk_norm, qk_norm_eps=eps,
                                       backend=attn_backend, d_head=d_head, out_bias=attn_out_bias,
                                       scale=attn_scale, softcap=attn_softcap,
                                       qk_norm_kind="rmsnorm_offset" if norm == "rmsnorm_offset" else "rmsnorm")
        self.norm1 = make_norm(norm, d_model, eps)
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias, dropout=dropout,
                                                 backend=attn_backend)
            self.norm_cross = make_norm(norm, d_model, eps)
        else:
            self.cross_attn = None
        mlp_bias = bias if mlp_bias is None else mlp_bias
        ffn_class = FeedForward if ffn == "mlp" else SwiGLU
        self.ffn = ffn_module if ffn_module is not None else ffn_class(d_model, d_ff, activation=activation, bias=mlp_bias, dropout=dropout)
        self.norm2 = make_norm(norm, d_model, eps)
        if placement == "sandwich":
            self.post_norm1, self.post_norm2 = make_norm(norm, d_model, eps), make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def _sublayer(self, x, norm, fn, post_norm=None):
        if self.norm_placement == "pre":
            return x + self.dropout(fn(norm(x)))
        if self.norm_placement == "post":
            return norm(x + self.dropout(fn(x)))
        if self.norm_placement == "sandwich":
            return x + self.dropout(post_norm(fn(norm(x))))
        return x + self.dropout(norm(fn(x)))  # "output"

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        context_mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        kv_cache=None,
    ) -> torch.Tensor:
        """``mask``/``is_causal``/``bias``/``positions``/``kv_cache`` go to self-attention, ``context_mask`` to
        cross-attention."""
        if self.cross_attn is None and context is not None:
            raise ValueError("this block has no cross-attention: build it with cross_attention=True to pass context")
        if self.cross_attn is not None and context is None:
            raise ValueError("this block has cross-attention and needs context (B, T_c, d_model)")
        def self_attention(h):
            return self.attn(h, mask=mask, is_causal=is_causal, bias=bias, positions=positions, kv_cache=kv_cache)

        if self.parallel_residual:
            return x + self.dropout(self_attention(self.norm1(x))) + self.dropout(self.ffn(self.norm2(x)))
        x = self._sublayer(x, self.norm1, self_attention, getattr(self, "post_norm1", None))
        if self.cross_attn is not None:
            x = self._sublayer(x, self.norm_cross, lambda h: self.cross_attn(h, context, mask=context_mask))
        return self._sublayer(x, self.norm2, self.ffn, getattr(self, "post_norm2", None))


class TransformerBlockEq3(TransformerBlock):
    """The block exactly as the material's equation (3) writes it (decoder-only, one norm):

    ``a_t = MHA(H)_t``;  ``h_t = FF(LN(a_t + h_t)) + a_t + h_t``.

    Book: The Transformer block, "The block of equation (3)".

    Attention reads the *un-normalised* residual stream and only the feed-forward input is normalised,
    so this is neither the post-LN nor the pre-LN block. It has no ``norm1`` (there is one norm, ``norm2``).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, activation: str = "gelu", **kwargs):
        super().__init__(d_model, n_heads, d_ff=d_ff, activation=activation, **kwargs)
        del self.norm1

    def forward(self, x, context=None, mask=None, is_causal=False, context_mask=None, bias=None, positions=None,
                kv_cache=None):
        if context is not None:
            raise ValueError("the block of equation (3) is decoder-only: it takes no context")
        r = x + self.dropout(self.attn(x, mask=mask, is_causal=is_causal, bias=bias, positions=positions,
                                       kv_cache=kv_cache))
        return r + self.dropout(self.ffn(self.norm2(r)))
