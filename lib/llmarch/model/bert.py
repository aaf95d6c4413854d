"""BERT (Devlin et al., 2019): a bidirectional Transformer encoder with token, position and segment embeddings,
post-LN blocks, and its task heads: masked language modelling, classification on [CLS], extractive QA.

Book: Pretraining objectives, "The BERT encoder".

Conventions (DESIGN.md): token ids ``(B, T)`` of dtype ``long``. ``attention_mask`` follows transformers:
``(B, T)``, 1/True = a real token, 0/False = padding. It becomes the boolean key mask ``(B, 1, 1, T)`` of
DESIGN.md (True = may attend): every query attends to every real token of its row and to no padding. Padded
positions still get outputs (their queries too attend to the real tokens); those outputs mean nothing and belong
in no loss. Module names follow ``llmarch.model.GPT`` (``tok_emb``, ``pos_emb``, ``blocks``); the mapping from
transformers' names is in ``llmarch.model.loading``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmarch._checks import check_tensor, has_values, shape_str
from llmarch.layers import _ACTIVATIONS, TransformerBlock
from llmarch.model.config import check_attn_backend
from llmarch.model.gpt import GPT

__all__ = [
    "BertConfig", "bert_config", "key_padding_mask", "BertEncoder", "BertForMaskedLM", "BertClassificationHead",
    "BertForSequenceClassification", "BertForQuestionAnswering",
]


@dataclass
class BertConfig:
    """Hyper-parameters of the BERT models; transformers' ``BertConfig`` names in brackets.

    Book: Pretraining objectives, "The BERT encoder".

    ``d_model`` [hidden_size], ``n_layers`` [num_hidden_layers], ``n_heads`` [num_attention_heads], ``d_ff``
    [intermediate_size, default ``4 d_model``], ``max_position_embeddings`` (learned positions),
    ``type_vocab_size`` (segments A/B: 2), ``layer_norm_eps`` (BERT: 1e-12), ``dropout`` [hidden_dropout_prob;
    BERT trained with 0.1, the course's tiny models default to 0], ``activation`` [hidden_act: ``gelu`` is the
    exact, erf-based GELU that BERT uses], ``pad_token_id`` (its embedding row starts at zero and receives no
    gradient, as in transformers; ``None``: no such row), ``attn_backend`` (the attention kernel, see
    ``GPTConfig.attn_backend``; the padding mask rules out ``triton``).
    """

    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    max_position_embeddings: int = 128
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.0
    activation: str = "gelu"
    pad_token_id: int | None = 0
    attn_backend: str = "reference"

    def __post_init__(self):
        check_attn_backend("BertConfig", self.attn_backend)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"BertConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"BertConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_ff is not None and self.d_ff < 1:
            raise ValueError(f"BertConfig.d_ff must be positive, got {self.d_ff}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"BertConfig.activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"BertConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"BertConfig.pad_token_id={self.pad_token_id} is not a token id of a vocabulary of "
                             f"{self.vocab_size}")

    @property
    def ffn_hidden(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff


_BERT_SIZES = {"bert-base-uncased": (30522, 768, 12, 12), "bert-large-uncased": (30522, 1024, 24, 16)}


def bert_config(name: str = "bert-base-uncased", **overrides) -> BertConfig:
    """The published BERT sizes (Devlin et al., 2019): base (12 layers, d_model 768, 12 heads, 110M parameters)
    and large (24, 1024, 16; 340M), ``d_ff = 4 d_model``, 512 positions, 2 segments, the 30,522-token uncased
    WordPiece vocabulary, dropout 0.1. ``overrides`` replace fields (a tiny model of the same family).
    Book: Pretraining objectives, "The BERT encoder"."""
    if name not in _BERT_SIZES:
        raise ValueError(f"unknown BERT size {name!r}: use one of {sorted(_BERT_SIZES)}")
    vocab, d_model, n_layers, n_heads = _BERT_SIZES[name]
    fields = dict(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=4 * d_model,
                  max_position_embeddings=512, dropout=0.1)
    return BertConfig(**{**fields, **overrides})


def _check_token_ids(name: str, ids: torch.Tensor, vocab_size: int, max_length: int | None = None) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``ids`` is a long ``(B, T)`` tensor of ids in
    ``[0, vocab_size)`` with ``T <= max_length``."""
    check_tensor(name, ids, dims=2)
    if ids.dtype != torch.long:
        raise ValueError(f"{name} must hold token ids of dtype torch.long, got {ids.dtype}")
    if max_length is not None and ids.shape[1] > max_length:
        raise ValueError(f"{name} has shape {shape_str(ids.shape)} but learned positions exist only for "
                         f"{max_length} tokens")
    if ids.numel() and has_values(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{name} holds ids in [{int(ids.min())}, {int(ids.max())}] but vocab_size is {vocab_size}")


def key_padding_mask(attention_mask: torch.Tensor, shape: tuple[int, int], name: str = "attention_mask"):
    """transformers' padding mask ``(B, T)`` (1/True = real token, 0/False = padding) -> the boolean key mask
    ``(B, 1, 1, T)`` of DESIGN.md (True = may attend), which broadcasts over heads and queries.

    Book: Pretraining objectives, "The BERT encoder".

    ``shape`` is the ``(B, T)`` of the ids it belongs to. ``attention_mask`` must be bool or an integer tensor
    of zeros and ones, and every row needs a real token (a row of padding only has nothing to attend to).
    """
    check_tensor(name, attention_mask, dims=2)
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {shape_str(attention_mask.shape)} but the ids have shape "
                         f"{shape_str(shape)}")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise ValueError(f"{name} must be bool or integer (1 = real token, 0 = padding), got {attention_mask.dtype}")
    if attention_mask.dtype != torch.bool:
        if attention_mask.numel() and has_values(attention_mask) and not (
                (attention_mask == 0) | (attention_mask == 1)).all():
            raise ValueError(f"{name} must hold only 0 (padding) and 1 (real token)")
        attention_mask = attention_mask.bool()
    empty = ~attention_mask.any(dim=1)
    if has_values(empty) and empty.any():
        raise ValueError(f"{name} marks every position of row(s) {empty.nonzero().flatten().tolist()} as padding")
    return attention_mask[:, None, None, :]


