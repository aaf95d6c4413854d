"""Trusted checks of ps6-scaling: fresh inputs for every hidden test cell, llmarch.scaling as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps6-scaling/ps6-scaling.ipynb``.

The Chinchilla fit is badly conditioned: quite different constants predict almost the same losses, so a fit is
judged by what it predicts, not by its parameters. The hidden cells call ``fitted_losses`` (defined in the
notebook's read-only setup cell: the student's ``chinchilla_fit``, then the law at new points) on fresh runs, and
the predictions at the runs and at larger models must agree with those of ``llmarch.scaling.fit_chinchilla``
(Hoffmann et al.'s 4500 L-BFGS starts) to 0.1% (``FIT_RTOL``). Measured on the runs of seeds 0-59: the notebook's
solution and a PyTorch L-BFGS fit on centred logarithms stay within 6e-5 of the reference; least squares in log space
(no Huber loss) misses by 0.9% to 12%; an L-BFGS on uncentred logarithms sometimes stops early and misses by up to 2%.
"""

from __future__ import annotations

import numpy as np

from autograder.checks import Case, Check, FailureClass
from llmarch.scaling import (CHINCHILLA_APPROACH3, chinchilla_loss, chinchilla_optimal, fit_chinchilla,
                             fit_power_law, training_flops)

NOTEBOOK = "ps6-scaling.ipynb"
TRUSTED_CALLABLES: dict = {}
FIT_RTOL = 1e-3  # predictions of the student's fit vs the reference fit (see the module docstring)


def ref_power_law(x, y):
    fit = fit_power_law(x, y)
    return np.float64(fit.a), np.float64(fit.b)


def ref_training_flops(N, D):
    return np.asarray(training_flops(N, D), dtype=np.float64)


def ref_compute_optimal(C, **constants):
    opt = chinchilla_optimal(C, **constants)
    return np.asarray(opt.N_opt, dtype=np.float64), np.asarray(opt.D_opt, dtype=np.float64)


def ref_objective(params, N, D, loss, delta=1e-3):
    """Hoffmann et al.'s objective: sum of Huber_delta(log L(N_i, D_i) - log loss_i) (llmarch.scaling.fit_chinchilla)."""
    r = np.log(chinchilla_loss(N, D, **params)) - np.log(loss)
    return np.float64(np.sum(np.where(np.abs(r) <= delta, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))))


def ref_fitted_losses(N, D, loss, N_new, D_new):
    return np.asarray(chinchilla_loss(N_new, D_new, **fit_chinchilla(N, D, loss)), dtype=np.float64)


# ----------------------------------------------------------------------------------------------------------
# Fresh inputs
# ----------------------------------------------------------------------------------------------------------

# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _power_law_exact(rng):
    a, b = float(np.exp(rng.uniform(-3, 6))), float(rng.uniform(-1.2, 1.2))
    x = np.exp(rng.uniform(-2, 15, size=int(rng.integers(3, 9))))
    two = np.array([float(rng.uniform(1, 10)), float(rng.uniform(100, 1000))])
    decades = np.array([2.0, 5.0, 30.0, 400.0])
    return [Case((decades, 3.0 * decades**-0.5), note="an exact power law over four decades"),
            Case((x, a * x**b), note="an exact power law, random a, b and points"),
            Case((two, 2.5 * two**-0.7), note="an exact power law through two points")]


def _power_law_noisy(rng):
    cases = [Case((np.array([1.0, 10.0, 100.0]), np.array([4.0, 2.5, 1.0])), note="the worked example")]
    for _ in range(2):
        n = int(rng.integers(10, 41))
        low = rng.uniform(-3, 12)
        x = np.exp(rng.uniform(low, low + rng.uniform(4, 18), size=n))  # unsorted, 2 to 8 decades
        a, b = float(np.exp(rng.uniform(-3, 6))), float(rng.uniform(-1.2, 1.2))
        cases.append(Case((x, a * x**b * np.exp(rng.uniform(0.05, 0.3) * rng.normal(size=n))),
                          note="a noisy power law, unsorted points over 2 to 8 decades"))
    return cases


def _training_flops(rng):
    return [Case((70e9, 1.4e12), note="Chinchilla's model and data size"),
            Case((float(rng.uniform(1e8, 1e11)), float(rng.uniform(1e9, 1e13))), note="random sizes, as floats"),
            Case((np.exp(rng.uniform(15, 25, size=(3, 1))), np.exp(rng.uniform(20, 28, size=4))),
                 note="arrays (3, 1) and (4,) that broadcast")]


