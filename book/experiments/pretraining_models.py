"""The models of the pretraining-objectives study (``pretraining_objectives.py``): one pre-LN encoder built
from llmarch's blocks, the embeddings ELECTRA's two halves share, and one module per objective (causal LM, MLM,
MLM with next-sentence prediction, T5's span corruption, ELECTRA). Each objective samples its own batches and
returns its loss, so the training loop and the FLOP counter treat them all alike.

Book: Pretraining objectives, "Experiments".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmarch.data import get_batch
from llmarch.layers import TransformerBlock
from llmarch.model import (GPT, BertClassificationHead, BertConfig, BertForMaskedLM, EncoderDecoder,
                           EncoderDecoderConfig, GPTConfig, shift_right)
from llmarch.objectives import (electra_corrupt, mlm_loss, mlm_mask, random_spans_noise_mask, span_corruption_from_mask,
                               t5_span_counts)
from pretraining_tasks import CLS, IGNORE, MASK, SENTINELS, SEP, VOCAB, WINDOW, accuracy, with_cls

# Models: width 64, 2 layers, 4 heads (the encoder-decoder has 2 + 2 layers); ELECTRA's generator is narrower.
D_MODEL, N_LAYERS, N_HEADS = 64, 2, 4
GENERATOR_D_MODEL, GENERATOR_HEADS = 32, 2
LAYER_NORM_EPS = 1e-12   # BERT's
BATCH = 32               # pretraining examples per step
ELECTRA_WEIGHT = 50.0    # lambda of Clark et al. (2020): L = L_MLM(generator) + lambda L_RTD(discriminator)


def t5_raw_words(source_length: int) -> int:
    """The number of words whose span corruption (15% noise, mean span 3) leaves ``source_length - 1`` tokens
    (the encoder adds [CLS]): ``n - num_noise(n) + num_spans(n) = source_length - 1``, the smallest such ``n``
    (T5 picks its raw lengths the same way, so that no source needs padding)."""
    for n in range(2, 4 * source_length):
        num_noise, num_spans = t5_span_counts(n, 0.15, 3.0)
        if n - num_noise + num_spans == source_length - 1:
            return n
    raise ValueError(f"no raw length gives sources of exactly {source_length} tokens")


T5_WORDS = t5_raw_words(WINDOW + 1)   # 34


# --------------------------------------------------------------------------------------------------------------
# The objectives. Each holds the modules it trains, samples its own batches (from its training data, or from
# ``data`` when given: held-out text), and exposes the encoder whose features the downstream tasks use
# (``backbone``: ids (B, T) -> hidden states (B, T, D_MODEL)).
# --------------------------------------------------------------------------------------------------------------

class Backbone(nn.Module):
    """``ids -> getattr(model, method)(ids)``: the hidden states a pretrained model offers downstream."""

    def __init__(self, model: nn.Module, method: str):
        super().__init__()
        self.model, self.method = model, method

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.method)(ids)


def bert_config(d_model: int = D_MODEL, n_heads: int = N_HEADS) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, d_model=d_model, n_layers=N_LAYERS, n_heads=n_heads,
                      max_position_embeddings=WINDOW + 1, pad_token_id=None)


def encoder_decoder(n_decoder_layers: int) -> EncoderDecoder:
    return EncoderDecoder(EncoderDecoderConfig(
        vocab_size=VOCAB, max_source_length=WINDOW + 1, max_target_length=WINDOW + 1, d_model=D_MODEL,
        n_encoder_layers=N_LAYERS, n_decoder_layers=n_decoder_layers, n_heads=N_HEADS, decoder_start_token_id=CLS))


def special_positions(ids: torch.Tensor) -> torch.Tensor:
    """True at [CLS] and [SEP], which are never masked."""
    return (ids == CLS) | (ids == SEP)


class Embeddings(nn.Module):
    """BERT's input layer at width ``width``: ``LN(E_tok[ids] + E_seg[token_type_ids] + E_pos[0..T-1])``,
    ids ``(B, T)`` -> ``(B, T, width)``. ELECTRA's generator and discriminator share one."""

    def __init__(self, width: int):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, width)
        self.pos_emb = nn.Embedding(WINDOW + 1, width)
        self.type_emb = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.apply(GPT._init_weights)

    def forward(self, ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.norm(self.tok_emb(ids) + self.type_emb(token_type_ids) + self.pos_emb(positions))


class PreLNEncoder(nn.Module):
    """A bidirectional pre-LN encoder on (possibly shared) :class:`Embeddings`: a linear map to ``d_model``
    if the embeddings are narrower or wider (ELECTRA's generator), then ``N_LAYERS`` blocks
    ``h = h + Attn(LN(h))``, ``h = h + FFN(LN(h))`` (GELU, ``d_ff = 4 d_model``) and a final LN.
    ids ``(B, T)`` -> hidden states ``(B, T, d_model)``. It differs from BERT's post-LN encoder
    (:class:`llmarch.model.BertEncoder`) only in where the block norms sit and in the final LN."""

    def __init__(self, embeddings: Embeddings, d_model: int, n_heads: int):
        super().__init__()
        self.embeddings = embeddings
        width = embeddings.tok_emb.embedding_dim
        self.project = nn.Identity() if width == d_model else nn.Linear(width, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, d_ff=4 * d_model, activation="gelu",
                                                     norm_first=True, eps=LAYER_NORM_EPS) for _ in range(N_LAYERS))
        self.norm = nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)
        for module in (self.project, self.blocks):
            module.apply(GPT._init_weights)

    def forward(self, ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.project(self.embeddings(ids, token_type_ids))
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


class MLMHead(nn.Module):
    """BERT's MLM head, tied to the embeddings: ``LN(GELU(h W_t + b_t)) E_tok^T + b_out``; ``W_t`` maps
    ``d_model`` to the embedding width (as ELECTRA's generator does). ``(B, T, d_model) -> (B, T, VOCAB)``."""

    def __init__(self, embeddings: Embeddings, d_model: int):
        super().__init__()
        self.embeddings = embeddings
        width = embeddings.tok_emb.embedding_dim
        self.transform = nn.Linear(d_model, width)
        self.norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.bias = nn.Parameter(torch.zeros(VOCAB))
        GPT._init_weights(self.transform)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.transform(hidden))) @ self.embeddings.tok_emb.weight.T + self.bias