class BertEncoder(nn.Module):
    """BERT's embeddings and post-LN encoder blocks: ids -> contextual hidden states.

    Book: Pretraining objectives, "The BERT encoder".

    ``h_0 = LN_emb(E_tok[idx] + E_seg[token_type_ids] + E_pos[0..T-1])``, then for each layer (post-LN,
    bidirectional, :class:`llmarch.layers.TransformerBlock` with ``norm_first=False``):
    ``h = LN_1(h + SelfAttn(h, key mask))``; ``h = LN_2(h + W_2 GELU(W_1 h + b_1) + b_2)``.
    Every linear map has a bias; every norm is a LayerNorm with eps ``layer_norm_eps``. In eval mode this is
    transformers' ``BertModel`` without its pooler; in training, dropout also acts inside the FFN (after the
    GELU), where BERT has none. Submodules: ``tok_emb``, ``pos_emb``, ``type_emb``, ``norm_emb``, ``blocks``.
    Fine-tuning starts from a pretrained encoder by copying it:
    ``clf.bert.load_state_dict(mlm.bert.state_dict())``.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_token_id)
        self.pos_emb = nn.Embedding(c.max_position_embeddings, c.d_model)
        self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model)
        self.norm_emb = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, d_ff=c.ffn_hidden, dropout=c.dropout, activation=c.activation,
                             norm_first=False, eps=c.layer_norm_eps, attn_backend=c.attn_backend)
            for _ in range(c.n_layers)
        )
        # BERT's initialisation is GPT's (N(0, 0.02) weights, zero biases), with a zero padding embedding.
        self.apply(GPT._init_weights)
        if c.pad_token_id is not None:
            nn.init.zeros_(self.tok_emb.weight.data[c.pad_token_id])

    def forward(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``idx (B, T)`` long; ``token_type_ids (B, T)`` long segment ids in ``[0, type_vocab_size)`` (default
        all 0, segment A); ``attention_mask (B, T)`` 1 = real token, 0 = padding (default: no padding)
        -> hidden states ``(B, T, d_model)``."""
        c = self.config
        _check_token_ids("idx", idx, c.vocab_size, c.max_position_embeddings)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(idx)
        _check_token_ids("token_type_ids", token_type_ids, c.type_vocab_size)
        if token_type_ids.shape != idx.shape:
            raise ValueError(f"token_type_ids has shape {shape_str(token_type_ids.shape)} but idx has shape "
                             f"{shape_str(idx.shape)}")
        mask = None if attention_mask is None else key_padding_mask(attention_mask, idx.shape).to(idx.device)
        positions = torch.arange(idx.shape[1], device=idx.device)
        h = self.tok_emb(idx) + self.type_emb(token_type_ids) + self.pos_emb(positions)
        h = self.drop(self.norm_emb(h))
        for block in self.blocks:
            h = block(h, mask=mask)
        return h


class _BertWithHead(nn.Module):
    """A :class:`BertEncoder` (``bert``) under a task head; ``encode`` gives the encoder's hidden states."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertEncoder(config)

    def encode(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states ``(B, T, d_model)`` of the encoder (the features of feature-based transfer).
        Book: Pretraining objectives, "Fine-tuning, feature extraction and prompting"."""
        return self.bert(idx, token_type_ids, attention_mask)

    def _check_hidden(self, hidden: torch.Tensor) -> None:
        check_tensor("hidden", hidden, dims=3, floating=True)
        if hidden.shape[-1] != self.config.d_model:
            raise ValueError(f"hidden has shape {shape_str(hidden.shape)} but d_model is {self.config.d_model}")