def _optimal_closed_form(rng):
    constants = dict(CHINCHILLA_APPROACH3)
    return [Case((np.exp(rng.uniform(np.log(1e18), np.log(1e26), size=5)),), constants,
                 note="Chinchilla's constants, five budgets from 1e18 to 1e26"),
            Case((float(5.76e23 * rng.uniform(0.5, 2.0)),), constants,
                 note="Chinchilla's constants, one budget as a float")]


def _random_constants(rng):
    return {"E": float(rng.uniform(1.0, 3.0)), "A": float(np.exp(rng.uniform(np.log(20), np.log(5000)))),
            "B": float(np.exp(rng.uniform(np.log(20), np.log(5000)))), "alpha": float(rng.uniform(0.15, 0.7)),
            "beta": float(rng.uniform(0.15, 0.7))}


def _optimal_brute_force(rng):
    same = _random_constants(rng)
    same["beta"] = same["alpha"]  # alpha = beta: a constant number of tokens per parameter
    return [Case((np.exp(rng.uniform(np.log(1e17), np.log(1e27), size=(2, 3))),), _random_constants(rng),
                 note="random constants, budgets of shape (2, 3)"),
            Case((float(np.exp(rng.uniform(np.log(1e19), np.log(1e25)))),), _random_constants(rng),
                 note="random constants, one budget as a float"),
            Case((np.geomspace(1e18, 1e24, 4),), same, note="alpha = beta")]


def _chinchilla_like(rng):
    return {"E": float(rng.uniform(1.5, 2.0)), "A": float(np.exp(rng.uniform(np.log(200), np.log(2000)))),
            "B": float(np.exp(rng.uniform(np.log(200), np.log(2000)))), "alpha": float(rng.uniform(0.28, 0.42)),
            "beta": float(rng.uniform(0.28, 0.42))}


def _objective(rng):
    # the worked example: residuals (-0.0005, 0.01), one in each zone of the Huber loss; then delta = 1
    worked = ({"E": 1.0, "A": 100.0, "B": 100.0, "alpha": 1.0, "beta": 1.0}, np.array([1e2, 1e4]), np.array([1e2, 1e4]),
              np.array([3.0 * np.exp(0.0005), 1.02 * np.exp(-0.01)]))
    cases = [Case(worked, note="the worked example: one residual in each zone of the Huber loss"),
             Case(worked, {"delta": 1.0}, note="the worked example, delta = 1"),
             Case(worked, {"delta": 0.002}, note="the worked example, delta = 0.002")]
    for kwargs in ({}, {"delta": float(rng.uniform(0.003, 0.03))}):
        params, n = _chinchilla_like(rng), int(rng.integers(8, 25))
        N, D = np.exp(rng.uniform(np.log(1e7), np.log(1e10), size=n)), np.exp(rng.uniform(np.log(1e9), np.log(1e12), size=n))
        noise = rng.normal(size=n) * np.where(rng.random(n) < 0.2, 0.05, 0.002)  # both zones of the Huber loss
        cases.append(Case((params, N, D, chinchilla_loss(N, D, **params) * np.exp(noise)), kwargs,
                          note="noisy losses of a random law" + (", a random delta" if kwargs else ", default delta")))
    return cases


def _isoflop_runs(rng, sigma, n_diverged, note):
    """IsoFLOP-style runs from a random Chinchilla-like law: 6 budgets in [1e18, 1e21] FLOPs, 6 model sizes each
    around 20 tokens per parameter; multiplicative log-normal noise, and ``n_diverged`` runs 5-20% too high. Also
    the points to predict: the runs themselves and four larger models (up to 5x the largest, 20 tokens each)."""
    params = _chinchilla_like(rng)
    budgets = np.geomspace(1e18, 1e21, 6) * np.exp(rng.uniform(-0.3, 0.3, size=6))
    N = np.concatenate([np.sqrt(c / 120) * np.geomspace(1 / 8, 8, 6) * np.exp(rng.uniform(-0.1, 0.1, size=6))
                        for c in budgets])
    D = np.repeat(budgets, 6) / (6 * N)
    loss = chinchilla_loss(N, D, **params) * np.exp(sigma * rng.normal(size=N.size))
    loss[rng.choice(N.size, n_diverged, replace=False)] *= rng.uniform(1.05, 1.2, size=n_diverged)
    larger = np.geomspace(N.max(), 5 * N.max(), 4)
    return Case((N, D, loss, np.concatenate([N, larger]), np.concatenate([D, 20 * larger])), note=note)


def _fit_exact(rng):
    return [_isoflop_runs(rng, 0.0, 0, "noise-free IsoFLOP runs of a random Chinchilla-like law")]


