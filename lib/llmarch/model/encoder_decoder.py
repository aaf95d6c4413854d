"""An encoder-decoder Transformer (Vaswani et al., 2017; the family of T5 and BART) built from
:class:`llmarch.layers.TransformerBlock`: a bidirectional encoder, and a decoder with causal self-attention and
cross-attention to the encoder's output.

Book: Pretraining objectives, "Encoder-decoder models".

Conventions: ``src_ids (B, S)`` and ``tgt_in_ids (B, U)`` are long token ids; ``src_mask (B, S)`` follows
transformers (1/True = real token, 0/False = padding; see :func:`llmarch.model.bert.key_padding_mask`). Training
pairs ``(inputs, targets)`` such as T5's span corruption (``inputs (B, S)`` with sentinels, ``targets (B, U)``:
each sentinel followed by its span) are fed as ``forward(inputs, shift_right(targets, start_id))`` with the loss
``cross_entropy(logits, targets, ignore_index=-100)``: ``logits[:, u]`` scores ``targets[:, u]`` given the whole
source and ``targets[:, :u]``. Targets are right-padded with -100; the decoder is causal, so padding at the end
changes nothing before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmarch._checks import check_tensor, has_values, shape_str
from llmarch.kv_cache import KVCache
from llmarch.layers import TransformerBlock
from llmarch.model.bert import _check_token_ids, key_padding_mask
from llmarch.model.config import check_attn_backend
from llmarch.model.gpt import GPT

__all__ = ["EncoderDecoderConfig", "EncoderDecoder", "shift_right"]


@dataclass
class EncoderDecoderConfig:
    """Hyper-parameters of :class:`EncoderDecoder`. Book: Pretraining objectives, "Encoder-decoder models".

    ``max_source_length`` / ``max_target_length``: sizes of the learned position tables of the encoder and the
    decoder; ``n_encoder_layers`` / ``n_decoder_layers``; ``d_ff`` defaults to ``4 d_model``; ``activation`` of
    the FFN (``gelu`` exact, ``gelu_tanh``, ``relu``, ``silu``); ``norm_eps`` of the LayerNorms;
    ``decoder_start_token_id``: the first decoder input (T5 uses its pad id, 0); ``pad_token_id``: what
    :meth:`EncoderDecoder.generate` emits after a row's end-of-sequence token; ``attn_backend``: the kernel of
    every attention (self and cross), see ``GPTConfig.attn_backend``.
    """

    vocab_size: int
    max_source_length: int = 128
    max_target_length: int = 128
    d_model: int = 128
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    dropout: float = 0.0
    activation: str = "gelu"
    norm_eps: float = 1e-5
    pad_token_id: int = 0
    decoder_start_token_id: int = 0
    attn_backend: str = "reference"

    def __post_init__(self):
        check_attn_backend("EncoderDecoderConfig", self.attn_backend)
        for name in ("vocab_size", "max_source_length", "max_target_length", "d_model", "n_encoder_layers",
                     "n_decoder_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"EncoderDecoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"EncoderDecoderConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"EncoderDecoderConfig.dropout must be in [0, 1), got {self.dropout}")
        for name in ("pad_token_id", "decoder_start_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"EncoderDecoderConfig.{name}={getattr(self, name)} is not a token id of a "
                                 f"vocabulary of {self.vocab_size}")


def shift_right(targets: torch.Tensor, start_token_id: int, pad_token_id: int = 0) -> torch.Tensor:
    """The decoder input of teacher forcing: ``targets (B, U)`` shifted one step right, ``start_token_id`` first.

    Book: Pretraining objectives, "Encoder-decoder models".

    ``out[:, 0] = start``, ``out[:, u] = targets[:, u - 1]``; ignored labels (-100) become ``pad_token_id``, as
    T5 does. Example: targets ``[[s0, 7, 8, s1, 9]]``, start 0 -> ``[[0, s0, 7, 8, s1]]``.
    """
    check_tensor("targets", targets, dims=2)
    if targets.dtype != torch.long:
        raise ValueError(f"targets must hold token ids of dtype torch.long, got {targets.dtype}")
    shifted = torch.full_like(targets, start_token_id)
    shifted[:, 1:] = targets[:, :-1]
    return shifted.masked_fill(shifted == -100, pad_token_id)


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer with pre-LN blocks, learned positions and one shared, tied embedding.

    Book: Pretraining objectives, "Encoder-decoder models".

    Encoder: ``e_0 = E[src] + P_src``; ``e_l = Block_l(e_{l-1})`` (bidirectional self-attention over the real
    source tokens); ``memory = LN_enc(e_L)``. Decoder: ``d_0 = E[tgt_in] + P_tgt``;
    ``d_l = Block_l(d_{l-1}, memory)`` with causal self-attention, then cross-attention to ``memory`` (padded
    source positions masked out); ``logits = LN_dec(d_L) E^T``. Each block is pre-LN,
    ``x = x + SubLayer(LN(x))``, as in T5: the residual stream is never normalised, so gradients reach the
    embeddings unattenuated and small models train at a constant learning rate without warm-up (Xiong et al.,
    2020); the final ``LN_enc``/``LN_dec`` normalise each stack's output. Positions are learned absolute tables
    (as in BART); T5's relative buckets would need a bidirectional bias in the encoder. The token embedding ``E``
    is shared by the encoder, the decoder and the output layer, as in T5.
    Submodules: ``tok_emb``, ``src_pos_emb``, ``tgt_pos_emb``, ``encoder_blocks``, ``encoder_norm``,
    ``decoder_blocks`` (with ``cross_attn``), ``decoder_norm``, ``lm_head``.
    """

    def __init__(self, config: EncoderDecoderConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.src_pos_emb = nn.Embedding(c.max_source_length, c.d_model)
        self.tgt_pos_emb = nn.Embedding(c.max_target_length, c.d_model)
        self.drop = nn.Dropout(c.dropout)

        def block(cross_attention: bool) -> TransformerBlock:
            return TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, dropout=c.dropout, activation=c.activation,
                                    norm_first=True, cross_attention=cross_attention, eps=c.norm_eps,
                                    attn_backend=c.attn_backend)

        self.encoder_blocks = nn.ModuleList(block(False) for _ in range(c.n_encoder_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.decoder_blocks = nn.ModuleList(block(True) for _ in range(c.n_decoder_layers))
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(GPT._init_weights)
        self.lm_head.weight = self.tok_emb.weight

    def _source_mask(self, src_mask: torch.Tensor | None, shape) -> torch.Tensor | None:
        return None if src_mask is None else key_padding_mask(src_mask, shape, "src_mask")

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src_ids (B, S)``, ``src_mask (B, S)`` (1 = real token, 0 = padding) -> ``memory (B, S, d_model)``."""
        c = self.config
        _check_token_ids("src_ids", src_ids, c.vocab_size, c.max_source_length)
        mask = self._source_mask(src_mask, src_ids.shape)
        positions = torch.arange(src_ids.shape[1], device=src_ids.device)
        h = self.drop(self.tok_emb(src_ids) + self.src_pos_emb(positions))
        for block in self.encoder_blocks:
            h = block(h, mask=mask)
        return self.encoder_norm(h)

    def decode(self, tgt_in_ids: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None = None,
               kv_cache: KVCache | None = None) -> torch.Tensor:
        """``tgt_in_ids (B, U)`` decoder inputs, ``memory (B, S, d_model)`` from :meth:`encode`, ``src_mask (B, S)``
        -> logits ``(B, U, vocab_size)``. With a ``KVCache(config.n_decoder_layers)``, ``tgt_in_ids`` holds only
        the new tokens, which take the positions after the cached ones; the logits equal a full recompute's."""
        c = self.config
        past = 0 if kv_cache is None else kv_cache.length
        _check_token_ids("tgt_in_ids", tgt_in_ids, c.vocab_size)
        if past + tgt_in_ids.shape[1] > c.max_target_length:
            raise ValueError(f"tgt_in_ids has shape {shape_str(tgt_in_ids.shape)}"
                             f"{f' after {past} cached tokens' if past else ''} but learned target positions exist "
                             f"only for max_target_length={c.max_target_length}")
        check_tensor("memory", memory, dims=3, floating=True)
        if memory.shape[0] != tgt_in_ids.shape[0] or memory.shape[2] != c.d_model:
            raise ValueError(f"memory has shape {shape_str(memory.shape)} but tgt_in_ids has shape "
                             f"{shape_str(tgt_in_ids.shape)}: expected ({tgt_in_ids.shape[0]}, S, {c.d_model})")
        if kv_cache is not None and len(kv_cache.layers) != len(self.decoder_blocks):
            raise ValueError(f"the cache has {len(kv_cache.layers)} layers but the decoder has "
                             f"{len(self.decoder_blocks)}")
        mask = self._source_mask(src_mask, memory.shape[:2])
        positions = torch.arange(past, past + tgt_in_ids.shape[1], device=tgt_in_ids.device)
        h = self.drop(self.tok_emb(tgt_in_ids) + self.tgt_pos_emb(positions))
        for i, block in enumerate(self.decoder_blocks):
            h = block(h, context=memory, is_causal=True, context_mask=mask,
                      kv_cache=None if kv_cache is None else kv_cache.layers[i])
        return self.lm_head(self.decoder_norm(h))

    def forward(self, src_ids: torch.Tensor, tgt_in_ids: torch.Tensor,
                src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src_ids (B, S)``, ``tgt_in_ids (B, U)`` (e.g. ``shift_right(targets, start)``), ``src_mask (B, S)``
        -> logits ``(B, U, vocab_size)``; ``logits[:, u]`` scores the target token at position ``u``."""
        return self.decode(tgt_in_ids, self.encode(src_ids, src_mask), src_mask)

    @torch.no_grad()
    def generate(self, src_ids: torch.Tensor, max_new_tokens: int, src_mask: torch.Tensor | None = None,
                 eos_token_id: int | None = None, use_cache: bool = True) -> torch.Tensor:
        """Greedy decoding: ``src_ids (B, S)`` -> generated ids ``(B, n)``, without the start token.

        Book: Pretraining objectives, "Encoder-decoder models".

        The source is encoded once; the decoder starts from ``decoder_start_token_id`` and appends
        ``argmax_v logits[:, -1, v]`` at each step. After a row emits ``eos_token_id`` it emits
        ``pad_token_id``; decoding stops when every row has ended or after ``max_new_tokens`` (``n <=
        max_new_tokens``). ``use_cache=False`` recomputes the whole prefix at every step (same tokens, slower).
        """
        c = self.config
        if max_new_tokens < 1 or max_new_tokens > c.max_target_length:
            raise ValueError(f"max_new_tokens must be in [1, max_target_length={c.max_target_length}], "
                             f"got {max_new_tokens}")
        if eos_token_id is not None and not 0 <= eos_token_id < c.vocab_size:
            raise ValueError(f"eos_token_id={eos_token_id} is not a token id of a vocabulary of {c.vocab_size}")
        memory = self.encode(src_ids, src_mask)
        batch = src_ids.shape[0]
        decoder_in = torch.full((batch, 1), c.decoder_start_token_id, dtype=torch.long, device=src_ids.device)
        cache = KVCache(c.n_decoder_layers) if use_cache else None
        done = torch.zeros(batch, dtype=torch.bool, device=src_ids.device)
        new_tokens = []
        for _ in range(max_new_tokens):
            step_in = decoder_in[:, -1:] if use_cache else decoder_in
            token = self.decode(step_in, memory, src_mask, kv_cache=cache)[:, -1].argmax(dim=-1)
            token = token.masked_fill(done, c.pad_token_id)
            new_tokens.append(token)
            decoder_in = torch.cat([decoder_in, token[:, None]], dim=1)
            if eos_token_id is not None:
                done |= token == eos_token_id
                if has_values(done) and done.all():  # a meta tensor has no values to stop on
                    break
        return torch.stack(new_tokens, dim=1)