class BertForMaskedLM(_BertWithHead):
    """BERT with its masked-language-modelling head (transformers' ``BertForMaskedLM``).

    Book: Pretraining objectives, "The BERT encoder".

    ``logits = LN_t(GELU(h W_t + b_t)) E_tok^T + b_out``: a transform layer (``transform``: dense,
    activation, ``transform_norm``: LayerNorm), then a decoder (``decoder``) whose weight *is* the token
    embedding ``bert.tok_emb.weight`` (tied) and whose bias ``b_out`` is its own.
    """

    def __init__(self, config: BertConfig):
        super().__init__(config)
        c = config
        self.transform = nn.Linear(c.d_model, c.d_model)
        self.transform_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.decoder = nn.Linear(c.d_model, c.vocab_size)
        GPT._init_weights(self.transform)
        nn.init.zeros_(self.decoder.bias)
        self.decoder.weight = self.bert.tok_emb.weight

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MLM head alone: hidden states ``(B, T, d_model)`` -> logits ``(B, T, vocab_size)`` (to share one
        encoder pass between this head and another, e.g. NSP's :class:`BertClassificationHead`)."""
        self._check_hidden(hidden)
        return self.decoder(self.transform_norm(_ACTIVATIONS[self.config.activation](self.transform(hidden))))

    def forward(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``idx``, ``token_type_ids``, ``attention_mask`` as in :meth:`BertEncoder.forward` -> MLM logits
        ``(B, T, vocab_size)``: ``logits[b, t]`` scores the token at position ``t`` given the whole sequence."""
        return self.mlm_logits(self.encode(idx, token_type_ids, attention_mask))


class BertClassificationHead(nn.Module):
    """BERT's sequence-level head on the [CLS] position (position 0): the pooler, then a linear classifier.

    Book: Pretraining objectives, "Fine-tuning, feature extraction and prompting".

    ``pooled = tanh(h[:, 0] W_p + b_p)``; ``logits = dropout(pooled) W_c + b_c``, as transformers'
    ``BertForSequenceClassification`` computes it; with ``num_labels=2`` it is also the next-sentence-prediction
    head. Submodules: ``pooler`` (``Linear(d_model, d_model)``), ``classifier`` (``Linear(d_model, num_labels)``).
    Shapes: hidden ``(B, T, d_model)`` -> ``(B, num_labels)``.
    """

    def __init__(self, config: BertConfig, num_labels: int = 2):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be positive, got {num_labels}")
        self.config, self.num_labels = config, num_labels
        self.pooler = nn.Linear(config.d_model, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, num_labels)
        self.apply(GPT._init_weights)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """``tanh(h[:, 0] W_p + b_p)``: hidden ``(B, T, d_model)`` -> ``(B, d_model)``."""
        check_tensor("hidden", hidden, dims=3, floating=True)
        if hidden.shape[-1] != self.config.d_model or hidden.shape[1] < 1:
            raise ValueError(f"hidden has shape {shape_str(hidden.shape)}: expected (B, T >= 1, {self.config.d_model})")
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.pool(hidden)))


class BertForSequenceClassification(_BertWithHead):
    """BERT fine-tuned for a sequence label (transformers' ``BertForSequenceClassification``): the encoder
    (``bert``) and a :class:`BertClassificationHead` (``head``) on [CLS].

    Book: Pretraining objectives, "Fine-tuning, feature extraction and prompting".
    """

    def __init__(self, config: BertConfig, num_labels: int = 2):
        super().__init__(config)
        self.num_labels = num_labels
        self.head = BertClassificationHead(config, num_labels)

    def forward(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Inputs as in :meth:`BertEncoder.forward` -> class logits ``(B, num_labels)``."""
        return self.head(self.encode(idx, token_type_ids, attention_mask))


class BertForQuestionAnswering(_BertWithHead):
    """BERT for extractive question answering (transformers' ``BertForQuestionAnswering``): a linear layer
    ``qa_outputs`` (``Linear(d_model, 2)``) gives each position a start and an end score,
    ``s_t = h_t . S + b_S`` and ``e_t = h_t . E + b_E`` (the start and end vectors ``S``, ``E`` of Devlin et al.).

    Book: Pretraining objectives, "Extractive question answering".

    The predicted answer is the span ``(i, j)``, ``i <= j``, maximising ``s_i + e_j``
    (``llmarch.objectives.best_span``). Scores at padded positions are computed but mean nothing.
    """

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.d_model, 2)
        GPT._init_weights(self.qa_outputs)

    def forward(self, idx: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs as in :meth:`BertEncoder.forward` -> ``(start_logits, end_logits)``, each ``(B, T)``."""
        scores = self.qa_outputs(self.encode(idx, token_type_ids, attention_mask))
        return scores[..., 0], scores[..., 1]
