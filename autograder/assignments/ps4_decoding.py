"""Trusted checks of ps4-decoding: fresh inputs for every hidden test cell, llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps4-decoding/ps4-decoding.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import Case, Check, FailureClass
from llmarch.attention import scaled_dot_product_attention
from llmarch.decoding import temperature_scale, top_k_filter, top_p_filter

NOTEBOOK = "ps4-decoding.ipynb"
TRUSTED_CALLABLES: dict = {}


def _t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def ref_top_k(logits, k):
    return top_k_filter(_t(logits), int(k)).numpy()


def ref_top_p(logits, p):
    return top_p_filter(_t(logits), float(p)).numpy()


def ref_sample(logits, temperature, u):
    """Inverse-CDF sampling: the first index whose cumulative probability exceeds u."""
    probs = torch.softmax(temperature_scale(_t(logits), float(temperature)), dim=-1)
    index = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor([float(u)], dtype=torch.float64), right=True))
    return np.float64(min(index, len(probs) - 1))


def ref_beam_step(beams, scores, logprobs, beam_size):
    total = (_t(scores)[:, None] + _t(logprobs)).reshape(-1)
    values, order = torch.sort(total, descending=True, stable=True)
    order = order[: int(beam_size)]
    beam_index, token = order // logprobs.shape[1], order % logprobs.shape[1]
    new_beams = torch.cat([torch.as_tensor(beams)[beam_index], token[:, None]], dim=1)
    return new_beams.double().numpy(), values[: int(beam_size)].numpy()


def ref_cached_step(q, k, v, k_cache, v_cache):
    keys = torch.cat([_t(k_cache), _t(k)[None]])
    values = torch.cat([_t(v_cache), _t(v)[None]])
    out = scaled_dot_product_attention(_t(q)[None], keys, values)[0]
    return out.numpy(), keys.numpy(), values.numpy()


# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.
# Ties are exact: equal logits, or probabilities that are powers of two.


def _top_k_small(rng):
    v = int(rng.integers(4, 12))
    ties = np.round(rng.normal(size=v), 0)  # rounded: ties at the threshold happen
    return [Case((np.array([1.0, 3.0, 2.0, 3.0, 2.0, 0.0]), 3),  # the 3rd largest, 2, ties with the 4th: keep 4
                 note="the k-th largest logit ties with the next"),
            Case((np.array([2.0, 5.0, 5.0, 1.0]), 1), note="k = 1 and a tie at the top"),  # keep both
            Case((rng.normal(size=v), int(rng.integers(1, v))), note="random logits, a random k"),
            Case((ties, 2), note="rounded logits, k = 2: ties at the threshold")]


def _top_k_batch(rng):
    return [Case((np.array([[1.0, 5.0, 3.0], [9.0, 0.0, 4.0]]), 1), note="two rows, k = 1: each row on its own"),
            Case((rng.normal(size=(2, 4)), 4), note="k equal to the vocabulary size"),
            Case((rng.normal(size=(3, 7)), int(rng.integers(1, 7))), note="three rows, a random k"),
            Case((rng.normal(size=(2, 4, 5)), 9), note="three axes, k larger than the vocabulary")]


def _top_p(rng):
    return [Case((np.log(np.array([0.1, 0.5, 0.15, 0.25])), 0.7),  # keeps the token that crosses p: 0.5 and 0.25
                 note="the token whose probability crosses p"),
            Case((np.zeros(4), 0.5), note="four equally probable tokens, p = 0.5"),  # the first two
            Case((np.array([[0.0, -40.0, -50.0], [1.0, 1.0, -45.0]]), 1.0),  # p = 1 keeps the negligible tail
                 note="p = 1 with a negligible tail"),
            Case((np.log(np.array([0.1, 0.5, 0.15, 0.25])), 0.01), note="p below the largest probability")] + [
        Case((rng.normal(size=(4, 9)) * 2, float(p)), note="rows of random logits, a random p")
        for p in rng.uniform(0.05, 0.99, size=3)]


def _sampling(rng):
    logits = rng.normal(size=8)
    return [Case((np.zeros(4), 1.0, 0.5),  # u = P0 + P1 exactly: index 2 (the running sum must *exceed* u)
                 note="u exactly equal to a cumulative probability"),
            Case((np.zeros(4), 1.0, 0.0), note="u = 0"),
            Case((np.log(np.array([0.2, 0.5, 0.3])), 0.05, 0.9), note="a low temperature, 0.05"),
            Case((np.log(np.array([0.2, 0.5, 0.3])), 1.0, 0.1), note="temperature 1, a small u"),
            # P = (0.731, 0.269, 0) and u above 0.75: token 1, which an overflowing exp (nan) never returns
            Case((np.array([1000.0, 999.0, 0.0]), 1.0, float(rng.uniform(0.75, 0.95))),
                 note="logits near 1000 (exp overflows without subtracting the maximum)"),
            Case((np.array([8.0, 7.99, 1.0]), 0.01, float(rng.uniform(0.75, 0.95))),
                 note="logits in [1, 8] at temperature 0.01 (logits / T near 800)")] + [
        Case((logits, float(t), float(u)), note="random logits, temperature and u")
        for t, u in zip(rng.uniform(0.3, 2.0, size=4), rng.random(4))]


def _beam(rng):
    n, t, v = int(rng.integers(2, 4)), int(rng.integers(1, 4)), int(rng.integers(3, 7))
    logprobs = np.log(rng.dirichlet(np.ones(v), size=n))
    half = np.log(np.full(2, 0.5))
    return [Case((np.array([[5], [7]]), half, np.log(np.full((2, 2), 0.5)), 3),
                 note="four equally good extensions, beam size 3"),
            Case((np.array([[0, 1], [0, 2]]), np.log(np.array([0.6, 0.4])),  # the best extension is from beam 1;
                  np.log(np.array([[0.25, 0.25, 0.25, 0.25], [0.05, 0.04, 0.01, 0.9]])), 2),  # then a tie
                 note="beams of unequal scores, with a tie among the extensions"),
            Case((np.array([[3], [1]]), np.log(np.array([0.5, 0.25])), np.log(np.array([[0.5, 0.5], [0.5, 0.5]])), 1),
                 note="beam size 1"),
            Case((np.array([[2], [4]]), np.log(np.array([0.9, 0.1])), np.log(np.array([[0.6, 0.4], [0.7, 0.3]])), 2),
                 note="the weaker beam holds the most probable next token"),
            Case((rng.integers(0, v, size=(n, t)), np.log(rng.dirichlet(np.ones(n))), logprobs, int(rng.integers(1, n * v))),
                 note="random beams, scores, log-probabilities and beam size")]


def _cache_first(rng):
    d = int(rng.integers(2, 6))
    return [Case((rng.normal(size=d), rng.normal(size=d), rng.normal(size=d), np.zeros((0, d)), np.zeros((0, d))),
                 note="the first step: an empty cache")]


def _cache_steps(rng):
    d, t = int(rng.integers(2, 8)), int(rng.integers(1, 9))
    return [Case((rng.normal(size=d), rng.normal(size=d), rng.normal(size=d), rng.normal(size=(t, d)),
                  rng.normal(size=(t, d))), note="a cache of earlier tokens")]


CHECKS = {
    "test_top_k_small": Check("top_k_filter", _top_k_small, ref_top_k),
    "test_top_k_batch": Check("top_k_filter", _top_k_batch, ref_top_k),
    "test_top_p": Check("top_p_filter", _top_p, ref_top_p),
    "test_sampling": Check("sample_with_temperature", _sampling, ref_sample, rtol=0, atol=0),
    "test_beam_step": Check("beam_search_step", _beam, ref_beam_step),
    "test_cache_first": Check("cached_attention_step", _cache_first, ref_cached_step),
    "test_cache_steps": Check("cached_attention_step", _cache_steps, ref_cached_step),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _kth_ties_next(case):
    """The k-th largest logit of some row equals the (k+1)-th (a tie at the threshold)."""
    logits, k = np.asarray(case.args[0]), int(case.args[1])
    ordered = -np.sort(-logits.reshape(-1, logits.shape[-1]), axis=-1)
    return k < logits.shape[-1] and bool((ordered[:, k - 1] == ordered[:, k]).any())


def _row_thresholds_differ(case):
    """Rows whose top-k differs from a threshold taken over the whole batch."""
    logits, k = np.asarray(case.args[0]), int(case.args[1])
    return logits.ndim > 1 and k < logits.shape[-1] and not np.array_equal(
        ref_top_k(logits, k) > -np.inf, logits >= np.sort(logits, axis=None)[-k])


def _probs(logits):
    logits = np.asarray(logits, dtype=float)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).reshape(-1, logits.shape[-1])


def _crosses_p(case):
    """Some row's sorted cumulative probability passes p strictly inside a token."""
    cumulative = np.cumsum(-np.sort(-_probs(case.args[0]), axis=-1), axis=-1)
    return bool(((cumulative[:, :-1] < case.args[1]) & (case.args[1] < cumulative[:, 1:])).any())


