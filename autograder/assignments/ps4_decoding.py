"""Trusted checks of ps4-decoding: fresh inputs for every hidden test cell, llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps4-decoding/ps4-decoding.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import Case, Check
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
            Case((np.log(np.array([0.2, 0.5, 0.3])), 1.0, 0.1), note="temperature 1, a small u")] + [
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
