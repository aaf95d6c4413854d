"""``GPTConfig``, the hyper-parameters of a decoder-only model from GPT-1 to Llama 3, and presets.

Book: The Transformer block, "Decoder-only models"; From GPT-2 to Llama 3 (``book/modern-decoder.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmarch.efficient.dispatch import MODEL_BACKENDS
from llmarch.layers import FFNS, NORM_PLACEMENTS, NORMS, swiglu_hidden_size
from llmarch.mla import MLAConfig
from llmarch.moe import MoEConfig
from llmarch.positional import KERPLE_VARIANTS, POS_ENCODINGS, RotaryEmbedding, check_rope_scaling

__all__ = ["GPTConfig", "gpt1_config", "gpt2_config", "llama_config", "tiny_gpt_config", "ROPE_LAYOUTS",
           "LAYER_TYPES"]

ROPE_LAYOUTS = ("interleaved", "half")
LAYER_TYPES = ("full", "sliding")


def check_attn_backend(config_name: str, backend) -> None:
    """Raise ``ValueError`` unless ``backend`` is one of ``MODEL_BACKENDS`` (for ``config_name.attn_backend``)."""
    if backend not in MODEL_BACKENDS:
        raise ValueError(f"{config_name}.attn_backend must be one of {MODEL_BACKENDS}, got {backend!r}")


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`llmarch.model.GPT`; each option names the work that introduced it.

    - ``norm``: ``layernorm`` (Ba et al., 2016) or ``rmsnorm`` (Zhang & Sennrich, 2019), with ``norm_eps``;
      ``norm_first``: pre-LN (GPT-2; Xiong et al., 2020) or post-LN (Vaswani et al., 2017; GPT-1).
    - ``ffn``: ``mlp`` (``d_ff`` defaults to ``4 d_model``) or ``swiglu`` (Shazeer, 2020; ``d_ff`` defaults to
      Llama's ``swiglu_hidden_size(d_model)``); ``activation`` is the MLP's non-linearity or the SwiGLU gate's
      (``None``: ``gelu`` for ``mlp``, ``silu`` for ``swiglu``).
    - ``pos_encoding``: see ``llmarch.positional.POS_ENCODINGS``. RoPE (Su et al., 2024) takes ``rope_base``,
      ``rope_layout`` (``interleaved`` pairs ``(2i, 2i+1)`` as RoFormer and Meta's Llama code do; ``half`` pairs
      ``(i, i + d/2)`` as GPT-NeoX and transformers' Llama, whose conversion permutes W_q, W_k, do), ``rotary_fraction`` (rotate only the first ``int(d_head * fraction)`` features
      of each head: GPT-J, GPT-NeoX's ``rotary_pct``) and ``rope_scaling`` (``None`` or a dict with
      ``rope_type`` in linear (Chen et al., 2023), dynamic (dynamic NTK), yarn (Peng et al., 2023), llama3).
    - ``kerple_variant`` (``pos_encoding="kerple"``, Chi et al., 2022): ``log`` or ``power`` kernel.
    - ``n_kv_heads``: grouped-query attention (Ainslie et al., 2023; ``1`` is multi-query attention,
      Shazeer, 2019). ``bias``: biases of the attention projections; ``mlp_bias``: of the FFN (default
      ``bias``). ``tie_embeddings``: the output layer shares the token embedding (Press & Wolf, 2017).
    - ``scale_embeddings``: multiply token embeddings by ``sqrt(d_model)``, as Vaswani et al. (2017) do.
    - ``sliding_window``: each token attends to itself and the ``sliding_window - 1`` tokens before it
      (Mistral 7B; Jiang et al., 2023); ``None`` for full causal attention. ``attention_sinks``: the first
      ``attention_sinks`` tokens stay visible to every query, and the window then covers the last
      ``sliding_window - attention_sinks`` tokens (StreamingLLM; Xiao et al., 2023; ``llmarch.kv_cache``).
    - ``qk_norm``: RMSNorm (eps ``norm_eps``) of queries and keys before RoPE (Dehghani et al., 2023): ``"head"``
      (or ``True``) normalises each head (Qwen3, Gemma 3), ``"projection"`` the whole q and k projections across
      heads (OLMo 2); see ``llmarch.attention.MultiHeadAttention``.
    - ``attn_backend``: the attention kernel of every layer, one of ``llmarch.efficient.MODEL_BACKENDS``
      (``reference``, the default and the only one that returns attention weights; ``sdpa``, ``flash``,
      ``triton``, ``flex``, ``auto``); see ``llmarch.attention.MultiHeadAttention``.
    - ``moe``: a :class:`llmarch.moe.MoEConfig` (or its fields as a dict) makes the FFN of every layer from
      ``moe.first_dense_layers`` on a mixture of experts (Mixtral, DeepSeek-V3); ``mla``: a
      :class:`llmarch.mla.MLAConfig` replaces every self-attention by multi-head latent attention (DeepSeek-V2/V3;
      needs ``pos_encoding="rope"``).

    Options of the 2024-25 open families (Book: From GPT-2 to Llama 3, "After Llama 3"):

    - ``head_dim``: ``d_head`` when it is not ``d_model / n_heads`` (Qwen3, Gemma, Mistral-Nemo).
    - ``attn_out_bias``: the bias of the attention output projection (default ``bias``; Qwen2: ``False``).
    - ``norm``: also ``rmsnorm_offset``, Gemma's RMSNorm with gain ``1 + w``; ``norm_placement`` (replaces
      ``norm_first`` when set): ``pre``, ``post``, ``sandwich`` (Gemma 2/3: norms before and after each sub-layer)
      or ``output`` (OLMo 2: a norm on each sub-layer's output, none on its input); see ``TransformerBlock``.
    - ``parallel_residual``: ``x + attn(LN_1(x)) + mlp(LN_2(x))`` (GPT-J; GPT-NeoX and Pythia).
    - ``attn_scale``: the factor on ``q . k`` (default ``1/sqrt(d_head)``; Gemma: ``query_pre_attn_scalar^-1/2``);
      ``attn_softcap`` / ``final_softcap``: ``cap * tanh(x / cap)`` on the attention scores before the mask and on
      the output logits (Gemma 2; ``llmarch.stability.soft_cap``).
    - ``layer_types``: one of ``LAYER_TYPES`` per layer, ``sliding`` layers using ``sliding_window`` and ``full``
      layers full causal attention (Gemma 2 alternates them, Gemma 3 has five sliding per full one; ``None``: every
      layer ``sliding`` if ``sliding_window`` is set, as in Mistral); ``rope_local_base``: the RoPE base of the
      sliding layers, which are then unscaled (Gemma 3: 10,000, against 1,000,000 and ``rope_scaling`` for the
      full layers; ``None``: the same RoPE everywhere).
    """

    vocab_size: int
    context_length: int = 128
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    d_ff: int | None = None
    dropout: float = 0.0
    activation: str | None = None
    norm_first: bool = True
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    ffn: str = "mlp"
    bias: bool = True
    mlp_bias: bool | None = None
    tie_embeddings: bool = True
    pos_encoding: str = "learned"
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    rotary_fraction: float = 1.0
    rope_scaling: dict | None = None
    scale_embeddings: bool = False
    kerple_variant: str = "log"
    sliding_window: int | None = None
    attention_sinks: int = 0
    qk_norm: bool | str = False
    attn_backend: str = "reference"
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None
    head_dim: int | None = None
    attn_out_bias: bool | None = None
    norm_placement: str | None = None
    parallel_residual: bool = False
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_base: float | None = None

    def __post_init__(self):
        check_attn_backend("GPTConfig", self.attn_backend)
        self.moe = MoEConfig(**self.moe) if isinstance(self.moe, dict) else self.moe
        self.mla = MLAConfig(**self.mla) if isinstance(self.mla, dict) else self.mla
        if self.moe is not None and self.moe.first_dense_layers >= self.n_layers:
            raise ValueError(f"GPTConfig.moe.first_dense_layers={self.moe.first_dense_layers} leaves no mixture-of-"
                             f"experts layer among n_layers={self.n_layers}")
        if self.mla is not None and self.pos_encoding != "rope":
            raise ValueError(f"GPTConfig.mla needs pos_encoding='rope' (MLA's decoupled RoPE), "
                             f"got {self.pos_encoding!r}")
        if self.pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"GPTConfig.pos_encoding must be one of {POS_ENCODINGS}, got {self.pos_encoding!r}")
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                             "set head_dim")
        self._check_family_options()
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"GPTConfig.n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.norm not in NORMS:
            raise ValueError(f"GPTConfig.norm must be one of {NORMS}, got {self.norm!r}")
        if self.ffn not in FFNS:
            raise ValueError(f"GPTConfig.ffn must be one of {FFNS}, got {self.ffn!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"GPTConfig.sliding_window must be None or positive, got {self.sliding_window}")
        if self.attention_sinks and not (self.sliding_window and 0 < self.attention_sinks < self.sliding_window):
            raise ValueError(f"GPTConfig.attention_sinks={self.attention_sinks} needs a sliding_window larger than it, "
                             f"got {self.sliding_window}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"GPTConfig.rope_layout must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        if self.kerple_variant not in KERPLE_VARIANTS:
            raise ValueError(f"GPTConfig.kerple_variant must be one of {KERPLE_VARIANTS}, got {self.kerple_variant!r}")
        self.rope_scaling = check_rope_scaling(self.rope_scaling)
        if self.pos_encoding == "rope":
            self.rotary()  # validates rotary_fraction and the scaling rule
        elif self.rope_scaling is not None or self.rotary_fraction != 1.0:
            raise ValueError(f"GPTConfig.rope_scaling and rotary_fraction need pos_encoding='rope', "
                             f"got {self.pos_encoding!r}")

    def _check_family_options(self):
        """Validate (and normalise) the options of the 2024-25 families (the docstring's last list)."""
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"GPTConfig.head_dim must be None or positive, got {self.head_dim}")
        self.qk_norm = {True: "head"}.get(self.qk_norm, self.qk_norm)
        if self.qk_norm not in (False, "head", "projection"):
            raise ValueError(f"GPTConfig.qk_norm must be False, True/'head' or 'projection', got {self.qk_norm!r}")
        if self.norm_placement is not None and self.norm_placement not in NORM_PLACEMENTS:
            raise ValueError(f"GPTConfig.norm_placement must be None or one of {NORM_PLACEMENTS}, "
                             f"got {self.norm_placement!r}")
        if self.parallel_residual and self.placement != "pre":
            raise ValueError(f"GPTConfig.parallel_residual needs pre-norm blocks, got {self.placement!r}")
        for name in ("attn_scale", "attn_softcap", "final_softcap"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"GPTConfig.{name} must be None or positive, got {getattr(self, name)}")
        if self.layer_types is not None:
            self.layer_types = tuple(self.layer_types)
            if len(self.layer_types) != self.n_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ValueError(f"GPTConfig.layer_types must hold one of {LAYER_TYPES} per layer ({self.n_layers}), "
                                 f"got {self.layer_types}")
            if "sliding" in self.layer_types and self.sliding_window is None:
                raise ValueError("GPTConfig.layer_types has sliding layers but sliding_window is None")
        if self.rope_local_base is not None and (self.pos_encoding != "rope" or not self.rope_local_base > 0):
            raise ValueError(f"GPTConfig.rope_local_base={self.rope_local_base} needs pos_encoding='rope' and a "
                             "positive base")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def placement(self) -> str:
        """Where each block's norms sit: ``norm_placement``, else ``pre``/``post`` from ``norm_first``."""
        return self.norm_placement or ("pre" if self.norm_first else "post")

    def layer_type(self, i: int) -> str:
        """``"sliding"`` if layer ``i`` attends within ``sliding_window``, else ``"full"``."""
        if self.sliding_window is None:
            return "full"
        return "sliding" if self.layer_types is None else self.layer_types[i]

    @property
    def ffn_hidden(self) -> int:
        """The FFN's hidden size: ``d_ff``, or its default for ``ffn``."""
        if self.d_ff is not None:
            return self.d_ff
        return 4 * self.d_model if self.ffn == "mlp" else swiglu_hidden_size(self.d_model)

    @property
    def ffn_activation(self) -> str:
        return self.activation or ("gelu" if self.ffn == "mlp" else "silu")

    def rotary(self, layer_type: str = "full") -> RotaryEmbedding:
        """The RoPE the attention layers of ``layer_type`` apply (``pos_encoding == "rope"``): sliding layers
        use ``rope_local_base`` without scaling when it is set."""
        rotary_dim = int(self.d_head * self.rotary_fraction)
        if not 0 < self.rotary_fraction <= 1 or rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"GPTConfig.rotary_fraction={self.rotary_fraction} gives {rotary_dim} rotated features "
                             f"of d_head={self.d_head}: it must be an even number >= 2")
        local = layer_type == "sliding" and self.rope_local_base is not None
        return RotaryEmbedding(self.d_head, base=self.rope_local_base if local else self.rope_base,
                               interleaved=self.rope_layout == "interleaved", rotary_dim=rotary_dim,
                               scaling=None if local else self.rope_scaling,
                               max_position_embeddings=self.context_length)