def _fit_noisy(rng):
    return [_isoflop_runs(rng, float(rng.uniform(0.005, 0.01)), 2, "noisy IsoFLOP runs, two of them diverged")]


CHECKS = {
    "test_power_law_exact": Check("fit_power_law", _power_law_exact, ref_power_law),
    "test_power_law_noisy": Check("fit_power_law", _power_law_noisy, ref_power_law),
    "test_training_flops": Check("training_flops", _training_flops, ref_training_flops, rtol=1e-12, atol=0),
    "test_optimal_closed_form": Check("compute_optimal", _optimal_closed_form, ref_compute_optimal, atol=0),
    "test_optimal_brute_force": Check("compute_optimal", _optimal_brute_force, ref_compute_optimal, atol=0),
    "test_objective": Check("chinchilla_objective", _objective, ref_objective, rtol=1e-8, atol=1e-15),
    "test_fit_exact": Check("fitted_losses", _fit_exact, ref_fitted_losses, rtol=FIT_RTOL, atol=0),
    "test_fit_noisy": Check("fitted_losses", _fit_noisy, ref_fitted_losses, rtol=FIT_RTOL, atol=0),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _log_residuals(x, y):
    """log y minus the least-squares line through (log x, log y)."""
    u, v = np.log(x), np.log(y)
    b, log_a = np.polyfit(u, v, 1)
    return v - (log_a + b * u)


def _huber_zones(case):
    """(any residual inside |r| <= delta, any outside) for an objective case."""
    params, N, D, loss = case.args
    r = np.abs(np.log(chinchilla_loss(N, D, **params)) - np.log(loss))
    delta = case.kwargs.get("delta", 1e-3)
    return (r <= delta).any(), (r > delta).any()


def _fit_residuals(case):
    """log loss of every run minus the reference fit's log prediction there (about 0.7 s)."""
    N, D, loss = case.args[:3]
    return np.log(loss) - np.log(ref_fitted_losses(N, D, loss, N, D))


FAILURE_CLASSES = [
    FailureClass("an exact power law through two points", "test_power_law_exact", lambda case: len(case.args[0]) == 2),
    FailureClass("an exact power law with a negative exponent and a prefactor above 2 (a, not log a)",
                 "test_power_law_exact", lambda case: ref_power_law(*case.args)[1] < 0 and ref_power_law(*case.args)[0] > 2),
    FailureClass("noisy points (the regression's direction and the prefactor's space matter)", "test_power_law_noisy",
                 lambda case: np.abs(_log_residuals(*case.args)).max() > 0.01),
    FailureClass("unsorted points", "test_power_law_noisy", lambda case: (np.diff(case.args[0]) < 0).any()),
    FailureClass("sizes as floats", "test_training_flops", lambda case: np.ndim(case.args[0]) == 0),
    FailureClass("arrays of different shapes that broadcast", "test_training_flops",
                 lambda case: np.shape(case.args[0]) != np.shape(case.args[1])),
    FailureClass("Chinchilla's constants, an array of budgets", "test_optimal_closed_form",
                 lambda case: case.kwargs == CHINCHILLA_APPROACH3 and np.ndim(case.args[0]) == 1),
    FailureClass("Chinchilla's constants, one budget as a float", "test_optimal_closed_form",
                 lambda case: case.kwargs == CHINCHILLA_APPROACH3 and np.ndim(case.args[0]) == 0),
    FailureClass("random constants with alpha != beta, budgets of two axes", "test_optimal_brute_force",
                 lambda case: case.kwargs["alpha"] != case.kwargs["beta"] and np.ndim(case.args[0]) == 2),
    FailureClass("alpha = beta", "test_optimal_brute_force", lambda case: case.kwargs["alpha"] == case.kwargs["beta"]),
    FailureClass("residuals in both zones of the Huber loss", "test_objective", lambda case: all(_huber_zones(case))),
    FailureClass("a delta other than 1e-3", "test_objective", lambda case: case.kwargs.get("delta", 1e-3) != 1e-3),
    FailureClass("several points (a sum, not a mean)", "test_objective", lambda case: len(case.args[1]) > 1),
    FailureClass("noise-free runs, predictions at larger models", "test_fit_exact",
                 lambda case: case.args[3].max() > case.args[0].max() and np.abs(_fit_residuals(case)).max() < 1e-6),
    FailureClass("noisy runs with some far above the law (diverged), predictions at larger models", "test_fit_noisy",
                 lambda case: case.args[3].max() > case.args[0].max() and _fit_residuals(case).max() > 0.03),
]