def _tie_at_top_p_cut(case):
    """Equal probabilities in a row, some of them kept and some removed (the lower index wins)."""
    probs, kept = _probs(case.args[0]), (ref_top_p(case.args[0], case.args[1]) > -np.inf).reshape(-1, np.shape(case.args[0])[-1])
    return any(np.isin(probs[r][kept[r]], probs[r][~kept[r]]).any() for r in range(len(probs)))


def _beam_total(case):
    beams, scores, logprobs, beam_size = case.args
    return (scores[:, None] + logprobs).reshape(-1)


def _beam_tie_in_top(case):
    """Two equal totals among the best beam_size + 1 (the order of the flattened extensions decides)."""
    top = np.sort(_beam_total(case))[::-1][: case.args[3] + 1]
    return len(np.unique(top)) < len(top)


FAILURE_CLASSES = [
    FailureClass("the k-th largest logit ties with the next", "test_top_k_small", _kth_ties_next),
    FailureClass("k = 1 and a tie at the top", "test_top_k_small",
                 lambda case: case.args[1] == 1 and np.sum(case.args[0] == np.max(case.args[0])) > 1),
    FailureClass("k below the vocabulary size, no tie", "test_top_k_small",
                 lambda case: case.args[1] < np.shape(case.args[0])[-1] and not _kth_ties_next(case)),
    FailureClass("rows whose own thresholds differ from the batch's", "test_top_k_batch", _row_thresholds_differ),
    FailureClass("k equal to the vocabulary size", "test_top_k_batch",
                 lambda case: case.args[1] == np.shape(case.args[0])[-1]),
    FailureClass("k larger than the vocabulary, three axes", "test_top_k_batch",
                 lambda case: case.args[1] > np.shape(case.args[0])[-1] and np.ndim(case.args[0]) == 3),
    FailureClass("p passed strictly inside a token (the token that crosses p is kept)", "test_top_p", _crosses_p),
    FailureClass("equal probabilities on both sides of the cut (ties to the lower index)", "test_top_p", _tie_at_top_p_cut),
    FailureClass("p = 1 with a negligible tail", "test_top_p",
                 lambda case: case.args[1] >= 1 and (_probs(case.args[0]) < 1e-15).any()),
    FailureClass("p below the largest probability (only the top token stays)", "test_top_p",
                 lambda case: (case.args[1] < _probs(case.args[0]).max(axis=-1)).any()),
    FailureClass("logits not sorted by probability", "test_top_p",
                 lambda case: any((np.diff(row) > 0).any() for row in _probs(case.args[0]))),
    FailureClass("u exactly equal to a cumulative probability", "test_sampling",
                 lambda case: case.args[2] in np.cumsum(_probs(np.asarray(case.args[0]) / case.args[1])[0])),
    FailureClass("u = 0", "test_sampling", lambda case: case.args[2] == 0),
    FailureClass("logits / T above 709 (exp overflows without subtracting the maximum)", "test_sampling",
                 lambda case: np.max(np.asarray(case.args[0]) / case.args[1]) > 709),
    FailureClass("a temperature whose sample differs from temperature 1 and from multiplying by it", "test_sampling",
                 lambda case: ref_sample(*case.args) != ref_sample(case.args[0], 1.0, case.args[2])
                 and ref_sample(*case.args) != ref_sample(case.args[0], 1 / case.args[1], case.args[2])),
    FailureClass("a sample that is not the most probable token", "test_sampling",
                 lambda case: ref_sample(*case.args) != np.argmax(case.args[0])),
    FailureClass("a tie among the best extensions", "test_beam_step", _beam_tie_in_top),
    FailureClass("a number of beams other than the vocabulary size (unflattening)", "test_beam_step",
                 lambda case: case.args[2].shape[0] != case.args[2].shape[1] and case.args[3] > 1),
    FailureClass("beam scores that change the ranking of the extensions", "test_beam_step",
                 lambda case: not np.array_equal(np.argsort(-_beam_total(case), kind="stable")[: case.args[3]],
                                                 np.argsort(-case.args[2].reshape(-1), kind="stable")[: case.args[3]])),
    FailureClass("beam size 1", "test_beam_step", lambda case: case.args[3] == 1),
    FailureClass("an empty cache", "test_cache_first", lambda case: case.args[3].shape[0] == 0),
    FailureClass("a cache of earlier tokens, d >= 2 (the order of keys and the 1/sqrt(d) scale matter)",
                 "test_cache_steps", lambda case: case.args[3].shape[0] >= 1 and case.args[0].shape[-1] >= 2),
]