def gpt1_config() -> GPTConfig:
    """The GPT-1 configuration (Radford et al., 2018): 12 post-LN layers, d_model 768, 12 heads, d_ff 3072,
    a 512-token context, a 40,478-token BPE vocabulary, output layer tied to the embedding, and the tanh
    approximation of GELU that the original code used."""
    return GPTConfig(vocab_size=40478, context_length=512, d_model=768, n_layers=12, n_heads=12, norm_first=False,
                     activation="gelu_tanh")


_GPT2_SIZES = {"gpt2": (768, 12, 12), "gpt2-medium": (1024, 24, 16), "gpt2-large": (1280, 36, 20),
               "gpt2-xl": (1600, 48, 25)}


def gpt2_config(name: str = "gpt2", **overrides) -> GPTConfig:
    """GPT-2 (Radford et al., 2019): pre-LN, learned positions, 1,024-token context, 50,257-token byte-level
    BPE, tanh GELU, biases everywhere, tied output layer. ``name``: ``gpt2`` (124M), ``gpt2-medium``,
    ``gpt2-large``, ``gpt2-xl``; ``overrides`` replace fields (for a small model of the same family)."""
    if name not in _GPT2_SIZES:
        raise ValueError(f"unknown GPT-2 size {name!r}: use one of {sorted(_GPT2_SIZES)}")
    d_model, n_layers, n_heads = _GPT2_SIZES[name]
    config = GPTConfig(vocab_size=50257, context_length=1024, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                       activation="gelu_tanh", norm_eps=1e-5)
    return dataclasses.replace(config, **overrides)


