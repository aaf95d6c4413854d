"""The decoder-only Transformer (GPT, from GPT-1 to Llama 3), parameter counting, the warm-up schedule,
perplexity, and the course's tiny pretrained model.

Book: The Transformer block (``book/transformer-block.md``), sections "Decoder-only models",
"Counting parameters", "The warm-up schedule" and "Perplexity"; From GPT-2 to Llama 3.

Conventions (DESIGN.md): token ids ``(B, T)`` of dtype ``long``; logits ``(B, T, vocab_size)``, where
``logits[:, t]`` scores the token at position ``t + 1`` given tokens ``0..t``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from llmarch._checks import check_tensor, has_values, shape_str
from llmarch.kv_cache import KVCache, window_sink_mask
from llmarch.layers import TransformerBlock, make_norm
from llmarch.mla import MultiHeadLatentAttention
from llmarch.model.config import GPTConfig, tiny_gpt_config
from llmarch.moe import MoEFeedForward, moe_aux_loss
from llmarch.positional import sinusoidal_encoding
from llmarch.stability import soft_cap

__all__ = ["GPT", "load_tiny_gpt", "count_parameters", "noam_lr", "perplexity", "TINY_GPT_CHECKPOINT"]

TINY_GPT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny_gpt.pt"


class GPT(nn.Module):
    """Decoder-only Transformer: token embeddings, causal blocks, a tied LM head, and a positional encoding.

    Book: The Transformer block, "Decoder-only models"; Positional encodings.

    ``h_0 = W_E[idx] + P[0..T-1]`` (``W_E[idx] * sqrt(d_model) + P[0..T-1]`` with ``config.scale_embeddings``,
    as Vaswani et al. do); ``h_l = Block_l(h_{l-1})`` with causal self-attention;
    ``logits = LN_f(h_L) W_E^T`` (pre-LN models end with a final norm ``LN_f``; post-LN models, like GPT-1,
    already end in a norm and have none; with ``tie_embeddings=False`` the head has its own matrix).
    Norms, FFN, attention options and RoPE variants follow ``config`` (:class:`GPTConfig`), from GPT-1 to
    Llama 3. ``config.pos_encoding``: ``learned`` (``P`` is the trained table
    ``pos_emb``, GPT-1/2), ``sinusoidal`` (``P`` is the fixed table, buffer ``pos_table``), ``none`` (NoPE),
    or one of the relative schemes applied in every attention layer: ``rope``, ``alibi``, ``t5``, ``kerple``.
    Submodules: ``tok_emb``, ``pos_emb`` (learned only), ``blocks``, ``norm_f``, ``lm_head``.

    Block ``l`` is built for ``config.layer_type(l)``: sliding layers attend within ``sliding_window`` (and rotate
    with the local RoPE base, if any), full layers causally; ``logits = soft_cap(..., final_softcap)`` (Gemma 2).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        if c.pos_encoding == "learned":
            self.pos_emb = nn.Embedding(c.context_length, c.d_model)
        elif c.pos_encoding == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_encoding(c.context_length, c.d_model), persistent=False)
        self.drop = nn.Dropout(c.dropout)
        layer_types = [c.layer_type(i) for i in range(c.n_layers)]
        # one RoPE per layer type, shared by its layers (and their cos/sin table)
        rotary = {kind: c.rotary(kind) for kind in set(layer_types)} if c.pos_encoding == "rope" else {}
        self.blocks = nn.ModuleList(
            TransformerBlock(
                c.d_model, c.n_heads, d_ff=c.ffn_hidden, n_kv_heads=c.n_kv_heads, dropout=c.dropout,
                activation=c.ffn_activation, norm_placement=c.placement, norm=c.norm, eps=c.norm_eps, ffn=c.ffn,
                bias=c.bias, mlp_bias=c.mlp_bias, pos_encoding=c.pos_encoding, rope_base=c.rope_base,
                rotary=rotary.get(kind), kerple_variant=c.kerple_variant, qk_norm=c.qk_norm,
                attn_backend=c.attn_backend, parallel_residual=c.parallel_residual, d_head=c.d_head,
                attn_out_bias=c.attn_out_bias, attn_scale=c.attn_scale, attn_softcap=c.attn_softcap,
                **_latent_attention_and_experts(c, layer),
            )
            for layer, kind in enumerate(layer_types)
        )
        self.layer_types = layer_types
        self.norm_f = make_norm(c.norm, c.d_model, c.norm_eps) if c.placement != "post" else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def aux_loss(self) -> torch.Tensor:
        """The mixture-of-experts balancing terms of the last forward, with their coefficients, to add to the
        training loss (``llmarch.moe.moe_aux_loss``; 0 for a dense model)."""
        return moe_aux_loss(self)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases (norms keep their ones and zeros).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def features(self, idx: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
        """``idx (B, T)`` long token ids -> final hidden states ``(B, T, d_model)`` (after ``norm_f``), which the
        tied head turns into logits. Learned positions limit the total
        length to ``context_length``; every other encoding accepts longer inputs (for length-generalisation
        tests). With a ``KVCache`` (``KVCache(config.n_layers)``, or :meth:`new_kv_cache`, rolling for a model with a
        window), ``idx`` holds only the new tokens: they take the positions after the ones seen, and the logits
        equal those of a full recompute."""
        check_tensor("idx", idx, dims=2)
        if idx.dtype != torch.long:
            raise ValueError(f"idx must hold token ids of dtype torch.long, got {idx.dtype}")
        b, t = idx.shape
        past = 0 if kv_cache is None else kv_cache.length
        if past + t > self.config.context_length and self.config.pos_encoding == "learned":
            raise ValueError(
                f"idx has shape {shape_str(idx.shape)}{f' after {past} cached tokens' if past else ''} but learned "
                f"positions exist only for the context length {self.config.context_length}"
            )
        if idx.numel() and has_values(idx) and (idx.min() < 0 or idx.max() >= self.config.vocab_size):
            raise ValueError(f"idx holds ids in [{int(idx.min())}, {int(idx.max())}] but vocab_size is {self.config.vocab_size}")
        if kv_cache is not None and len(kv_cache.layers) != len(self.blocks):
            raise ValueError(f"the cache has {len(kv_cache.layers)} layers but the model has {len(self.blocks)}")
        if kv_cache is not None and kv_cache.window is not None and (kv_cache.window, kv_cache.sinks) != (
                self.config.sliding_window, self.config.attention_sinks):
            raise ValueError(f"the cache keeps a window of {kv_cache.window} keys with {kv_cache.sinks} sinks but the "
                             f"model has sliding_window={self.config.sliding_window}, attention_sinks="
                             f"{self.config.attention_sinks}: use model.new_kv_cache()")
        if kv_cache is not None and kv_cache.window is not None and self._rolling_cache_problem():
            raise ValueError(f"{self._rolling_cache_problem()}: use model.new_kv_cache(), which keeps every key")
        positions = torch.arange(past, past + t, device=idx.device)
        h = self.tok_emb(idx)
        if self.config.scale_embeddings:  # the factor rounded to the embedding dtype, as Gemma's code does
            h = h * torch.tensor(math.sqrt(self.config.d_model), dtype=h.dtype)
        if self.config.pos_encoding == "learned":
            h = h + self.pos_emb(positions)
        elif self.config.pos_encoding == "sinusoidal":
            table = self.pos_table
            if past + t > len(table):
                table = sinusoidal_encoding(past + t, self.config.d_model, device=h.device)
            h = h + table[positions].to(h.dtype)
        h = self.drop(h)
        window = None
        if self.config.sliding_window is not None:
            keys = None if kv_cache is None else kv_cache.layers[0].key_positions(t, idx.device)
            window = self.sliding_window_mask(past, t, idx.device, key_positions=keys)
        for i, block in enumerate(self.blocks):
            mask = window if self.layer_types[i] == "sliding" else None
            h = block(h, is_causal=mask is None, mask=mask,
                      kv_cache=None if kv_cache is None else kv_cache.layers[i])
        return self.norm_f(h)

    def sliding_window_mask(self, past: int, t: int, device=None, key_positions=None) -> torch.Tensor:
        """Boolean ``(t, T_k)`` mask of Mistral's sliding window for ``t`` new queries after ``past`` tokens:
        query position ``i`` may attend to key position ``j`` iff ``0 <= i - j < sliding_window``, or, with
        ``attention_sinks = S``, iff ``j <= i`` and (``j < S`` or ``i - j < sliding_window - S``)
        (:func:`llmarch.kv_cache.window_sink_mask`). ``key_positions (T_k,)``: those of the keys attended over
        (default ``0 .. past + t - 1``; a rolling cache holds fewer). Book: From GPT-2 to Llama 3, "After Llama 3"."""
        queries = torch.arange(past, past + t, device=device)
        keys = torch.arange(past + t, device=device) if key_positions is None else key_positions
        return window_sink_mask(queries, keys, self.config.sliding_window, self.config.attention_sinks)

    def new_kv_cache(self) -> KVCache:
        """An empty cache for this model: rolling (at most ``sliding_window`` keys per layer, the first
        ``attention_sinks`` tokens kept) when every layer is a sliding one, else one that keeps every key (a
        model with full layers, like Gemma's, needs them all; its sliding layers mask the rest). ALiBi, T5 and
        KERPLE biases with sinks also keep every key: their bias assumes consecutive key positions."""
        rolling = self._rolling_cache_problem() is None
        return KVCache(len(self.blocks), window=self.config.sliding_window if rolling else None,
                       sinks=self.config.attention_sinks if rolling else 0)

    def _rolling_cache_problem(self) -> str | None:
        """Why a rolling cache would give other logits than the full one for this model (``None``: it would not)."""
        if "full" in self.layer_types:
            return "a rolling cache drops keys that this model's full-attention layers need"
        if self.config.attention_sinks and self.config.pos_encoding in ("alibi", "t5", "kerple"):
            return (f"{self.config.pos_encoding}'s bias takes the held keys as consecutive positions, which the "
                    f"sinks of a rolling cache are not")
        return None

    def forward(self, idx: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
        """``idx (B, T)`` long token ids -> logits ``(B, T, vocab_size)`` (see :meth:`features`)."""
        return soft_cap(self.lm_head(self.features(idx, kv_cache)), self.config.final_softcap)


def _latent_attention_and_experts(c: GPTConfig, layer: int) -> dict:
    """The modules that replace a block's self-attention (``c.mla``) and FFN (``c.moe``), as block arguments."""
    out = {}
    if c.mla is not None:
        out["attn_module"] = MultiHeadLatentAttention(c.d_model, c.n_heads, c.mla, rope_base=c.rope_base,
                                                      rope_scaling=c.rope_scaling,
                                                      max_position_embeddings=c.context_length, bias=c.bias)
    if c.moe is not None and c.moe.is_moe_layer(layer):
        out["ffn_module"] = MoEFeedForward(c.d_model, c.moe.d_expert or c.ffn_hidden, activation=c.ffn_activation,
                                           config=c.moe)
    return out


def count_parameters(module: nn.Module, exclude_embeddings: bool = False) -> int:
    """Number of trainable scalars in ``module``; a tensor shared by two submodules (tied weights) counts once.

    Book: The Transformer block, "Counting parameters".

    ``exclude_embeddings=True`` leaves out the weights of every ``nn.Embedding`` (token and position
    embeddings, and an output layer tied to them): Kaplan et al. (2020)'s non-embedding count ``N``.
    """
    embedding_ids = set()
    if exclude_embeddings:
        embedding_ids = {id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    seen, total = set(), 0
    for p in module.parameters():  # parameters() already yields a shared tensor once
        if p.requires_grad and id(p) not in embedding_ids and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def noam_lr(step, d_model: int, warmup: int):
    """The warm-up schedule of Vaswani et al. (2017), eq. (3):

    ``lr(step) = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.

    Book: The Transformer block, "The warm-up schedule".

    Linear growth for ``step <= warmup``, then decay as ``step^-0.5``; the two branches meet at
    ``step = warmup`` where the rate peaks at ``(d_model * warmup)^-0.5``. ``step`` is an int or an
    array of ints >= 0 (step 0 gives 0); returns a float or an array of the same shape.
    """
    if d_model < 1 or warmup < 1:
        raise ValueError(f"noam_lr needs d_model >= 1 and warmup >= 1, got d_model={d_model}, warmup={warmup}")
    steps = np.asarray(step, dtype=float)
    if np.any(steps < 0):
        raise ValueError(f"noam_lr needs step >= 0, got {step}")
    safe = np.maximum(steps, 1.0)
    lr = d_model**-0.5 * np.minimum(safe**-0.5, steps * warmup**-1.5)
    return float(lr) if lr.ndim == 0 else lr


def perplexity(nll) -> float:
    """``PPL = exp(mean negative log-likelihood per token)`` (natural log, so ``nll`` is in nats).

    Book: The Transformer block, "Perplexity".

    ``nll`` is a mean NLL (float) or a tensor/array of per-token NLLs, which is averaged first. A model
    that is uniform over ``V`` tokens has perplexity ``V``.
    """
    value = float(torch.as_tensor(nll, dtype=torch.float64).mean())
    if math.isnan(value) or value < 0:
        raise ValueError(f"a negative log-likelihood must be >= 0, got {value}")
    return math.exp(value)


def load_tiny_gpt(path: Path | str | None = None) -> "GPT":
    """The tiny GPT pretrained on the synthetic corpus, in eval mode. Book: Decoding.

    Loads the committed checkpoint (``llmarch/checkpoints/tiny_gpt.pt``, 0.4 MB); nothing is downloaded.
    Rebuild it with ``python -m llmarch.train`` (``make experiments``), which trains the model again (about a
    minute on a CPU). Loading never imports the trainer.
    """
    path = TINY_GPT_CHECKPOINT if path is None else Path(path)
    if not path.exists():
        raise FileNotFoundError(f"the tiny GPT checkpoint {path} is missing: rebuild it with `python -m llmarch.train`")
    model = GPT(tiny_gpt_config())
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()
