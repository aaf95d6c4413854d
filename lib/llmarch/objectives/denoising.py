"""Denoising objectives for encoder-decoders and their relatives: BART's five noising functions, T5's
span corruption with sentinels, and the prefix-LM mask.

Book: Pretraining objectives, "Denoising with BART", "Span corruption in T5" and "Encoder-decoder models" (the
prefix LM).
"""

from __future__ import annotations

import numbers
from typing import Sequence

import torch

from llmarch._checks import check_tensor, shape_str
from llmarch.objectives._common import (_check_ids, _is_number, _check_probability, _check_int, _check_generator,
                                        _ceil_budget, _runs)


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
                            generator: torch.Generator | None = None, random_roll: bool = False) -> torch.Tensor:
    """T5's noise mask, a bool tensor ``(length,)`` (True = noise): :func:`t5_span_counts` fixes ``num_noise`` and
    ``num_spans``; the noise tokens and the ``length - num_noise`` other tokens are each split into ``num_spans``
    non-empty spans uniformly at random, and the spans alternate, **beginning with a non-noise span** (so the mask
    always ends with noise), as T5's ``random_spans_noise_mask`` builds it. With ``random_roll=True`` the mask is
    then rotated right by an offset drawn uniformly from ``0 .. length - 1`` (``torch.roll``), as T5's code does
    with its option ``random_roll``: every position can then be noise or not, and an offset that falls inside a
    noise span cuts it in two (one span at each end). Book: Pretraining objectives, "Span corruption in T5"."""
    num_noise, num_spans = t5_span_counts(length, noise_density, mean_span_length)
    if num_spans > length - num_noise:
        raise ValueError(f"length {length} leaves {length - num_noise} non-noise tokens for {num_spans} non-noise "
                         "spans: lower noise_density or raise mean_span_length")
    _check_generator(generator)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    other_lengths = _random_segmentation(length - num_noise, num_spans, generator)
    interleaved = torch.stack([other_lengths, noise_lengths], dim=1).flatten()
    is_noise = torch.tensor([False, True]).repeat(num_spans)
    mask = torch.repeat_interleave(is_noise, interleaved)
    if random_roll:
        mask = torch.roll(mask, int(torch.randint(length, (1,), generator=generator)))
    return mask


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
                       generator: torch.Generator | None = None,
                       random_roll: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's pretraining objective (Raffel et al., 2020): draw :func:`random_spans_noise_mask` and format with
    :func:`span_corruption_from_mask`. ``ids (T,)`` -> ``inputs (T - num_noise + num_spans,)`` and ``targets
    (num_noise + num_spans,)``; ``ids (B, T)`` -> one mask per row, stacked (the lengths depend only on ``T``).
    ``sentinel_ids`` (required; at least ``num_spans`` ids): ``sentinel_ids[0]`` is ``<extra_id_0>``, which T5's
    vocabulary puts at the top of the id range. With ``random_roll=True`` the masks are rolled
    (:func:`random_spans_noise_mask`), so a row may hold one more span and a closing sentinel: only one
    sequence ``(T,)`` is accepted then. Book: Pretraining objectives, "Span corruption in T5"."""
    _check_ids("ids", ids)
    if ids.dim() > 2:
        raise ValueError(f"ids has shape {shape_str(ids.shape)} but must be (T,) or (B, T)")
    if sentinel_ids is None:
        raise ValueError("sentinel_ids is required: the ids of <extra_id_0>, <extra_id_1>, ... in this order")
    if random_roll and ids.dim() == 2:
        raise ValueError("random_roll=True gives rows of different lengths: pass one sequence (T,) at a time")
    rows = [span_corruption_from_mask(row, random_spans_noise_mask(ids.shape[-1], noise_density, mean_span_length,
                                                                   generator, random_roll).to(ids.device),
                                      sentinel_ids)
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