# vocab, context, d_model, layers, heads, kv heads, d_ff, rope base, rope scaling
_LLAMA_SIZES = {
    "llama-2-7b": (32000, 4096, 4096, 32, 32, 32, 11008, 10000.0, None),
    "llama-3-8b": (128256, 8192, 4096, 32, 32, 8, 14336, 500000.0, None),
    "llama-3.1-8b": (128256, 131072, 4096, 32, 32, 8, 14336, 500000.0,
                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}),
    # Mistral 7B v0.1 (Jiang et al., 2023), whose 4,096-token sliding window llama_config adds.
    "mistral-7b": (32000, 8192, 4096, 32, 32, 8, 14336, 10000.0, None),
}


def llama_config(name: str = "llama-3-8b", **overrides) -> GPTConfig:
    """A Llama-family decoder (Touvron et al., 2023; Meta, 2024): pre-RMSNorm (eps 1e-5), SwiGLU, rotate-half
    RoPE, no biases, untied output layer, grouped-query attention. ``name``: ``llama-2-7b``, ``llama-3-8b``,
    ``llama-3.1-8b`` (Llama 3 RoPE scaling to 128k), ``mistral-7b``; ``overrides`` replace fields (e.g. a tiny
    model of the same family for the book's experiments)."""
    if name not in _LLAMA_SIZES:
        raise ValueError(f"unknown Llama configuration {name!r}: use one of {sorted(_LLAMA_SIZES)}")
    vocab, context, d_model, n_layers, n_heads, n_kv, d_ff, base, scaling = _LLAMA_SIZES[name]
    config = GPTConfig(vocab_size=vocab, context_length=context, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=n_kv, d_ff=d_ff, norm="rmsnorm", norm_eps=1e-5, ffn="swiglu", activation="silu", bias=False,
                       tie_embeddings=False, pos_encoding="rope", rope_base=base, rope_layout="half",
                       rope_scaling=scaling, sliding_window=4096 if name == "mistral-7b" else None)
    return dataclasses.replace(config, **overrides)


def tiny_gpt_config() -> GPTConfig:
    """The course's small pretrained model: 2 pre-LN layers, d_model 64, 4 heads, learned positions,
    64-token context, the 36-word vocabulary of ``llmarch.data.default_grammar()`` (106,496 parameters)."""
    return GPTConfig(vocab_size=36, context_length=64, d_model=64, n_layers=2, n_heads=4)