class CausalLM(nn.Module):
    """GPT: next-token prediction on ``[CLS] + 31`` words; every word is a target (the first given [CLS] only)."""

    family = "decoder"

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data
        self.gpt = GPT(GPTConfig(vocab_size=VOCAB, context_length=WINDOW + 1, d_model=D_MODEL, n_layers=N_LAYERS,
                                 n_heads=N_HEADS))

    def loss(self, generator, data: torch.Tensor | None = None):
        ids = with_cls(get_batch(self.data if data is None else data, BATCH, WINDOW, generator)[0])
        logits = self.gpt(ids)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def backbone(self) -> nn.Module:
        return Backbone(self.gpt, "features")

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``log p(w_t | [CLS], w_1 .. w_{t-1})`` for each word: ``(N, WINDOW)``."""
        log_probs = torch.log_softmax(self.gpt(ids)[:, :-1], dim=-1)
        return log_probs.gather(-1, ids[:, 1:, None])[..., 0]


class MaskedLM(nn.Module):
    """MLM with ``mask_prob`` and 80/10/10 on ``[CLS] + 31`` words (or on NSP pairs, see :class:`NextSentence`);
    the loss covers the selected words only (``mlm_loss``). The encoder is pre-LN (:class:`PreLNEncoder` with
    :class:`MLMHead`), or with ``post_ln=True`` BERT's post-LN encoder and MLM head (the control)."""

    family = "encoder"

    def __init__(self, data: torch.Tensor | None, mask_prob: float = 0.15, post_ln: bool = False):
        super().__init__()
        self.data, self.mask_prob, self.post_ln = data, mask_prob, post_ln
        if post_ln:
            self.bert = BertForMaskedLM(bert_config())
        else:
            self.encoder = PreLNEncoder(Embeddings(D_MODEL), D_MODEL, N_HEADS)
            self.head = MLMHead(self.encoder.embeddings, D_MODEL)

    def hidden(self, ids: torch.Tensor, token_type_ids=None) -> torch.Tensor:
        return self.bert.encode(ids, token_type_ids) if self.post_ln else self.encoder(ids, token_type_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.bert.mlm_logits(hidden) if self.post_ln else self.head(hidden)

    def mlm(self, ids: torch.Tensor, generator, mask_prob: float, token_type_ids=None):
        inputs, labels = mlm_mask(ids, MASK, VOCAB, special_positions(ids), mask_prob, generator)
        if not (labels != IGNORE).any():  # a 5% rate can select nothing in a tiny batch: keep one target
            labels[0, 1] = ids[0, 1]
        hidden = self.hidden(inputs, token_type_ids)
        return mlm_loss(self.logits(hidden), labels), hidden

    def loss(self, generator, data: torch.Tensor | None = None):
        ids = with_cls(get_batch(self.data if data is None else data, BATCH, WINDOW, generator)[0])
        return self.mlm(ids, generator, self.mask_prob)[0]

    def backbone(self) -> nn.Module:
        return Backbone(self.bert, "encode") if self.post_ln else self.encoder

    @torch.no_grad()
    def eval_mlm_loss(self, ids: torch.Tensor, mask_prob: float, seed: int, token_type_ids=None) -> float:
        """MLM loss on held-out ``ids`` with a fixed mask (``seed``)."""
        generator = torch.Generator().manual_seed(seed)
        return self.mlm(ids, generator, mask_prob, token_type_ids)[0].item()

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """Pseudo-log-likelihood terms: ``log p(w_t | all other words)``, with ``w_t`` alone replaced by [MASK]."""
        out = []
        for t in range(1, ids.shape[1]):
            masked = ids.clone()
            masked[:, t] = MASK
            log_probs = torch.log_softmax(self.logits(self.hidden(masked))[:, t], dim=-1)
            out.append(log_probs.gather(-1, ids[:, t, None])[:, 0])
        return torch.stack(out, dim=1)


class NextSentence(MaskedLM):
    """BERT's input format, ``[CLS] A [SEP] B [SEP]`` with segment embeddings (``pairs`` from ``nsp_pairs``),
    with the MLM loss plus, if ``with_nsp``, the next-sentence loss on [CLS] (BERT), or MLM alone."""

    def __init__(self, pairs: dict, with_nsp: bool):
        super().__init__(data=None)
        self.pairs, self.with_nsp = pairs, with_nsp
        self.nsp_head = BertClassificationHead(bert_config(), num_labels=2) if with_nsp else None

    def loss(self, generator, data: dict | None = None):
        pairs = self.pairs if data is None else data
        rows = torch.randint(len(pairs["input_ids"]), (BATCH,), generator=generator)
        ids, types = pairs["input_ids"][rows], pairs["token_type_ids"][rows]
        loss, hidden = self.mlm(ids, generator, self.mask_prob, types)
        if self.with_nsp:
            loss = loss + F.cross_entropy(self.nsp_head(hidden), pairs["labels"][rows])
        return loss

    @torch.no_grad()
    def nsp_accuracy(self, pairs: dict) -> float:
        hidden = self.hidden(pairs["input_ids"], pairs["token_type_ids"])
        return accuracy(self.nsp_head(hidden), pairs["labels"])


def t5_noise_mask(generator) -> torch.Tensor:
    """A noise mask ``(T5_WORDS,)`` of T5's ``random_spans_noise_mask`` (15% noise, mean span 3), rolled by a
    uniform offset (T5's ``random_roll``) so that every position holds words in some sources and noise in
    others. An offset that would cut a noise span in two is redrawn, with the mask, so that every source keeps
    ``num_spans`` spans and its length; the number of such offsets, ``num_noise - num_spans``, is the same for
    every mask, so the redraw leaves the masks and the other offsets equally likely."""
    while True:
        mask = random_spans_noise_mask(T5_WORDS, 0.15, 3.0, generator, random_roll=True)
        if not (mask[0] and mask[-1]):
            return mask


def t5_target_length() -> int:
    """The longest target: the noise words, a sentinel per span, and a closing sentinel."""
    num_noise, num_spans = t5_span_counts(T5_WORDS, 0.15, 3.0)
    return num_noise + num_spans + 1


class SpanCorruption(nn.Module):
    """T5: span corruption (15% noise, mean span 3, rolled masks: :func:`t5_noise_mask`) of ``T5_WORDS`` = 34
    words; the encoder reads ``[CLS] + corrupted`` words (32 tokens, as long as the downstream inputs), the
    decoder predicts the sentinel-delimited spans (and a closing sentinel when the source ends with words;
    the shorter targets are padded with ignored labels). 2 encoder + 2 decoder layers, pre-LN."""

    family = "encoder-decoder"

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data
        self.t5 = encoder_decoder(n_decoder_layers=N_LAYERS)

    def sources_and_targets(self, generator, data: torch.Tensor | None = None):
        """A batch: encoder inputs ``(BATCH, WINDOW + 1)`` and decoder targets ``(BATCH, 8)`` (-100 = padding)."""
        words = get_batch(self.data if data is None else data, BATCH, T5_WORDS, generator)[0]
        return t5_format(words, generator)

    def loss(self, generator, data: torch.Tensor | None = None):
        sources, targets = self.sources_and_targets(generator, data)
        logits = self.t5(sources, shift_right(targets, CLS))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE)

    def backbone(self) -> nn.Module:
        return Backbone(self.t5, "encode")

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``log p(w_t | the other words)`` in pretraining's format: two one-word noise spans, ``w_t`` and the
        word 15 positions away (``t + 15`` or ``t - 15``), become <S0> and <S1> from left to right, so the
        source has 32 tokens and two sentinels as in pretraining; the target is ``<S0> x <S1> y`` (and <S2>
        unless the second span is the last word), and ``w_t`` is read where the decoder predicts it."""
        width = ids.shape[1] - 1
        out = []
        for t in range(1, width + 1):
            u = t + 15 if t + 15 <= width else t - 15
            first, second = min(t, u), max(t, u)
            source = ids.clone()
            source[:, first], source[:, second] = SENTINELS[0], SENTINELS[1]
            decoder_in = torch.stack([torch.full_like(ids[:, 0], CLS), torch.full_like(ids[:, 0], SENTINELS[0]),
                                      ids[:, first], torch.full_like(ids[:, 0], SENTINELS[1])], dim=1)
            read = 1 if t == first else 3
            log_probs = torch.log_softmax(self.t5(source, decoder_in)[:, read], dim=-1)
            out.append(log_probs.gather(-1, ids[:, t, None])[:, 0])
        return torch.stack(out, dim=1)


def t5_format(words: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Span corruption of each row of ``words (B, T5_WORDS)`` with :func:`t5_noise_mask`: sources ``(B, 32)``
    (``[CLS]`` first) and targets ``(B, t5_target_length())``, padded with -100."""
    sources, targets = [], torch.full((len(words), t5_target_length()), IGNORE)
    for row, w in enumerate(words):
        source, target = span_corruption_from_mask(w, t5_noise_mask(generator), SENTINELS)
        sources.append(source)
        targets[row, : len(target)] = target
    return with_cls(torch.stack(sources)), targets


