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

Modules: :mod:`~llmarch.objectives.masked` (BERT, SpanBERT, ELECTRA, NSP), :mod:`~llmarch.objectives.denoising`
(BART, T5, the prefix-LM mask) and :mod:`~llmarch.objectives.extractive_qa` (``best_span``); every public name
is importable from ``llmarch.objectives``.
"""

from llmarch.objectives._common import IGNORE_INDEX
from llmarch.objectives.masked import (mlm_mask, mlm_loss, span_length_distribution, span_mask, SpanBoundaryTargets,
                                       span_boundary_targets, electra_labels, electra_corrupt, NSPExample, nsp_pairs)
from llmarch.objectives.denoising import (token_masking, token_deletion, text_infilling, sentence_permutation,
                                          document_rotation, t5_span_counts, random_spans_noise_mask,
                                          span_corruption_from_mask, t5_span_corruption, prefix_lm_mask)
from llmarch.objectives.extractive_qa import best_span

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
