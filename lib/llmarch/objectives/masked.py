"""Masked objectives of the BERT family: BERT's 80/10/10 masking and loss, SpanBERT's spans and boundary
targets, ELECTRA's replaced-token labels, and next-sentence pairs.

Book: Pretraining objectives, "Masked language modelling", "Span masking", "Replaced-token detection" and
"Next-sentence prediction".
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from llmarch._checks import check_tensor, shape_str
from llmarch.objectives._common import (IGNORE_INDEX, _check_ids, _is_number, _check_probability, _check_int,
                                        _check_generator, _check_special_mask, _ceil_budget, _runs)


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
