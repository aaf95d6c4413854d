"""Trusted checks of ps8-objectives: fresh inputs for every hidden test cell, ``llmarch.objectives`` as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps8-objectives/ps8-objectives.ipynb``.
References: ``mlm_loss``, ``t5_span_counts``, ``span_corruption_from_mask`` (the notebook's ``t5_span_corruption``
takes the noise mask; the masks come from ``random_spans_noise_mask``) and ``best_span``.

BERT's masking is random and a student's random stream is not ours, so ``mlm_mask`` is judged by properties of
what it returns (a ``verdict``), not by equality with the reference's sample: exact invariants in
``test_mlm_invariants``, and rates in ``test_mlm_statistics``. Each rate is a fraction of ``n`` independent
trials, so by Hoeffding's inequality ``P(|rate - p| >= t) <= 2 exp(-2 n t^2)``; with ``t`` chosen to make that
``1e-11`` and 27 rates per grading (seven cases, three rates each, and six more), the rates fail a correct
solution with probability below ``1e-9``. The cases are large enough (at least 12,000 selected tokens each, ``t``
at most 3.3%) that 90/10/0 masking (no kept tokens, 10 points away) fails every time. The generator comes from
the grader (``rng=np.random.default_rng(seed)``), so that randomness can be checked to come from it, to change
with it, and not to follow positions: see ``_selection_problems`` and ``_replacement_problems``.

Rates alone do not see structure: a mask that selects exactly ``round(p n)`` tokens, or masks exactly 80% of the
selected ones, has the right rates. So ``_spread_problems`` also measures how the counts vary from call to call,
on ``SPREAD_CALLS`` calls of ``SPREAD_LENGTH`` tokens with ``mask_prob = 0.5``: see ``SPREAD_BOUNDS`` for the
computation that keeps a correct solution's failure probability below ``3e-8``, the whole check's below ``1e-7``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from autograder.checks import Case, Check, FailureClass, RngArg
from llmarch.objectives import (
    best_span,
    mlm_loss,
    mlm_mask,
    random_spans_noise_mask,
    span_corruption_from_mask,
    t5_span_counts,
)

NOTEBOOK = "ps8-objectives.ipynb"
TRUSTED_CALLABLES: dict = {}

IGNORE = -100
PAD, CLS, SEP, MASK = 0, 101, 102, 103  # bert-base-uncased's ids
FIRST_WORD = 999  # ordinary word pieces start here in bert-base-uncased
FALSE_FAILURE = 1e-11  # the probability that one rate of a correct solution leaves its bound


def _long(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.long)


# --- references ---------------------------------------------------------------------------------------------


def ref_mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    """llmarch's own sample (``rng`` unused): it fixes that two arrays come back; the verdicts judge the student's
    by properties."""
    inputs, labels = mlm_mask(_long(ids), int(mask_id), int(vocab_size), torch.as_tensor(np.asarray(special_mask)),
                              float(mask_prob), generator=torch.Generator().manual_seed(0))
    return inputs.numpy(), labels.numpy()


def ref_mlm_loss(logits, labels):
    return np.float64(mlm_loss(torch.as_tensor(np.asarray(logits), dtype=torch.float64), _long(labels)).item())


def ref_t5_counts(length, noise_density=0.15, mean_span_length=3.0):
    return t5_span_counts(int(length), float(noise_density), float(mean_span_length))


def ref_t5_corruption(ids, noise_mask, sentinel_ids):
    inputs, targets = span_corruption_from_mask(_long(ids), torch.as_tensor(np.asarray(noise_mask)),
                                                [int(s) for s in sentinel_ids])
    return inputs.numpy(), targets.numpy()


def ref_best_span(start_logits, end_logits, max_answer_len):
    return best_span(torch.as_tensor(np.asarray(start_logits), dtype=torch.float64),
                     torch.as_tensor(np.asarray(end_logits), dtype=torch.float64), int(max_answer_len))


# --- verdicts of mlm_mask -----------------------------------------------------------------------------------


def _mlm_arrays(case: Case, values: tuple):
    """``(ids, special, inputs, labels)`` as int64 arrays, or a message when the returned values cannot be them."""
    ids, _, _, special = case.args
    inputs, labels = values
    for name, got in (("inputs", inputs), ("labels", labels)):
        if got.shape != ids.shape:
            return f"{name}: expected shape {ids.shape} (the shape of ids), got {got.shape}"
        if got.dtype == bool or not np.all(np.isfinite(got)) or not np.all(got == np.round(got)):
            return f"{name}: expected integer token ids, got dtype {got.dtype} with non-integer values"
    return ids, special, inputs.astype(np.int64), labels.astype(np.int64)


def _first(where) -> tuple:
    return tuple(int(i) for i in np.argwhere(where)[0])


def _invariant_problem(case: Case, values: tuple) -> str | None:
    arrays = _mlm_arrays(case, values)
    if isinstance(arrays, str):
        return arrays
    ids, special, inputs, labels = arrays
    vocab_size, mask_prob = case.args[2], case.kwargs["mask_prob"]
    selected = labels != IGNORE
    if np.any(selected & (labels != ids)):
        return (f"labels must be -100 or the original token; at index {_first(selected & (labels != ids))} "
                "the label is neither")
    if np.any(selected & special):
        return f"a special token was selected (label != -100) at index {_first(selected & special)}"
    if np.any(~selected & (inputs != ids)):
        return (f"index {_first(~selected & (inputs != ids))} is not selected (label -100) but its input token "
                "changed: only selected tokens may change")
    if np.any((inputs < 0) | (inputs >= vocab_size)):
        outside = (inputs < 0) | (inputs >= vocab_size)
        return f"inputs holds a token id outside [0, vocab_size) at index {_first(outside)}"
    if mask_prob == 1.0 and np.any(~selected & ~special):
        return (f"mask_prob = 1: every non-special token must be selected (label = its token), but index "
                f"{_first(~selected & ~special)} has label -100")
    if mask_prob == 0.0 and np.any(selected):
        return f"mask_prob = 0: nothing may be selected, but index {_first(selected)} has a label"
    return None


def _label(i: int, cases: list[Case]) -> str:
    return cases[i].label(i, len(cases), "mlm_mask")


def mlm_invariants(cases: list[Case], returned: list[tuple]) -> str | None:
    for i, values in enumerate(returned):
        problem = _invariant_problem(cases[i], values)
        if problem:
            return f"{_label(i, cases)}: {problem}"
    return None


def rate_bound(n: int) -> float:
    """The half-width ``t`` with ``2 exp(-2 n t^2) = FALSE_FAILURE`` (Hoeffding): a correct solution's rate over
    ``n`` independent trials leaves ``p +- t`` with probability at most ``FALSE_FAILURE``."""
    return math.sqrt(math.log(2 / FALSE_FAILURE) / (2 * n))


def _rate_problem(what: str, count: int, n: int, p: float, slack: float) -> str | None:
    bound = rate_bound(n) + slack
    if abs(count / n - p) <= bound:
        return None
    return (f"{what}: {count} of {n} = {count / n:.2%}, expected {p * 100:.3g}% +- {bound:.2%} (a correct solution "
            f"lands outside this range with probability below {FALSE_FAILURE:g})")


def _selection_problems(cases: list[Case], arrays: list[tuple]) -> tuple[int, str] | None:
    """Randomness that comes from ``rng``, is fresh from call to call and does not depend on position: the
    repeated case (same generator seed as case 1) returns exactly case 1's result; the case with the same ids
    and another seed selects each token independently of case 1 (both select it at rate ``p^2``, where a fixed
    pattern gives ``p``); and in each of the first three cases, disjoint neighbouring pairs are both selected
    at rate ``p^2`` (a pattern that spaces its selections out gives 0). ``(case index, message)`` or None."""
    first, repeat, other = arrays[0], arrays[REPEATED], arrays[RESEEDED]
    if not (np.array_equal(first[2], repeat[2]) and np.array_equal(first[3], repeat[3])):
        return (REPEATED, "the same rng (np.random.default_rng with the same seed) must give the same result, "
                          "but this call differs from hidden case 1: draw every random number from rng")
    p = cases[0].kwargs["mask_prob"]
    both = (first[3] != IGNORE) & (other[3] != IGNORE) & ~first[1]
    problem = _rate_problem("tokens selected by both this call and hidden case 1 (same ids, another seed)",
                            int(both.sum()), int((~first[1]).sum()), p * p, 0.0)
    if problem:
        return RESEEDED, problem + "; the selection must be random, not a fixed pattern"
    for i in range(3):
        ids, special, _, labels = arrays[i]
        pairs = ~special[..., 0:-1:2] & ~special[..., 1::2]
        selected = labels != IGNORE
        problem = _rate_problem("neighbouring pairs (positions 2j, 2j+1) both selected",
                                int((pairs & selected[..., 0:-1:2] & selected[..., 1::2]).sum()), int(pairs.sum()),
                                cases[i].kwargs["mask_prob"] ** 2, 0.0)
        if problem:
            return i, problem + "; each token must be selected independently of its position and neighbours"
    return None


def _replacement_problems(cases: list[Case], arrays: list[tuple]) -> tuple[int, str] | None:
    """The 10% random ids are uniform over all of ``[0, vocab_size)``: in the small-vocabulary case (ids from
    999 on), ids below ``vocab_size // 2`` other than ``mask_id`` appear at rate ``0.1 (V // 2 - 1) / V`` of
    the selected tokens; and in the case of vocabulary 3, a random draw equals the original token one time
    in three, so a selected token keeps its id at rate ``0.1 + 0.1 / 3``. ``(case index, message)`` or None."""
    ids, special, inputs, labels = arrays[LOW_IDS]
    mask_id, vocab = cases[LOW_IDS].args[1], cases[LOW_IDS].args[2]
    selected = labels != IGNORE
    low = selected & (inputs < vocab // 2) & (inputs != mask_id)
    problem = _rate_problem(f"selected tokens replaced by a random id below {vocab // 2}", int(low.sum()),
                            int(selected.sum()), 0.1 * (vocab // 2 - 1) / vocab, 0.0)
    if problem:
        return LOW_IDS, problem + "; random ids must be uniform over all of [0, vocab_size)"
    ids, special, inputs, labels = arrays[TINY_VOCAB]
    selected = labels != IGNORE
    kept = int((selected & (inputs == ids)).sum())
    problem = _rate_problem("selected tokens whose input is their original token", kept, int(selected.sum()),
                            0.1 + 0.1 / 3, 0.0)
    if problem:
        return TINY_VOCAB, problem + "; a random id may equal the original token"
    return None


# The spread of the counts, on SPREAD_CALLS calls of SPREAD_LENGTH non-special tokens (n = 40, p = 0.5): with k_i
# tokens selected and m_i of them replaced by mask_id in call i, a correct solution has k_i ~ Binomial(n, p) and,
# given k_i, m_i ~ Binomial(k_i, q) with q = 0.8 + 0.1 / vocab_size (a random id may be mask_id), independent across
# calls. The dispersions
#     D_count = sum_i (k_i - n p)^2 / (calls n p (1 - p)),    D_mask = sum_i (m_i - 0.8 k_i)^2 / (calls 0.16 n p)
# have mean 1 (D_mask: 0.99999); each is a sum of independent, identically distributed terms whose exact
# distribution (integers (k - 20)^2 and (5 m - 4 k)^2) is the calls-fold convolution of one term's, computed in
# tests/test_ps8910_grading.py: P(D_count <= 0.4) = 1.0e-8, P(D_count >= 2.5) = 1e-14, P(D_mask <= 0.4) = 1.1e-8,
# P(D_mask >= 2.5) = 1.4e-12, so a correct solution fails below 3e-8. A fixed count per call has D_count = 0; exactly
# round(0.8 k) masks per call, D_mask <= 0.25 / 3.2 < 0.1; one draw for a whole call (all or nothing), D_count = n.
SPREAD_CALLS, SPREAD_LENGTH, SPREAD_PROB = 100, 40, 0.5
SPREAD_BOUNDS = (0.4, 2.5)


def _dispersion_problem(what: str, dispersion: float) -> str | None:
    low, high = SPREAD_BOUNDS
    if low < dispersion < high:
        return None
    return (f"{what} varies from call to call {'less' if dispersion <= low else 'more'} than independent draws do "
            f"(dispersion {dispersion:.3g}: the variance over the calls divided by the binomial variance; a correct "
            f"solution lands in ({low}, {high}) except with probability below 3e-8)")


def _spread_problems(cases: list[Case], arrays: list[tuple]) -> str | None:
    """The dispersions of the selected count and of the [MASK] count over the spread calls (see SPREAD_BOUNDS)."""
    selected = np.array([(labels != IGNORE).sum() for _, _, _, labels in arrays[SPREAD:]])
    masked = np.array([((labels != IGNORE) & (inputs == case.args[1])).sum()
                       for (_, _, inputs, labels), case in zip(arrays[SPREAD:], cases[SPREAD:])])
    n, p, calls = SPREAD_LENGTH, SPREAD_PROB, len(selected)
    count = ((selected - n * p) ** 2).sum() / (calls * n * p * (1 - p))
    mask = ((masked - 0.8 * selected) ** 2).sum() / (calls * 0.16 * n * p)
    found = (_dispersion_problem("the number of selected tokens", count)
             or _dispersion_problem("the number of selected tokens replaced by mask_id", mask))
    if found:
        return (f"hidden cases {SPREAD + 1} to {len(cases)} ({calls} calls on {n} tokens, mask_prob {p}): {found}; "
                "select each token, and decide each selected token's fate, independently")
    return None


def mlm_statistics(cases: list[Case], returned: list[tuple]) -> str | None:
    """Among the non-special tokens, the fraction selected is ``mask_prob``; among the selected ones, 80% become
    ``mask_id`` and 10% stay unchanged (the other 10% are random tokens). A random draw may hit the mask id or
    the original token: that moves the two rates by at most ``1 / vocab_size``, the slack allowed. Then the
    properties of :func:`_selection_problems`, :func:`_replacement_problems` and :func:`_spread_problems`."""
    arrays = []
    for i, values in enumerate(returned):
        found = _mlm_arrays(cases[i], values)
        if isinstance(found, str):
            return f"{_label(i, cases)}: {found}"
        arrays.append(found)
    for i, (ids, special, inputs, labels) in enumerate(arrays[:SPREAD]):
        mask_id, vocab_size = cases[i].args[1], cases[i].args[2]
        selected = (labels != IGNORE) & ~special
        n, k = int((~special).sum()), int(selected.sum())
        if k == 0:
            return f"{_label(i, cases)}: no non-special token was selected (every label is -100)"
        slack = 1.0 / vocab_size
        for problem in (
            _rate_problem("selected non-special tokens", k, n, cases[i].kwargs["mask_prob"], 0.0),
            _rate_problem("selected tokens replaced by mask_id", int((selected & (inputs == mask_id)).sum()), k, 0.8,
                          slack),
            _rate_problem("selected tokens left unchanged", int((selected & (inputs == ids)).sum()), k, 0.1, slack),
        ):
            if problem:
                return f"{_label(i, cases)}: {problem}"
    found = _selection_problems(cases, arrays) or _replacement_problems(cases, arrays)
    if found:
        i, problem = found
        return f"{_label(i, cases)}: {problem}"
    return _spread_problems(cases, arrays)


# --- fresh inputs -------------------------------------------------------------------------------------------

# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _bert_batch(rng, batch, length, vocab_size, max_padding):
    """Rows ``[CLS] words [SEP] [PAD]...`` of ``length`` tokens (padding of 0 to ``max_padding`` tokens) and
    their special-token mask."""
    ids = rng.integers(FIRST_WORD, vocab_size, size=(batch, length))
    special = np.zeros((batch, length), dtype=bool)
    for row, pad in zip(ids, rng.integers(0, max_padding + 1, size=batch)):
        row[0], row[length - pad - 1] = CLS, SEP
        row[length - pad:] = PAD
    special[(ids == CLS) | (ids == SEP) | (ids == PAD)] = True
    return ids, special


def _mlm_case(ids, special, vocab_size, mask_prob, seed=None, mask_id=MASK, note=""):
    kwargs = {"mask_prob": float(mask_prob)}
    if seed is not None:
        kwargs["rng"] = RngArg(int(seed))
    return Case((ids, mask_id, int(vocab_size), special), kwargs, note=note)


def _mlm_invariants(rng):
    ids, special = _bert_batch(rng, 6, 20, 30522, 5)
    single, single_special = _bert_batch(rng, 1, 50, 30522, 0)
    crowded = rng.integers(FIRST_WORD, 30522, size=(6, 20))
    crowded_special = rng.random(crowded.shape) < 0.5
    crowded[crowded_special] = PAD
    vocab = int(rng.integers(2000, 40000))
    big, big_special = _bert_batch(rng, int(rng.integers(2, 9)), int(rng.integers(10, 65)), vocab, 8)
    return [_mlm_case(ids, special, 30522, 1.0, note="mask_prob 1: every non-special token selected"),
            _mlm_case(ids, special, 30522, 0.0, note="mask_prob 0"),
            _mlm_case(single[0], single_special[0], 30522, 0.5, note="ids of shape (T,)"),
            _mlm_case(crowded, crowded_special, 30522, 0.9, note="half the positions special"),
            _mlm_case(big, big_special, vocab, float(rng.uniform(0.1, 0.6)), note="a random batch and mask_prob")]


REPEATED, RESEEDED, LOW_IDS, TINY_VOCAB, SPREAD = 3, 4, 5, 6, 7  # positions of the special cases of _mlm_statistics


def _mlm_statistics(rng):
    # about 86,000 non-special tokens per case: 13,000 selected at 15%, a bound of about 3% on the 80/10/10 rates
    cases = []
    seeds = rng.choice(2**31, size=5 + SPREAD_CALLS, replace=False)
    for seed, (vocab, mask_prob) in zip(seeds, ((30522, 0.15), (int(rng.integers(1000, 50000)), 0.15),
                                                (int(rng.integers(1000, 50000)), float(rng.uniform(0.25, 0.5))))):
        ids, special = _bert_batch(rng, 192, 512, vocab, 128)
        cases.append(_mlm_case(ids, special, vocab, mask_prob, seed, note="the rates on 192 x 512 tokens"))
    first = cases[0]
    cases.append(Case(first.args, dict(first.kwargs), note="case 1 again, the same rng seed"))  # REPEATED
    cases.append(Case(first.args, dict(first.kwargs, rng=RngArg(int(seeds[3]))),
                      note="case 1's ids under another rng seed"))  # RESEEDED
    vocab = int(rng.integers(1000, 1900))  # LOW_IDS: every original id (>= 999) lies above vocab // 2
    ids, special = _bert_batch(rng, 96, 512, vocab, 64)
    cases.append(_mlm_case(ids, special, vocab, 0.5, seeds[4], note="a small vocabulary: random ids cover it all"))
    tiny = rng.integers(0, 2, size=(192, 512))  # TINY_VOCAB: ids 0 and 1, mask_id 2, vocab_size 3
    cases.append(_mlm_case(tiny, np.zeros(tiny.shape, dtype=bool), 3, 0.5, int(rng.integers(2**31)), mask_id=2,
                           note="vocabulary 3: a random id may be the original"))
    for seed in seeds[5:]:  # SPREAD: the counts' spread over many calls
        cases.append(_mlm_case(rng.integers(FIRST_WORD, 30522, size=SPREAD_LENGTH),
                               np.zeros(SPREAD_LENGTH, dtype=bool), 30522, SPREAD_PROB, seed,
                               note=f"one of {SPREAD_CALLS} calls on {SPREAD_LENGTH} tokens"))
    return cases


def _mlm_loss(rng):
    worked = (np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), np.array([0, IGNORE]))
    b, t, v = int(rng.integers(1, 4)), int(rng.integers(3, 12)), int(rng.integers(3, 20))
    labels = np.where(rng.random((b, t)) < 0.6, IGNORE, rng.integers(0, v, size=(b, t)))
    labels[0, 0] = int(rng.integers(0, v))  # at least one position is selected
    return [Case(worked, note="the worked example"),
            Case((rng.normal(size=(2, 5, 7)) * 3,
                  np.array([[1, IGNORE, 6, IGNORE, 0], [IGNORE, 2, IGNORE, IGNORE, 5]])),
                 note="logits (B, T, V), some labels -100"),
            Case((rng.normal(size=(6, 5)), np.array([3, IGNORE, 1, IGNORE, 4, 0])), note="logits (N, V), labels (N,)"),
            Case((rng.normal(size=(b, t, v)) * 2, labels), note="a random batch, most labels -100")]


def _mlm_loss_large(rng):
    # every position selected: this cell is about stability (the selection is test_mlm_loss's)
    b, t, v = int(rng.integers(1, 3)), int(rng.integers(3, 9)), int(rng.integers(4, 12))
    labels = rng.integers(0, v, size=(b, t))
    return [Case((np.array([[1000.0, 0.0, -1000.0], [0.0, 800.0, 0.0]]), np.array([1, 0])),
                 note="logits of +-1000 and 800: exp overflows without a shift"),
            Case((rng.normal(size=(b, t, v)) * 1000, labels), note="random logits in the thousands")]


def _t5_counts(rng):
    fixed = [((10, 0.15, 3.0), "1.5 noise tokens: round, not floor"),
             ((30, 0.15, 3.0), "4.5 noise tokens: half to even, not half up"),
             ((50, 0.15, 3.0), "7.5 noise tokens: half to even goes up here"),
             ((190, 0.15, 3.0), "float32 arithmetic: 190 * 0.15 is 28.500002 in float32"),
             ((20, 0.5, 4.0), "2.5 spans: half to even"),
             ((512, 0.15, 3.0), "the worked example")]
    drawn = [(int(rng.integers(40, 2049)), float(rng.choice([0.1, 0.15, 0.2, 0.3, 0.5])),
              float(rng.choice([2.0, 3.0, 3.5, 5.0]))) for _ in range(3)]
    return [Case(args, note=note) for args, note in fixed] + [Case(args, note="random arguments") for args in drawn]


def _t5_counts_clipping(rng):
    fixed = [((5, 0.01, 3.0), "0 noise tokens round up to 1, and one span"),
             ((2, 0.9, 1.0), "as many noise tokens as tokens: at most length - 1"),
             ((4, 0.99, 1.0), "at most length - 1 noise tokens, then as many spans"),
             ((10, 0.1, 3.0), "0 spans round up to 1")]
    length = int(rng.integers(2, 31))
    drawn = [((length, 0.01, 3.0), "almost no noise"), ((int(rng.integers(2, 41)), 0.99, 1.0), "almost all noise")]
    return [Case(args, note=note) for args, note in fixed + drawn]


T5_SENTINELS = np.arange(32099, 31999, -1)  # <extra_id_0> = 32099, <extra_id_1> = 32098, ... (T5's vocabulary)


def _t5_mask(rng, length, density, mean):
    seed = int(rng.integers(0, 2**31))
    return random_spans_noise_mask(length, density, mean, generator=torch.Generator().manual_seed(seed)).numpy()


def _t5_corruption(rng):
    fixed = np.array([0, 0, 1, 1, 0, 0, 0, 1, 0, 1], dtype=bool)  # three spans, one of two tokens
    cases = [Case((np.arange(10, 20), fixed, T5_SENTINELS), note="three spans, one of two tokens")]
    for density, mean in ((0.15, 3.0), (float(rng.choice([0.15, 0.3, 0.5])), float(rng.choice([2.0, 3.0])))):
        length = int(rng.integers(60, 301))
        cases.append(Case((rng.integers(0, 32000, size=length), _t5_mask(rng, length, density, mean), T5_SENTINELS),
                          note="a random mask from T5's span sampler"))
    return cases


def _t5_corruption_edges(rng):
    figure2 = np.array([0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0], dtype=bool)  # "Thank you [for inviting] ... [last] week ."
    length = int(rng.integers(20, 80))
    rolled = np.roll(_t5_mask(rng, length, 0.3, 2.0), int(rng.integers(1, length)))  # T5's random_roll option
    return [Case((np.arange(100, 111), figure2, T5_SENTINELS), note="the T5 paper's Figure 2"),
            Case((np.arange(100, 106), np.array([1, 1, 0, 1, 0, 0], dtype=bool), T5_SENTINELS),
                 note="a sequence that starts with noise"),
            Case((np.arange(100, 105), np.array([1, 0, 0, 1, 1], dtype=bool), T5_SENTINELS),
                 note="a sequence that starts and ends with noise"),
            Case((np.arange(100, 106), np.zeros(6, dtype=bool), T5_SENTINELS), note="no noise at all"),
            Case((rng.integers(0, 32000, size=length), rolled, T5_SENTINELS),
                 note="a random mask, rolled: noise may start at the first token")]


def _best_span(rng):
    cases = [Case((np.array([0.0, 0.0, 5.0]), np.array([4.0, 0.0, 0.0]), 3),  # the best pair has end < start
                  note="the largest scores would put the end before the start"),
             Case((np.array([5.0, 0.0, 0.0, 0.1]), np.array([0.2, 0.1, 0.3, 4.0]), 3),  # (0, 3) is one too long
                  note="the best-scoring span is one token too long"),
             Case((np.array([1.0, 0.0, 2.0]), np.array([0.5, 3.0, 0.0]), 1), note="max_answer_len 1"),
             Case((np.array([0.3, 1.0]), np.array([0.2, 0.1]), 5), note="max_answer_len longer than the sequence")]
    for _ in range(3):
        t = int(rng.integers(5, 61))
        start, end = rng.normal(size=t), rng.normal(size=t)
        question = int(rng.integers(0, t // 2))
        start[:question] = end[:question] = -np.inf  # the question's tokens cannot hold the answer
        cases.append(Case((start, end, int(rng.integers(1, 21))), note="random scores, question tokens at -inf"))
    return cases


def _best_span_ties(rng):
    cases = [Case((np.array([1.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0]), 3),  # (0, 1), (0, 2), (2, 2) tie
                  note="three spans tie: the tie rule decides"),
             Case((np.array([2.0, 2.0, 2.0, 2.0]), np.array([1.0, 1.0, 1.0, 1.0]), 2), note="every score equal"),
             Case((np.array([0.0, 2.0]), np.array([2.0, 0.0]), 2),  # (0, 0) and (1, 1) tie; (1, 0) is not allowed
                  note="two one-token spans tie, the best pair has the end before the start"),
             Case((np.array([1.0, 0.0]), np.array([0.0, 2.0]), 1),  # (0, 1) is one token too long
                  note="max_answer_len 1: the best pair is too long")]
    for _ in range(3):
        t = int(rng.integers(4, 30))
        cases.append(Case((rng.integers(-2, 3, size=t).astype(float), rng.integers(-2, 3, size=t).astype(float),
                           int(rng.integers(1, 8))), note="random integer scores: many ties"))
    return cases


CHECKS = {
    "test_mlm_invariants": Check("mlm_mask", _mlm_invariants, ref_mlm_mask, verdict=mlm_invariants,
                                 returns=("inputs", "labels")),
    "test_mlm_statistics": Check("mlm_mask", _mlm_statistics, ref_mlm_mask, verdict=mlm_statistics,
                                 returns=("inputs", "labels")),
    "test_mlm_loss": Check("mlm_loss", _mlm_loss, ref_mlm_loss, rtol=1e-6, atol=1e-9),
    "test_mlm_loss_large_logits": Check("mlm_loss", _mlm_loss_large, ref_mlm_loss, rtol=1e-6, atol=1e-9),
    "test_t5_counts": Check("t5_span_counts", _t5_counts, ref_t5_counts, rtol=0, atol=0,
                            returns=("n_noise", "n_spans")),
    "test_t5_counts_clipping": Check("t5_span_counts", _t5_counts_clipping, ref_t5_counts, rtol=0, atol=0,
                                     returns=("n_noise", "n_spans")),
    "test_t5_corruption": Check("t5_span_corruption", _t5_corruption, ref_t5_corruption, rtol=0, atol=0,
                                returns=("inputs", "targets")),
    "test_t5_corruption_edges": Check("t5_span_corruption", _t5_corruption_edges, ref_t5_corruption, rtol=0, atol=0,
                                      returns=("inputs", "targets")),
    "test_best_span": Check("best_span", _best_span, ref_best_span, rtol=0, atol=0, returns=("start", "end")),
    "test_best_span_ties": Check("best_span", _best_span_ties, ref_best_span, rtol=0, atol=0,
                                 returns=("start", "end")),
}


def _prob(case) -> float:
    return case.kwargs["mask_prob"]


def _noise_float32(case) -> float:
    length, density = case.args[0], case.args[1] if len(case.args) > 1 else 0.15
    return float(np.float32(length) * np.float32(density))


def _is_half(x: float) -> bool:
    return x % 1 == 0.5


def _valid_spans(case) -> list[tuple[float, int, int]]:
    """(score, start, end) of every allowed span of a best_span case: start <= end < start + max_answer_len."""
    start, end, longest = case.args
    return [(start[i] + end[j], i, j) for i in range(len(start)) for j in range(i, min(len(end), i + longest))]


def _overall_best(case) -> tuple[int, int]:
    start, end, _ = case.args
    scores = np.add.outer(start, end)
    return np.unravel_index(np.argmax(scores), scores.shape)


def _tie(case) -> bool:
    scores = [score for score, _, _ in _valid_spans(case)]
    return scores.count(max(scores)) > 1


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).
FAILURE_CLASSES = [
    FailureClass("MLM: mask_prob 1 (every non-special token)", "test_mlm_invariants", lambda case: _prob(case) == 1),
    FailureClass("MLM: mask_prob 0", "test_mlm_invariants", lambda case: _prob(case) == 0),
    FailureClass("MLM: ids of shape (T,)", "test_mlm_invariants", lambda case: case.args[0].ndim == 1),
    FailureClass("MLM: special tokens among the words (not only at the ends)", "test_mlm_invariants",
                 lambda case: case.args[3].mean() > 0.3 and 0 < _prob(case) < 1),
    FailureClass("MLM: rates on many tokens at 15%", "test_mlm_statistics",
                 lambda case: _prob(case) == 0.15 and (~case.args[3]).sum() >= 60000),
    FailureClass("MLM: rates at another mask_prob", "test_mlm_statistics",
                 lambda case: _prob(case) > 0.2 and (~case.args[3]).sum() >= 60000),
    FailureClass("MLM: a small vocabulary (random ids cover all of it)", "test_mlm_statistics",
                 lambda case: 3 < case.args[2] < 2000 and case.args[0][~case.args[3]].min() >= case.args[2] // 2),
    FailureClass("MLM: vocabulary 3 (a random id may be the original)", "test_mlm_statistics",
                 lambda case: case.args[2] == 3),
    FailureClass("MLM: many small calls (the counts' spread)", "test_mlm_statistics",
                 lambda case: case.args[0].shape == (SPREAD_LENGTH,) and _prob(case) == SPREAD_PROB),
    FailureClass("MLM loss: the worked example", "test_mlm_loss",
                 lambda case: case.args[0].ndim == 2 and (case.args[1] == IGNORE).any()),
    FailureClass("MLM loss: logits (B, T, V) with labels -100", "test_mlm_loss",
                 lambda case: case.args[0].ndim == 3 and (case.args[1] == IGNORE).any()),
    FailureClass("MLM loss: logits of +-1000 (exp overflows without a shift)", "test_mlm_loss_large_logits",
                 lambda case: np.abs(case.args[0]).max() >= 700),
    FailureClass("T5 counts: a noise count that is an exact half (half to even)", "test_t5_counts",
                 lambda case: _is_half(_noise_float32(case))),
    FailureClass("T5 counts: float32 and float64 round differently", "test_t5_counts",
                 lambda case: np.round(_noise_float32(case)) != np.round(case.args[0] * case.args[1])),
    FailureClass("T5 counts: a fraction above one half (round, not floor)", "test_t5_counts",
                 lambda case: _noise_float32(case) % 1 > 0.5),
    FailureClass("T5 counts: a span count that is an exact half", "test_t5_counts",
                 lambda case: _is_half(float(np.float32(ref_t5_counts(*case.args)[0]) / np.float32(case.args[2])))),
    FailureClass("T5 clipping: no noise token before clipping", "test_t5_counts_clipping",
                 lambda case: np.round(_noise_float32(case)) == 0),
    FailureClass("T5 clipping: every token noise before clipping", "test_t5_counts_clipping",
                 lambda case: np.round(_noise_float32(case)) >= case.args[0]),
    FailureClass("T5 clipping: no span before clipping", "test_t5_counts_clipping",
                 lambda case: np.round(np.float32(ref_t5_counts(*case.args)[0]) / np.float32(case.args[2])) == 0),
    FailureClass("T5 format: several spans, some longer than one token", "test_t5_corruption",
                 lambda case: np.diff(case.args[1].astype(int)).clip(0).sum() >= 2
                 and (case.args[1][1:] & case.args[1][:-1]).any()),
    FailureClass("T5 format: noise at the first token", "test_t5_corruption_edges", lambda case: case.args[1][0]),
    FailureClass("T5 format: noise at the last token", "test_t5_corruption_edges", lambda case: case.args[1][-1]),
    FailureClass("T5 format: no noise at all", "test_t5_corruption_edges", lambda case: not case.args[1].any()),
    FailureClass("best span: the best pair has the end before the start", "test_best_span",
                 lambda case: _overall_best(case)[1] < _overall_best(case)[0]),
    FailureClass("best span: the best pair is one token too long", "test_best_span",
                 lambda case: _overall_best(case)[1] - _overall_best(case)[0] == case.args[2]),
    FailureClass("best span: max_answer_len 1", "test_best_span", lambda case: case.args[2] == 1),
    FailureClass("best span: max_answer_len longer than the sequence", "test_best_span",
                 lambda case: case.args[2] > len(case.args[0])),
    FailureClass("best span: question tokens at -inf", "test_best_span", lambda case: np.isinf(case.args[0]).any()),
    FailureClass("best span ties: several best spans", "test_best_span_ties", _tie),
    FailureClass("best span ties: a tie of one-token spans", "test_best_span_ties",
                 lambda case: sum(1 for score, i, j in _valid_spans(case)
                                  if i == j and score == max(s for s, _, _ in _valid_spans(case))) > 1),
]
