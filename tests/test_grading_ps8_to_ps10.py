"""Grading of ps8-ps10 that students can trust (issue 33): input mutation is checked and blamed on the function at
fault, the check functions that ``depends_on`` names exist, and the bounds of ps8's spread statistics keep a
correct solution's failure probability below what the module states, computed exactly."""

from __future__ import annotations

import io

import numpy as np
import pytest
from scipy.signal import fftconvolve
from scipy.stats import binom

from autograder import assignments, capture
from autograder.checks import OUTPUTS, captured_files, expected_results, judge, write_inputs

PS8, PS10 = assignments.load("ps8-objectives"), assignments.load("ps10-parallel")


def chunk_slices(n, world_size):  # the notebook's given helper, which the answers below call
    sizes = [n // world_size + (1 if c < n % world_size else 0) for c in range(world_size)]
    starts = np.cumsum([0] + sizes)
    return [slice(int(starts[c]), int(starts[c + 1])) for c in range(world_size)]


def reduce_scatter(buffers, copy=True):
    """The ring reduce-scatter; ``copy=False`` works in the caller's array (the bug the text forbids)."""
    out = np.array(buffers, dtype=float) if copy else buffers
    world = out.shape[0]
    slices = chunk_slices(out.shape[1], world)
    for step in range(world - 1):
        sent = [(r, (r - step) % world) for r in range(world)]
        payloads = [out[r, slices[c]].copy() for r, c in sent]
        for (r, c), payload in zip(sent, payloads):
            out[(r + 1) % world, slices[c]] += payload
    return out


def _judged(module, gid, function, tmp_path):
    """The verdict of ``module``'s check ``gid`` on ``function``, through write_inputs, capture and judge, with
    only the files that ``captured_files`` lets a worker send back."""
    check = module.CHECKS[gid]
    cases = check.cases(np.random.default_rng(0))
    expected = expected_results(check, cases, module.TRUSTED_CALLABLES)
    write_inputs(gid, check, cases, expected, tmp_path / "inputs")
    capture.capture(gid, namespace={check.function: function}, inputs=str(tmp_path / "inputs"),
                    outputs=str(tmp_path / "outputs"))
    wanted = captured_files(check, gid, expected, cases)
    files = {f"{OUTPUTS}/{gid}/{p.name}": p.read_bytes() for p in (tmp_path / "outputs" / gid).iterdir()
             if f"{OUTPUTS}/{gid}/{p.name}" in wanted}
    return judge(check, gid, cases, expected, files)


def test_a_function_that_changes_its_argument_fails_and_the_feedback_names_the_argument(tmp_path):
    result = _judged(PS10, "test_reduce_scatter", lambda b: reduce_scatter(b, copy=False), tmp_path)
    assert not result.passed
    assert "hidden case 1 of" in result.message and "changed its argument `buffers` in place" in result.message
    assert "the text asks for a new array and the input unchanged" in result.message


def test_the_same_function_without_the_mutation_passes(tmp_path):
    assert _judged(PS10, "test_reduce_scatter", reduce_scatter, tmp_path).passed


def test_a_missing_copy_of_the_argument_fails(tmp_path):
    check = PS10.CHECKS["test_all_gather"]
    cases = check.cases(np.random.default_rng(0))
    expected = expected_results(check, cases, PS10.TRUSTED_CALLABLES)
    folder = f"{OUTPUTS}/test_all_gather"
    files = {f"{folder}/case{i}_out0.npy": _npy(e) for i, e in enumerate(expected)}
    result = judge(check, "test_all_gather", cases, expected, files)
    assert not result.passed and "received no copy of the argument `buffers`" in result.message
    files.update({f"{folder}/case{i}_after_arg0.npy": _npy(c.args[0]) for i, c in enumerate(cases)})
    assert judge(check, "test_all_gather", cases, expected, files).passed


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def test_only_checks_with_keeps_inputs_ask_for_the_arguments():
    for module in (PS8, PS10):
        for gid, check in module.CHECKS.items():
            cases = check.cases(np.random.default_rng(0))
            names = captured_files(check, gid, expected_results(check, cases, module.TRUSTED_CALLABLES), cases)
            assert any("_after_" in n for n in names) == bool(check.keeps_inputs), gid


@pytest.mark.parametrize("name", ["ps8-objectives", "ps9-data", "ps10-parallel"])
def test_depends_on_names_functions_of_the_set(name):
    checks = assignments.load(name).CHECKS
    functions = {check.function for check in checks.values()}
    for gid, check in checks.items():
        assert set(check.depends_on) <= functions - {check.function}, (gid, check.depends_on)


def _sum_distribution(one_term: np.ndarray, calls: int) -> np.ndarray:
    """The distribution of the sum of ``calls`` independent copies of an integer variable with pmf ``one_term``."""
    total, power = np.array([1.0]), one_term
    while calls:
        if calls & 1:
            total = np.clip(fftconvolve(total, power), 0, None)
        power = np.clip(fftconvolve(power, power), 0, None)
        calls >>= 1
    return total / total.sum()


def test_the_spread_bounds_fail_a_correct_mlm_mask_with_probability_below_3e_8():
    """Exact tails of ps8's dispersions (see SPREAD_BOUNDS): k ~ Binomial(n, p) selected, m ~ Binomial(k, q)
    masked with q = 0.8 + 0.1 / 30522, independent over the calls."""
    n, p, calls, (low, high) = PS8.SPREAD_LENGTH, PS8.SPREAD_PROB, PS8.SPREAD_CALLS, PS8.SPREAD_BOUNDS
    q = 0.8 + 0.1 / 30522
    k = np.arange(n + 1)
    count_term = np.zeros(int((n * max(p, 1 - p)) ** 2) + 1)
    np.add.at(count_term, ((k - n * p) ** 2).astype(int), binom.pmf(k, n, p))
    mask_term = np.zeros(25 * n * n + 1)  # (5 m - 4 k)^2 = 25 (m - 0.8 k)^2, an integer
    for selected in k:
        m = np.arange(selected + 1)
        np.add.at(mask_term, (5 * m - 4 * selected) ** 2, binom.pmf(selected, n, p) * binom.pmf(m, selected, q))
    failure = 0.0
    for term, unit in ((count_term, calls * n * p * (1 - p)), (mask_term, 25 * calls * 0.16 * n * p)):
        cdf = np.cumsum(_sum_distribution(term, calls))
        failure += cdf[int(np.floor(low * unit))] + 1 - cdf[int(np.ceil(high * unit)) - 1]
    assert failure < 3e-8, failure
    assert failure > 1e-9  # the bounds are not looser than they need be
