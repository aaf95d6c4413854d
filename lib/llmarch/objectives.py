"""Pretraining objectives: how a text becomes a training example for BERT, SpanBERT, ELECTRA, BART and T5,
and how an extractive-QA model reads its answer off start/end scores.

Book: Pretraining objectives (``book/pretraining-objectives.md``).

Conventions, stated once here:
- Token ids are integer ``torch`` tensors; positions are 0-based. Functions that keep the length (masking) take
  ids of any shape, ``(T,)`` or ``(B, T)``; functions that change the length (deletion, infilling, sentinels)
  take one sequence ``(T,)`` and return a new one.
- ``labels`` hold the original token at every position the model must predict and ``-100``
  (:data:`IGNORE_INDEX`) everywhere else: the ``ignore_index`` of ``torch.nn.functional.cross_entropy`` and of
  transformers' models, so ``F.cross_entropy(logits.flatten(0, -2), labels.flatten())`` is the MLM loss.
- ``special_mask`` (same shape as ``ids``, bool): True for tokens that are never selected ([CLS], [SEP], padding).
- Randomness comes only from ``generator`` (a ``torch.Generator``; ``None`` = torch's global one), so a seeded
  generator reproduces an example exactly.
- T5 sentinels: ``sentinel_ids[0]`` replaces the first noise span (it plays ``<extra_id_0>``), ``sentinel_ids[1]``
  the second, and so on from left to right. No EOS is appended anywhere.
- BART's noising functions take one document ``(T,)`` without BOS/EOS (add them after noising); the target of a
  BART example is the original document.
- NSP labels follow ``BertForPreTraining``: 0 = IsNext (B follows A), 1 = NotNext (B is from another document).
- ELECTRA labels: 1 = replaced (the token differs from the original), 0 = original.
- ``best_span`` returns inclusive ``(start, end)``; ties go to the smallest start, then the smallest end.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from llmarch._checks import check_tensor, shape_str

__all__ = [
    "IGNORE_INDEX",
    "mlm_mask",
    "mlm_loss",
    "span_length_distribution",
    "span_mask",
    "SpanBoundaryTargets",
    "span_boundary_targets",
    "electra_labels",
    "electra_corrupt",
    "NSPExample",
    "nsp_pairs",
    "token_masking",
    "token_deletion",
    "text_infilling",
    "sentence_permutation",
    "document_rotation",
    "t5_span_counts",
    "random_spans_noise_mask",
    "span_corruption_from_mask",
    "t5_span_corruption",
    "best_span",
    "prefix_lm_mask",
]

IGNORE_INDEX = -100
"""The label of a position that is not predicted (``ignore_index`` of ``torch.nn.functional.cross_entropy``)."""


# ----------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------

def _check_ids(name: str, ids, vocab_size: int | None = None, dims: int | None = None) -> None:
    check_tensor(name, ids, dims=dims, min_dim=1 if dims is None else None)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"{name} holds a negative token id ({int(ids.min())})")
    if vocab_size is not None and ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(f"{name} holds token id {int(ids.max())}, outside the vocabulary [0, {vocab_size})")


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_probability(name: str, p) -> float:
    if not _is_number(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    return float(p)


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low or \
            (high is not None and value >= high):
        bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return int(value)


def _check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def _check_special_mask(special_mask, ids) -> torch.Tensor:
    if special_mask is None:
        return torch.zeros_like(ids, dtype=torch.bool)
    check_tensor("special_mask", special_mask)
    if special_mask.dtype != torch.bool:
        raise ValueError(f"special_mask must be a boolean tensor (True = never selected), "
                         f"got dtype {special_mask.dtype}")
    if special_mask.shape != ids.shape:
        raise ValueError(f"special_mask has shape {shape_str(special_mask.shape)} but ids has shape "
                         f"{shape_str(ids.shape)}: they must match")
    return special_mask


def _ceil_budget(fraction: float, n: int) -> int:
    """``ceil(fraction * n)`` without the floating-point excess that turns ``0.15 * 20`` into 4 tokens."""
    return math.ceil(fraction * n - 1e-9)


# ----------------------------------------------------------------------------------------------------------
# Masked language modelling (BERT)
# ----------------------------------------------------------------------------------------------------------

def mlm_mask(ids: torch.Tensor, mask_id: int, vocab_size: int, special_mask: torch.Tensor | None = None,
             mask_prob: float = 0.15, generator: torch.Generator | None = None, *,
             mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking (Devlin et al., 2019): ``ids`` of any shape -> ``(inputs, labels)`` of the same shape.
    Book: Pretraining objectives, "Masked language modelling".

    Each non-special token is selected independently with probability ``mask_prob``. A selected token becomes
    ``mask_id`` with probability ``mask_replace_prob`` (0.8), a token drawn uniformly from ``[0, vocab_size)``
    with probability ``random_replace_prob`` (0.1; the draw may return the original token), and stays itself
    otherwise (0.1). ``labels[i] = ids[i]`` at selected positions and -100 elsewhere, so the loss covers exactly
    the selected set ``M``: ``L = -(1/|M|) sum_{i in M} log p(x_i | x_tilde)`` (:func:`mlm_loss`).
    ``mask_replace_prob=1, random_replace_prob=0`` gives the all-[MASK] corruption of ELECTRA's generator.
    """
    vocab_size = _check_int("vocab_size", vocab_size, 1)
    _check_ids("ids", ids, vocab_size=vocab_size)
    mask_id = _check_int("mask_id", mask_id, 0, vocab_size)
    special = _check_special_mask(special_mask, ids)
    mask_prob = _check_probability("mask_prob", mask_prob)
    p_mask = _check_probability("mask_replace_prob", mask_replace_prob)
    p_random = _check_probability("random_replace_prob", random_replace_prob)
    if p_mask + p_random > 1.0 + 1e-12:
        raise ValueError(f"mask_replace_prob + random_replace_prob must be <= 1, got {p_mask} + {p_random}")
    _check_generator(generator)
    selected = (torch.rand(ids.shape, generator=generator, device=ids.device) < mask_prob) & ~special
    action = torch.rand(ids.shape, generator=generator, device=ids.device)
    random_ids = torch.randint(0, vocab_size, ids.shape, generator=generator, device=ids.device, dtype=ids.dtype)
    inputs = torch.where(selected & (action < p_mask), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(selected & (action >= p_mask) & (action < p_mask + p_random), random_ids, inputs)
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
    return inputs, labels


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the selected positions only, averaged over them: ``logits (..., V)``, ``labels (...)``
    with -100 at positions that are not predicted -> a scalar,
    ``L = -(1/|M|) sum_{i in M} log softmax(logits_i)[labels_i]``, ``M = {i : labels_i != -100}``.
    Equal to ``F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)``; raises instead of
    returning ``nan`` when no position is selected. Book: Pretraining objectives, "Masked language modelling"."""
    check_tensor("logits", logits, min_dim=1, floating=True)
    check_tensor("labels", labels)
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integer token ids (or -100), got dtype {labels.dtype}")
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits has shape {shape_str(logits.shape)} but labels has shape {shape_str(labels.shape)}: "
                         "labels must have the shape of logits without its last (vocabulary) dimension")
    vocab = logits.shape[-1]
    selected = labels != IGNORE_INDEX
    if not bool(selected.any()):
        raise ValueError("labels select no position (every label is -100): the MLM loss is undefined")
    targets = labels[selected]
    if int(targets.min()) < 0 or int(targets.max()) >= vocab:
        raise ValueError(f"labels must be -100 or in [0, {vocab}), got values from {int(targets.min())} to "
                         f"{int(targets.max())}")
    log_probs = torch.log_softmax(logits[selected], dim=-1)
    return -log_probs.gather(-1, targets[:, None]).mean()


# ----------------------------------------------------------------------------------------------------------
# SpanBERT
# ----------------------------------------------------------------------------------------------------------

def span_length_distribution(p: float = 0.2, max_len: int = 10) -> torch.Tensor:
    """SpanBERT's span lengths (in words): a geometric distribution ``P(l) = p (1-p)^(l-1)`` truncated to
    ``l = 1..max_len`` and renormalised, as SpanBERT's code does; returns the float64 probabilities ``(max_len,)``
    of ``l = 1..max_len``. With ``p = 0.2, max_len = 10`` the mean is 3.8 words, the value Joshi et al. (2020)
    quote (clipping, ``min(l, 10)``, would give 4.46). Book: Pretraining objectives, "Span masking"."""
    if not _is_number(p) or not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    max_len = _check_int("max_len", max_len, 1)
    lengths = torch.arange(1, max_len + 1, dtype=torch.float64)
    weights = p * (1.0 - p) ** (lengths - 1)
    return weights / weights.sum()


def _words(word_starts: torch.Tensor, special: torch.Tensor) -> list[tuple[int, int]]:
    """The ``[start, end)`` token ranges of the words of one sequence: a word begins at a word start, at position 0
    or after a special token, and never contains a special token."""
    words = []
    start = None
    for i, (is_start, is_special) in enumerate(zip(word_starts.tolist(), special.tolist())):
        if is_special or is_start or start is None:
            if start is not None:
                words.append((start, i))
            start = None if is_special else i
    if start is not None:
        words.append((start, len(special)))
    return words


def _span_mask_row(ids, word_starts, special, mask_id, vocab_size, mask_prob, length_probs, generator):
    words = _words(word_starts, special)
    eligible = sum(end - start for start, end in words)
    budget = _ceil_budget(mask_prob, eligible)
    masked_words = [False] * len(words)
    n_masked = 0
    while n_masked < budget and not all(masked_words):
        span_words = int(torch.multinomial(length_probs, 1, generator=generator)) + 1
        free = [w for w, done in enumerate(masked_words) if not done]
        w = free[int(torch.randint(len(free), (1,), generator=generator))]
        for _ in range(span_words):
            if not masked_words[w]:
                masked_words[w] = True
                n_masked += words[w][1] - words[w][0]
            contiguous = w + 1 < len(words) and words[w + 1][0] == words[w][1]
            if n_masked >= budget or not contiguous:
                break
            w += 1
    selected = torch.zeros(len(ids), dtype=torch.bool)
    for (start, end), done in zip(words, masked_words):
        selected[start:end] = done
    inputs = ids.clone()
    for start, end in _runs(selected):  # one 80/10/10 decision per span, as SpanBERT does
        u = float(torch.rand((), generator=generator))
        if u < 0.8:
            inputs[start:end] = mask_id
        elif u < 0.9:
            inputs[start:end] = torch.randint(0, vocab_size, (end - start,), generator=generator, dtype=ids.dtype)
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
    return inputs, labels


def _runs(flags: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of every maximal run of True in a 1-D bool tensor."""
    padded = torch.cat([torch.zeros(1, dtype=torch.int8), flags.to(torch.int8), torch.zeros(1, dtype=torch.int8)])
    edges = torch.diff(padded)
    return list(zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()))