class Electra(nn.Module):
    """ELECTRA: a small pre-LN MLM generator (width 32) fills the [MASK]s of 15% of the words with samples;
    the discriminator (the pre-LN encoder of ``mlm``) labels every word as original or replaced. Both read
    the same :class:`Embeddings` (width 64; the generator projects them to 32, and its MLM head is tied to
    them), as in Clark et al. (2020). Loss ``L_MLM + ELECTRA_WEIGHT * L_RTD``, one loss whose gradient is
    clipped as a whole (as ELECTRA's released code does); sampling passes no gradient from the
    discriminator to the generator, but the shared embeddings get the gradients of both losses."""

    family = "encoder"

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data
        embeddings = Embeddings(D_MODEL)
        self.discriminator = PreLNEncoder(embeddings, D_MODEL, N_HEADS)
        self.generator_encoder = PreLNEncoder(embeddings, GENERATOR_D_MODEL, GENERATOR_HEADS)
        self.generator_head = MLMHead(embeddings, GENERATOR_D_MODEL)
        self.rtd_head = nn.Linear(D_MODEL, 1)

    def loss(self, generator, data: torch.Tensor | None = None):
        ids = with_cls(get_batch(self.data if data is None else data, BATCH, WINDOW, generator)[0])
        inputs, labels = mlm_mask(ids, MASK, VOCAB, special_positions(ids), 0.15, generator,
                                  mask_replace_prob=1.0, random_replace_prob=0.0)
        generator_logits = self.generator_head(self.generator_encoder(inputs))
        corrupted, replaced = electra_corrupt(ids, labels, generator_logits, generator)
        rtd_logits = self.rtd_head(self.discriminator(corrupted))[..., 0]
        words = ~special_positions(ids)
        rtd = F.binary_cross_entropy_with_logits(rtd_logits[words], replaced[words].float())
        generator_loss = mlm_loss(generator_logits, labels)
        self.parts = {"generator_mlm": generator_loss.item(), "rtd": rtd.item(),
                      "replaced_fraction": replaced[words].double().mean().item()}
        return generator_loss + ELECTRA_WEIGHT * rtd

    def backbone(self) -> nn.Module:
        return self.discriminator

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``log p(original)`` of each word according to the discriminator: ``log sigmoid(-logit)``."""
        return F.logsigmoid(-self.rtd_head(self.discriminator(ids))[:, 1:, 0])


# --------------------------------------------------------------------------------------------------------------
