"""The committed results of book/experiments/scaling_study.py (read by book/scaling-laws.md) are complete,
consistent with their own definitions, and physically sensible. Regenerate them with `make experiments`.

The references are independent of the script: parameter counts from the closed form for the course's GPT,
the entropy rate recomputed from the grammar, 6ND recomputed from the columns, and bounds that no
trained model can violate (no loss below the Bayes-optimal loss on the same windows)."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmarch.data import default_grammar

DATA = Path(__file__).resolve().parents[1] / "book" / "data"
CSV_PATH, JSON_PATH = DATA / "scaling_study.csv", DATA / "scaling_study.json"
HEADER = [
    "model", "d_model", "n_layers", "n_heads", "n_params", "n_params_non_embedding", "budget_tokens", "final",
    "step", "tokens", "flops", "train_loss", "eval_loss", "irreducible_loss", "entropy_rate",
]
VOCAB = 36  # the default grammar's words, one token each
# A model can beat the Bayes-optimal predictor on a finite evaluation set only by chance, and by very little.
BAYES_TOL = 2e-3
# Between neighbouring budgets a saturated model's loss may move up by seed noise (about 1e-3 observed).
NOISE_TOL = 3e-3


@pytest.fixture(scope="module")
def study():
    assert CSV_PATH.exists() and JSON_PATH.exists(), "run `make experiments` to create the scaling study files"
    with CSV_PATH.open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == HEADER
        rows = [{k: (v if k == "model" else float(v)) for k, v in r.items()} for r in reader]
    return rows, json.loads(JSON_PATH.read_text())


def final_grid(rows):
    """``{(n_params_non_embedding, budget): eval_loss}`` of the runs' final evaluations."""
    return {(r["n_params_non_embedding"], r["budget_tokens"]): r["eval_loss"] for r in rows if r["final"] == 1}


def test_every_size_is_trained_for_every_budget_exactly_once(study):
    rows, settings = study
    sizes = {(r["model"], r["n_params_non_embedding"]) for r in rows}
    budgets = sorted({r["budget_tokens"] for r in rows})
    assert len(sizes) >= 5 and len(budgets) >= 5
    assert budgets == settings["budgets_tokens"]
    finals = [(r["model"], r["budget_tokens"]) for r in rows if r["final"] == 1]
    assert len(finals) == len(set(finals)) == len(sizes) * len(budgets)
    tokens_per_step = settings["batch_size"] * settings["context_length"]
    for r in rows:
        assert r["tokens"] == r["step"] * tokens_per_step
        assert 0 < r["tokens"] <= r["budget_tokens"]
        assert (r["final"] == 1) == (r["tokens"] == r["budget_tokens"])


def test_parameter_counts_match_the_closed_form(study):
    rows, settings = study
    for r in rows:
        d, n_layers = int(r["d_model"]), int(r["n_layers"])
        # per layer: attention 4(d^2 + d), MLP 8d^2 + 5d, two layer norms 4d; then the final layer norm
        assert r["n_params_non_embedding"] == n_layers * (12 * d * d + 13 * d) + 2 * d
        # token table (shared with the output layer) and learned positions
        assert r["n_params"] - r["n_params_non_embedding"] == (VOCAB + settings["context_length"]) * d


def test_flops_are_six_n_d(study):
    rows, _ = study
    for r in rows:
        assert r["flops"] == pytest.approx(6 * r["n_params_non_embedding"] * r["tokens"], rel=1e-5)


def test_reference_losses_are_in_nats_per_token(study):
    rows, settings = study
    rate = default_grammar().entropy_rate()
    assert settings["entropy_rate_nats_per_token"] == pytest.approx(rate, rel=1e-12)
    bayes = settings["irreducible_loss_nats_per_token"]
    for r in rows:
        assert r["entropy_rate"] == pytest.approx(rate, abs=1e-6)
        assert r["irreducible_loss"] == pytest.approx(bayes, abs=1e-5)
    # A window model cannot know the grammar state at the window's start, so its floor lies above the
    # entropy rate, but by little for 32-token windows (about 0.02 nats).
    assert rate < bayes < rate + 0.05


def test_no_loss_is_below_the_irreducible_loss_or_above_a_uniform_guess(study):
    rows, _ = study
    for r in rows:
        assert r["irreducible_loss"] - BAYES_TOL < r["eval_loss"] < math.log(VOCAB), r
        assert r["train_loss"] > 0


def test_final_loss_decreases_with_the_token_budget(study):
    rows, _ = study
    grid = final_grid(rows)
    for n in sorted({k[0] for k in grid}):
        losses = [grid[(n, d)] for d in sorted(d for m, d in grid if m == n)]
        assert np.all(np.diff(losses) < NOISE_TOL), (n, losses)
        assert losses[-1] < losses[0] - 0.2, (n, losses)  # 64x more tokens is a large gain for every size


def test_final_loss_decreases_with_model_size_at_the_largest_budget(study):
    rows, _ = study
    grid = final_grid(rows)
    largest = max(d for _, d in grid)
    losses = [grid[(n, largest)] for n in sorted(n for n, d in grid if d == largest)]
    assert np.all(np.diff(losses) < NOISE_TOL), losses
    # the smallest model is limited by its size, the largest is close to the floor
    bayes = rows[0]["irreducible_loss"]
    assert losses[0] > bayes + 0.03 and losses[-1] < bayes + 0.01, (losses, bayes)