def span_mask(ids: torch.Tensor, mask_id: int, vocab_size: int, word_starts: torch.Tensor | None = None,
              special_mask: torch.Tensor | None = None, mask_prob: float = 0.15, geometric_p: float = 0.2,
              max_span_words: int = 10, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SpanBERT's span masking (Joshi et al., 2020): ``ids (T,)`` or ``(B, T)`` -> ``(inputs, labels)``, same shape.
    Book: Pretraining objectives, "Span masking".

    ``word_starts`` (bool, like ``ids``) is True at the first token of every word (``None``: every token is a
    word); special tokens are never masked and end a word. Per sequence, until the budget of
    ``ceil(mask_prob * n)`` tokens is spent (``n`` non-special tokens; the ceiling is SpanBERT's code's):
    draw a span length ``l`` in words from :func:`span_length_distribution`, pick a start uniformly among the words
    not masked yet, and mask up to ``l`` whole, contiguous words (stopping at a special token, at the end, or once
    the budget is reached). Words are never cut, so a sequence may exceed its budget by less than one word. Each
    maximal run of masked tokens then gets one decision, as SpanBERT's code makes it: all [MASK] (80%), all random
    tokens (10%) or all kept (10%). Labels as in :func:`mlm_mask`.
    """
    vocab_size = _check_int("vocab_size", vocab_size, 1)
    _check_ids("ids", ids, vocab_size=vocab_size)
    if ids.dim() > 2:
        raise ValueError(f"ids has shape {shape_str(ids.shape)} but must be (T,) or (B, T)")
    mask_id = _check_int("mask_id", mask_id, 0, vocab_size)
    special = _check_special_mask(special_mask, ids)
    if word_starts is None:
        word_starts = torch.ones_like(ids, dtype=torch.bool)
    check_tensor("word_starts", word_starts)
    if word_starts.dtype != torch.bool or word_starts.shape != ids.shape:
        raise ValueError(f"word_starts must be a boolean tensor shaped like ids {shape_str(ids.shape)}, got "
                         f"dtype {word_starts.dtype} and shape {shape_str(word_starts.shape)}")
    mask_prob = _check_probability("mask_prob", mask_prob)
    length_probs = span_length_distribution(geometric_p, max_span_words)
    _check_generator(generator)
    rows = [_span_mask_row(i.cpu(), w.cpu(), s.cpu(), mask_id, vocab_size, mask_prob, length_probs, generator)
            for i, w, s in zip(ids.reshape(-1, ids.shape[-1]), word_starts.reshape(-1, ids.shape[-1]),
                               special.reshape(-1, ids.shape[-1]))]
    inputs = torch.stack([r[0] for r in rows]).reshape(ids.shape).to(ids.device)
    labels = torch.stack([r[1] for r in rows]).reshape(ids.shape).to(ids.device)
    return inputs, labels


class SpanBoundaryTargets(NamedTuple):
    """One row per masked token ``i`` of a span ``[s, e]`` (inclusive) that has tokens on both sides: ``batch``,
    ``position`` (``i``), ``left`` (``s - 1``), ``right`` (``e + 1``), ``offset`` (``i - s``, 0-based; the paper's
    position embedding ``p_{i-s+1}``) and ``target`` (the original token ``x_i``); each a long tensor ``(N,)``.
    Book: Pretraining objectives, "Span masking"."""

    batch: torch.Tensor
    position: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    offset: torch.Tensor
    target: torch.Tensor


def span_boundary_targets(labels: torch.Tensor) -> SpanBoundaryTargets:
    """The span-boundary objective's examples (Joshi et al., 2020): ``y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1})``
    predicts ``x_i`` from the encoder outputs at the two tokens just outside its span and its offset in the span.
    ``labels (T,)`` or ``(B, T)`` as :func:`span_mask` returns them; a span is a maximal run of labels != -100
    (adjacent spans count as one, as in SpanBERT's code). Spans that touch either end of the sequence have no
    boundary token there and are skipped, as SpanBERT's code does. Book: Pretraining objectives, "Span masking"."""
    check_tensor("labels", labels, min_dim=1)
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integer token ids (or -100), got dtype {labels.dtype}")
    if bool(((labels < 0) & (labels != IGNORE_INDEX)).any()):
        raise ValueError("labels must be -100 or non-negative token ids")
    if labels.dim() > 2:
        raise ValueError(f"labels has shape {shape_str(labels.shape)} but must be (T,) or (B, T)")
    rows = labels.reshape(-1, labels.shape[-1]).cpu()
    out: list[list[int]] = []
    for b, row in enumerate(rows):
        for start, end in _runs(row != IGNORE_INDEX):
            if start == 0 or end == len(row):
                continue
            out.extend([b, i, start - 1, end, i - start, int(row[i])] for i in range(start, end))
    table = torch.tensor(out, dtype=torch.long).reshape(-1, 6)
    return SpanBoundaryTargets(*(table[:, j] for j in range(6)))


# ----------------------------------------------------------------------------------------------------------
# ELECTRA
# ----------------------------------------------------------------------------------------------------------

def electra_labels(original: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """Replaced-token detection targets (Clark et al., 2020): ``1[corrupted_i != original_i]`` as a long tensor
    of the same shape. A generator sample that happens to equal the original token counts as *original* (0), as
    in the paper. Book: Pretraining objectives, "Replaced-token detection"."""
    _check_ids("original", original)
    _check_ids("corrupted", corrupted)
    if original.shape != corrupted.shape:
        raise ValueError(f"original has shape {shape_str(original.shape)} but corrupted has shape "
                         f"{shape_str(corrupted.shape)}: they must match")
    return (corrupted != original).long()


def electra_corrupt(ids: torch.Tensor, labels: torch.Tensor, generator_logits: torch.Tensor,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's input and targets (Clark et al., 2020): at every selected position (``labels != -100``,
    as :func:`mlm_mask` returns them) the token is replaced by a sample ``x_hat_i ~ softmax(generator_logits_i)``
    of the generator; elsewhere it stays. ``ids (...)``, ``labels (...)``, ``generator_logits (..., V)`` ->
    ``(corrupted, rtd_labels)``, both like ``ids``, ``rtd_labels = electra_labels(ids, corrupted)``. Sampling
    is not differentiated: the generator learns only from its MLM loss. Book: Pretraining objectives,
    "Replaced-token detection"."""
    _check_ids("ids", ids)
    check_tensor("generator_logits", generator_logits, min_dim=1, floating=True)
    if labels.shape != ids.shape or generator_logits.shape[:-1] != ids.shape:
        raise ValueError(f"ids {shape_str(ids.shape)}, labels {shape_str(labels.shape)} and generator_logits "
                         f"{shape_str(generator_logits.shape)} must agree: labels like ids, logits (*ids.shape, V)")
    _check_ids("ids", ids, vocab_size=generator_logits.shape[-1])
    _check_generator(generator)
    selected = labels != IGNORE_INDEX
    corrupted = ids.clone()
    if bool(selected.any()):
        probs = torch.softmax(generator_logits.detach()[selected].float(), dim=-1)
        corrupted[selected] = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(ids.dtype)
    return corrupted, electra_labels(ids, corrupted)


# ----------------------------------------------------------------------------------------------------------
# Next-sentence prediction
# ----------------------------------------------------------------------------------------------------------

class NSPExample(NamedTuple):
    """``input_ids`` = ``[CLS] A [SEP] B [SEP]``, ``token_type_ids`` 0 on ``[CLS] A [SEP]`` and 1 on ``B [SEP]``,
    ``next_sentence_label`` 0 = IsNext, 1 = NotNext. Book: Pretraining objectives, "Next-sentence prediction"."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    next_sentence_label: int


def nsp_pairs(documents: Sequence[Sequence], cls_id: int, sep_id: int,
              generator: torch.Generator | None = None) -> list[NSPExample]:
    """BERT's next-sentence-prediction pairs (Devlin et al., 2019): for every pair of consecutive sentences
    ``(A, A')`` of a document, B is ``A'`` with probability 1/2 (IsNext, label 0) and otherwise a sentence drawn
    uniformly from a uniformly drawn *other* document (NotNext, label 1). ``documents``: a list of documents, each a
    list of sentences (1-D integer tensors or lists of ids). One sentence per segment (BERT packs several up to
    its length limit). Book: Pretraining objectives, "Next-sentence prediction"."""
    cls_id, sep_id = _check_int("cls_id", cls_id, 0), _check_int("sep_id", sep_id, 0)
    _check_generator(generator)
    docs = []
    for d, doc in enumerate(documents):
        sentences = [torch.as_tensor(s, dtype=torch.long) for s in doc]
        for s, sentence in enumerate(sentences):
            _check_ids(f"documents[{d}][{s}]", sentence, dims=1)
        docs.append(sentences)
    if len(docs) < 2 or sum(1 for d in docs if d) < 2:
        raise ValueError(f"nsp_pairs needs at least two non-empty documents (NotNext draws from another one), "
                         f"got {sum(1 for d in docs if d)}")
    cls, sep = torch.tensor([cls_id]), torch.tensor([sep_id])
    examples = []
    for d, doc in enumerate(docs):
        for i in range(len(doc) - 1):
            a = doc[i]
            if float(torch.rand((), generator=generator)) < 0.5:
                b, label = doc[i + 1], 0
            else:
                others = [o for o in range(len(docs)) if o != d and docs[o]]
                other = docs[others[int(torch.randint(len(others), (1,), generator=generator))]]
                b, label = other[int(torch.randint(len(other), (1,), generator=generator))], 1
            input_ids = torch.cat([cls, a, sep, b, sep])
            token_type_ids = torch.cat([torch.zeros(len(a) + 2, dtype=torch.long),
                                        torch.ones(len(b) + 1, dtype=torch.long)])
            examples.append(NSPExample(input_ids, token_type_ids, label))
    return examples


# ----------------------------------------------------------------------------------------------------------
# BART's noising functions
# ----------------------------------------------------------------------------------------------------------

def token_masking(ids: torch.Tensor, mask_id: int, mask_prob: float = 0.15,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """BART's token masking (Lewis et al., 2020): each token becomes ``mask_id`` independently with probability
    ``mask_prob`` (all of them [MASK]: no 80/10/10, the decoder reconstructs the whole document). Same shape as
    ``ids``. Book: Pretraining objectives, "Denoising with BART"."""
    _check_ids("ids", ids)
    mask_id = _check_int("mask_id", mask_id, 0)
    mask_prob = _check_probability("mask_prob", mask_prob)
    _check_generator(generator)
    hit = torch.rand(ids.shape, generator=generator, device=ids.device) < mask_prob
    return torch.where(hit, torch.full_like(ids, mask_id), ids)


def token_deletion(ids: torch.Tensor, delete_prob: float = 0.15,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """BART's token deletion: each token of the document ``ids (T,)`` is removed independently with probability
    ``delete_prob``; the rest keep their order. The model must find *where* input is missing. Returns ``(T',)``.
    Book: Pretraining objectives, "Denoising with BART"."""
    _check_ids("ids", ids, dims=1)
    delete_prob = _check_probability("delete_prob", delete_prob)
    _check_generator(generator)
    return ids[torch.rand(ids.shape, generator=generator, device=ids.device) >= delete_prob]


def text_infilling(ids: torch.Tensor, mask_id: int, mask_ratio: float = 0.3, poisson_lambda: float = 3.0,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """BART's text infilling: spans with lengths ``k ~ Poisson(poisson_lambda)`` are each replaced by ONE
    ``mask_id``; a 0-length span inserts a ``mask_id``. The model must also predict how many tokens a mask hides.
    Book: Pretraining objectives, "Denoising with BART".

    ``ids (T,)`` -> ``(T',)``. Span lengths are drawn until they cover ``ceil(mask_ratio * T)`` tokens (BART-large
    masks 30%; the last span is shortened only if the spans would exceed the document); the spans are then placed
    without overlap, uniformly among all orders-preserving placements (a span may touch another: two masks in a
    row). Because the number of spans is a stopping time, the masked tokens per span average ``poisson_lambda``
    over many documents (Wald's identity)."""
    _check_ids("ids", ids, dims=1)
    mask_id = _check_int("mask_id", mask_id, 0)
    mask_ratio = _check_probability("mask_ratio", mask_ratio)
    if not _is_number(poisson_lambda) or not poisson_lambda > 0:
        raise ValueError(f"poisson_lambda must be > 0, got {poisson_lambda!r}")
    _check_generator(generator)
    n = len(ids)
    budget = _ceil_budget(mask_ratio, n)
    lengths: list[int] = []
    while sum(lengths) < budget:
        lengths.append(int(torch.poisson(torch.tensor(float(poisson_lambda)), generator=generator)))
    if sum(lengths) > n:
        lengths[-1] -= sum(lengths) - n
    kept = n - sum(lengths)
    # A placement is a sequence of `kept` tokens and len(lengths) span markers: choose the markers' slots.
    slots = torch.randperm(kept + len(lengths), generator=generator)[: len(lengths)].sort().values.tolist()
    out, source, previous = [], 0, 0
    for slot, length in zip(slots, lengths):
        take = slot - previous  # original tokens before this marker
        out.append(ids[source: source + take])
        out.append(torch.tensor([mask_id], dtype=ids.dtype, device=ids.device))
        source += take + length
        previous = slot + 1
    out.append(ids[source:])
    return torch.cat(out)


def sentence_permutation(ids: torch.Tensor, sentence_end_ids: int | Sequence[int],
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """BART's sentence permutation: the document ``ids (T,)`` is cut after every token in ``sentence_end_ids``
    (full stops; a final piece without one is a sentence too), and the sentences are concatenated in a uniformly
    random order. Book: Pretraining objectives, "Denoising with BART"."""
    _check_ids("ids", ids, dims=1)
    ends = [sentence_end_ids] if isinstance(sentence_end_ids, numbers.Integral) else list(sentence_end_ids)
    if not ends:
        raise ValueError("sentence_end_ids must be a token id or a non-empty list of them, got an empty list")
    ends = [_check_int("sentence_end_ids", e, 0) for e in ends]
    _check_generator(generator)
    is_end = torch.isin(ids, torch.tensor(ends, dtype=ids.dtype, device=ids.device))
    cuts = (torch.nonzero(is_end).flatten() + 1).tolist()
    bounds = [0] + [c for c in cuts if c < len(ids)] + [len(ids)]
    sentences = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    order = torch.randperm(len(sentences), generator=generator).tolist()
    return torch.cat([sentences[i] for i in order]) if sentences else ids.clone()


def document_rotation(ids: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """BART's document rotation: a token is chosen uniformly and the document ``ids (T,)`` is rotated to begin
    with it, ``ids[k:] + ids[:k]``; the model must find the true start. Book: Pretraining objectives,
    "Denoising with BART"."""
    _check_ids("ids", ids, dims=1)
    if len(ids) == 0:
        raise ValueError("ids is empty: there is no token to rotate to")
    _check_generator(generator)
    k = int(torch.randint(len(ids), (1,), generator=generator))
    return torch.cat([ids[k:], ids[:k]])


# ----------------------------------------------------------------------------------------------------------
# T5's span corruption
# ----------------------------------------------------------------------------------------------------------

def t5_span_counts(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[int, int]:
    """The numbers of noise tokens and noise spans of T5's ``random_spans_noise_mask`` (Raffel et al., 2020):
    ``num_noise = round(length * noise_density)`` clipped to ``[1, length - 1]`` and
    ``num_spans = max(round(num_noise / mean_span_length), 1)``. Book: Pretraining objectives, "Span corruption in T5".

    Rounding convention, that of the official code (``t5/data/preprocessors.py``: ``tf.round`` on ``float32``
    tensors): the products and quotients are computed in **float32** and rounded **half to even**. Both matter:
    ``30 * 0.15 = 4.5`` rounds to 4, and ``190 * 0.15`` is ``28.500002`` in float32 (exactly ``28.5`` in
    float64, which rounds half to even), so T5 masks 29 tokens where Python's ``round(190 * 0.15)`` gives 28.
    """
    length = _check_int("length", length, 2)
    if not _is_number(noise_density) or not 0 < noise_density < 1:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density!r}")
    if not _is_number(mean_span_length) or not mean_span_length >= 1:
        raise ValueError(f"mean_span_length must be >= 1, got {mean_span_length!r}")
    def f32(x):
        return torch.tensor(float(x), dtype=torch.float32)

    num_noise = min(max(int(torch.round(f32(length) * f32(noise_density))), 1), length - 1)
    num_spans = int(torch.round(f32(num_noise) / f32(mean_span_length)))
    return num_noise, max(num_spans, 1)


def _random_segmentation(num_items: int, num_segments: int, generator) -> torch.Tensor:
    """Lengths ``(num_segments,)`` of a uniformly random split of ``num_items`` items into non-empty consecutive
    segments: ``num_segments - 1`` distinct cut points among the ``num_items - 1`` gaps."""
    first_in_segment = torch.zeros(num_items, dtype=torch.long)
    cuts = torch.randperm(num_items - 1, generator=generator)[: num_segments - 1] + 1
    first_in_segment[cuts] = 1
    return torch.bincount(torch.cumsum(first_in_segment, 0), minlength=num_segments)


def random_spans_noise_mask(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0,
                            generator: torch.Generator | None = None) -> torch.Tensor:
    """T5's noise mask, a bool tensor ``(length,)`` (True = noise): :func:`t5_span_counts` fixes ``num_noise`` and
    ``num_spans``; the noise tokens and the ``length - num_noise`` other tokens are each split into ``num_spans``
    non-empty spans uniformly at random, and the spans alternate, **beginning with a non-noise span** (so the mask
    always ends with noise), as T5's ``random_spans_noise_mask`` builds it (without its optional random roll).
    Book: Pretraining objectives, "Span corruption in T5"."""
    num_noise, num_spans = t5_span_counts(length, noise_density, mean_span_length)
    if num_spans > length - num_noise:
        raise ValueError(f"length {length} leaves {length - num_noise} non-noise tokens for {num_spans} non-noise "
                         "spans: lower noise_density or raise mean_span_length")
    _check_generator(generator)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    other_lengths = _random_segmentation(length - num_noise, num_spans, generator)
    interleaved = torch.stack([other_lengths, noise_lengths], dim=1).flatten()
    is_noise = torch.tensor([False, True]).repeat(num_spans)
    return torch.repeat_interleave(is_noise, interleaved)


def span_corruption_from_mask(ids: torch.Tensor, noise_mask: torch.Tensor,
                              sentinel_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's input/target format for a given noise mask: ``ids (T,)``, ``noise_mask (T,)`` bool -> ``(inputs,
    targets)``. Book: Pretraining objectives, "Span corruption in T5".

    ``inputs``: ``ids`` with the k-th noise span (0-based, left to right) replaced by ``sentinel_ids[k]``.
    ``targets``: for each noise span k, ``sentinel_ids[k]`` followed by the span's tokens; then, if the sequence
    ends with non-noise tokens, one closing sentinel ``sentinel_ids[n_spans]``. No EOS. This is what T5's code
    produces (``targets`` = ``nonnoise_span_to_unique_sentinel``: every non-noise span becomes a sentinel): its
    masks end with noise, so no closing sentinel appears; the paper's Fig. 2 ends with non-noise ("week .") and
    shows the closing ``<Z>``. For a mask that starts with noise, T5's code would misalign the sentinels; here
    sentinel k always announces noise span k. Example (Raffel et al., Fig. 2)::

        Thank you [for inviting] me to your party [last] week .
        inputs  = Thank you <X> me to your party <Y> week .
        targets = <X> for inviting <Y> last <Z>
    """
    _check_ids("ids", ids, dims=1)
    check_tensor("noise_mask", noise_mask, dims=1)
    if noise_mask.dtype != torch.bool or noise_mask.shape != ids.shape:
        raise ValueError(f"noise_mask must be a boolean tensor shaped like ids {shape_str(ids.shape)}, got dtype "
                         f"{noise_mask.dtype} and shape {shape_str(noise_mask.shape)}")
    sentinels = [int(s) for s in (sentinel_ids.tolist() if isinstance(sentinel_ids, torch.Tensor) else sentinel_ids)]
    spans = _runs(noise_mask.cpu())
    needed = len(spans) + int(len(ids) > 0 and not bool(noise_mask[-1]))
    if len(sentinels) < needed:
        raise ValueError(f"{len(sentinels)} sentinel id(s) given but this noise mask needs {needed} "
                         f"({len(spans)} noise spans" + (" and a closing sentinel)" if needed > len(spans) else ")"))
    if len(set(sentinels)) != len(sentinels) or min(sentinels, default=0) < 0:
        raise ValueError("sentinel_ids must be distinct non-negative token ids")
    inputs, targets, previous = [], [], 0
    for k, (start, end) in enumerate(spans):
        inputs.extend(ids[previous:start].tolist() + [sentinels[k]])
        targets.extend([sentinels[k]] + ids[start:end].tolist())
        previous = end
    inputs.extend(ids[previous:].tolist())
    if needed > len(spans):
        targets.append(sentinels[len(spans)])
    as_ids = lambda values: torch.tensor(values, dtype=ids.dtype, device=ids.device)  # noqa: E731
    return as_ids(inputs), as_ids(targets)


def t5_span_corruption(ids: torch.Tensor, noise_density: float = 0.15, mean_span_length: float = 3.0,
                       sentinel_ids: Sequence[int] | None = None,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's pretraining objective (Raffel et al., 2020): draw :func:`random_spans_noise_mask` and format with
    :func:`span_corruption_from_mask`. ``ids (T,)`` -> ``inputs (T - num_noise + num_spans,)`` and ``targets
    (num_noise + num_spans,)``; ``ids (B, T)`` -> one mask per row, stacked (the lengths depend only on ``T``).
    ``sentinel_ids`` (required; at least ``num_spans`` ids): ``sentinel_ids[0]`` is ``<extra_id_0>``, which T5's
    vocabulary puts at the top of the id range. Book: Pretraining objectives, "Span corruption in T5"."""
    _check_ids("ids", ids)
    if ids.dim() > 2:
        raise ValueError(f"ids has shape {shape_str(ids.shape)} but must be (T,) or (B, T)")
    if sentinel_ids is None:
        raise ValueError("sentinel_ids is required: the ids of <extra_id_0>, <extra_id_1>, ... in this order")
    rows = [span_corruption_from_mask(row, random_spans_noise_mask(ids.shape[-1], noise_density, mean_span_length,
                                                                   generator).to(ids.device), sentinel_ids)
            for row in ids.reshape(-1, ids.shape[-1])]
    if ids.dim() == 1:
        return rows[0]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


# ----------------------------------------------------------------------------------------------------------
# Prefix LM (T5's third architecture; UL2's S-denoiser)
# ----------------------------------------------------------------------------------------------------------

def prefix_lm_mask(prefix_length, length: int, device=None) -> torch.Tensor:
    """The attention mask of a prefix LM (Raffel et al., 2020; Tay et al., 2023): full attention inside the
    prefix, causal after it, ``M[i, j] = (j <= i) or (j < prefix_length)`` (True = may attend).

    Book: Pretraining objectives, "Encoder-decoder models".

    ``prefix_length``: an int (-> ``(length, length)``) or a long tensor ``(B,)`` of per-row prefixes (->
    ``(B, length, length)``), each in ``0 .. length``. A prefix of 0 or 1 gives the causal mask, ``length``
    the full one.

    >>> prefix_lm_mask(2, 4).int()
    tensor([[1, 1, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [1, 1, 1, 1]], dtype=torch.int32)
    """
    _check_int("length", length, 1)
    if isinstance(prefix_length, torch.Tensor):
        if prefix_length.dim() != 1 or prefix_length.is_floating_point() or prefix_length.dtype == torch.bool:
            raise ValueError(f"prefix_length must be an int or an integer tensor (B,), got dtype "
                             f"{prefix_length.dtype} and shape {shape_str(prefix_length.shape)}")
        if bool(((prefix_length < 0) | (prefix_length > length)).any()):
            raise ValueError(f"prefix_length must lie in 0..{length}, got {prefix_length.tolist()}")
        prefix = prefix_length.to(device)[:, None, None]
    else:
        prefix = _check_int("prefix_length", prefix_length, 0, length + 1)
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (j <= i) | (j < prefix)


# ----------------------------------------------------------------------------------------------------------
# Extractive question answering
# ----------------------------------------------------------------------------------------------------------

def best_span(start_logits: torch.Tensor, end_logits: torch.Tensor, max_answer_len: int):
    """The answer span of an extractive-QA head (Devlin et al., 2019, SQuAD): ``argmax_{s <= e < s + max_answer_len}
    start_logits[s] + end_logits[e]``. Book: Pretraining objectives, "Extractive question answering".

    ``start_logits, end_logits (T,)`` -> ``(start, end)`` as Python ints (inclusive); ``(B, T)`` -> two long
    tensors ``(B,)``. O(T * max_answer_len): for each length offset ``k = e - s`` the scores of all starts are
    ``start[:T-k] + end[k:]``. Ties go to the smallest start, then to the smallest end. ``-inf`` logits (positions
    that cannot hold an answer, such as the question) are allowed; ``nan`` and ``+inf`` are not.
    """
    check_tensor("start_logits", start_logits, floating=True)
    check_tensor("end_logits", end_logits, floating=True)
    if start_logits.shape != end_logits.shape or start_logits.dim() not in (1, 2) or start_logits.shape[-1] == 0:
        raise ValueError(f"start_logits {shape_str(start_logits.shape)} and end_logits {shape_str(end_logits.shape)} "
                         "must have the same shape, (T,) or (B, T) with T >= 1")
    for name, t in (("start_logits", start_logits), ("end_logits", end_logits)):
        if bool(torch.isnan(t).any()) or bool((t == float("inf")).any()):
            raise ValueError(f"{name} contains nan or +inf")
    max_answer_len = _check_int("max_answer_len", max_answer_len, 1)
    single = start_logits.dim() == 1
    start, end = (start_logits[None], end_logits[None]) if single else (start_logits, end_logits)
    t = start.shape[-1]
    k_max = min(max_answer_len, t)
    scores = torch.full((start.shape[0], t, k_max), float("-inf"), dtype=torch.promote_types(start.dtype, end.dtype),
                        device=start.device)
    for k in range(k_max):
        scores[:, : t - k, k] = start[:, : t - k] + end[:, k:]
    flat = scores.reshape(start.shape[0], -1)
    best = torch.argmax(flat, dim=-1)  # the first maximum in (start, offset) order: smallest start, then end
    s, k = best // k_max, best % k_max
    if single:
        return int(s[0]), int(s[0] + k[0])
    return s, s + k
