"""The helpers of book/experiments/pretraining_objectives.py (read by book/pretraining-objectives.md), and the
consistency of its committed results. Regenerate the results with `make experiments`.

The references are independent of the script: grammar labels are checked against a brute-force walk of the
grammar's rules from every start state (and against the states that really generated a sample), logistic
regression against its first-order optimality condition, the threshold against an exhaustive search, and the
committed files against counts recomputed from their own columns and from T5's formulas.
"""

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from llmarch.data import default_grammar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "experiments"))
po = pytest.importorskip("pretraining_objectives")

GRAMMAR = default_grammar()
STATES = list(GRAMMAR.rules)
NEXT = {s: {w: n for w, n, _ in options} for s, options in GRAMMAR.rules.items()}  # unifilar: word -> next state


def walk(start, words):
    """States before each word, following the rules from ``start``; None if a word is impossible."""
    path, state = [], start
    for w in words:
        if w not in NEXT[state]:
            return None
        path.append(state)
        state = NEXT[state][w]
    return path


def brute_force_emitters(words):
    """Per position t: the emitting state if every start state that can produce words[0..t] agrees, else -1."""
    out = []
    for t in range(len(words)):
        emitters = {p[t] for s in STATES if (p := walk(s, words[: t + 1])) is not None}
        out.append(STATES.index(emitters.pop()) if len(emitters) == 1 else -1)
    return out


def sample_windows(n, length, seed):
    ids = GRAMMAR.encode(GRAMMAR.sample(n * length, seed=seed)).numpy()
    return ids.reshape(n, length)


# ----------------------------------------------------------------------------------------------------------
# Grammar labels
# ----------------------------------------------------------------------------------------------------------

def test_emitting_states_match_a_brute_force_walk():
    windows = sample_windows(40, 12, seed=3)
    rng = np.random.default_rng(0)
    edited = po.random_edit(windows, GRAMMAR.vocab_size, rng)
    possible = [w for w in edited if walk_any(GRAMMAR.decode(w))]
    for window in list(windows) + possible:
        expected = brute_force_emitters(GRAMMAR.decode(window))
        assert po.emitting_states(GRAMMAR, window[None])[0].tolist() == expected


def walk_any(words):
    return any(walk(s, words) is not None for s in STATES)


def test_emitting_states_are_the_states_that_generated_the_text():
    words = GRAMMAR.sample(3000, seed=7)         # sampled from the start state S
    truth = walk("S", words)
    window = GRAMMAR.encode(words).numpy()[None]
    labels = po.emitting_states(GRAMMAR, window)[0]
    known = labels >= 0
    assert known.mean() > 0.95                   # only the first few words are ambiguous
    assert all(STATES[label] == truth[t] for t, label in enumerate(labels) if label >= 0)


def test_emitting_states_refuse_an_impossible_window():
    with pytest.raises(ValueError, match="impossible"):
        po.emitting_states(GRAMMAR, GRAMMAR.encode(". .".split()).numpy()[None])


def test_is_grammatical_matches_a_brute_force_walk():
    windows = sample_windows(300, 10, seed=5)
    edited = po.random_edit(windows, GRAMMAR.vocab_size, np.random.default_rng(1))
    expected = [walk_any(GRAMMAR.decode(w)) for w in edited]
    assert po.is_grammatical(GRAMMAR, edited).tolist() == expected
    assert po.is_grammatical(GRAMMAR, windows).all()           # the grammar's own text is possible
    assert 0 < np.mean(expected) < 0.5                          # most edits break it, some do not
    # worked examples: "." always leads to S, which cannot emit "." or a verb
    for text, ok in ((". the cat sleeps", True), (". .", False), (". sleeps", False), ("cats sleep", True)):
        assert po.is_grammatical(GRAMMAR, GRAMMAR.encode(text.split()).numpy()[None])[0] == ok, text


def test_random_edit_swaps_two_neighbours_or_replaces_one_word():
    windows = sample_windows(500, 8, seed=2)
    edited = po.random_edit(windows, GRAMMAR.vocab_size, np.random.default_rng(3))
    n_swaps = 0
    for before, after in zip(windows, edited):
        diff = np.flatnonzero(before != after)
        assert len(diff) in (1, 2), (before, after)
        if len(diff) == 2:
            i, j = diff
            assert j == i + 1 and before[i] == after[j] and before[j] == after[i]
            n_swaps += 1
    assert 0.35 < n_swaps / len(windows) < 0.65
    with pytest.raises(ValueError, match="shape"):
        po.random_edit(windows[0], GRAMMAR.vocab_size, np.random.default_rng(0))


def test_balanced_grammaticality_set():
    stream = GRAMMAR.encode(GRAMMAR.sample(20_000, seed=4)).numpy()
    ids, labels = po.balanced_grammaticality_set(GRAMMAR, stream, 200, 9, np.random.default_rng(0))
    assert ids.shape == (200, 9) and labels.sum() == 100
    assert [walk_any(GRAMMAR.decode(w)) for w in ids] == labels.astype(bool).tolist()
    with pytest.raises(ValueError, match="even"):
        po.balanced_grammaticality_set(GRAMMAR, stream, 7, 9, np.random.default_rng(0))


# ----------------------------------------------------------------------------------------------------------
# The topic grammar and documents
# ----------------------------------------------------------------------------------------------------------

def test_topic_grammar_keeps_the_state_chain_and_reweights_the_nouns():
    topic = po.topic_grammar(GRAMMAR, {"cat", "dog"}, share=0.8)
    assert np.allclose(topic.transition_matrix(), GRAMMAR.transition_matrix())
    p = {w: prob for w, _, prob in topic.rules["NP_SG"]}
    # the docstring's worked example: six singular nouns share 0.7; cat and dog get 0.8 of it
    assert math.isclose(p["cat"], 0.28) and math.isclose(p["dog"], 0.28) and math.isclose(p["bird"], 0.035)
    assert math.isclose(p["big"], 0.05)                        # adjectives unchanged
    assert topic.entropy_rate() < GRAMMAR.entropy_rate()        # a topic makes word choice more predictable
    with pytest.raises(ValueError, match="share"):
        po.topic_grammar(GRAMMAR, {"cat"}, share=1.0)
    with pytest.raises(ValueError, match="not in the grammar"):
        po.topic_grammar(GRAMMAR, {"unicorn"}, share=0.5)


def test_documents_are_whole_sentences():
    doc = po.sample_document(GRAMMAR, 200, seed=1)
    assert doc[-1] == "." and walk("S", doc) is not None and len(doc) <= 200


# ----------------------------------------------------------------------------------------------------------
# Probing and zero-shot helpers
# ----------------------------------------------------------------------------------------------------------

def test_logistic_regression_is_at_its_optimum():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=generator) * torch.tensor([1.0, 5.0, 0.1, 2.0, 1.0]) + 3.0
    y = (x[:, 0] + 0.2 * x[:, 1] + 0.3 * torch.randn(400, generator=generator) > 3.6).long()
    l2 = 1e-2
    layer = po.fit_logistic_regression(x, y, 2, l2=l2, max_iter=500)
    # undo the folding: in standardised coordinates z = (x - m) / s the weights are W * s, bias b + W m
    x64 = x.double()
    mean, std = x64.mean(0), x64.std(0)
    w = (layer.weight.double() * std).detach().requires_grad_(True)
    b = (layer.bias.double() + layer.weight.double() @ mean).detach().requires_grad_(True)
    z = (x64 - mean) / std
    loss = torch.nn.functional.cross_entropy(z @ w.T + b, y) + l2 * w.pow(2).sum()
    loss.backward()
    assert w.grad.abs().max() < 1e-4 and b.grad.abs().max() < 1e-4
    assert (layer(x).argmax(1) == y).float().mean() > 0.85


def test_fit_threshold_is_the_best_threshold():
    rng = np.random.default_rng(0)
    for _ in range(50):
        scores = np.round(rng.normal(size=30), 1)                # rounded: ties happen
        labels = (scores + rng.normal(size=30) > 0).astype(int)
        theta = po.fit_threshold(scores, labels)
        candidates = np.concatenate([[scores.min() - 1], np.unique(scores)])
        best = max(np.mean((scores > c) == labels) for c in candidates)   # every distinct split
        assert np.mean((scores > theta) == labels) == best


# ----------------------------------------------------------------------------------------------------------
# The committed results
# ----------------------------------------------------------------------------------------------------------

DATA = ROOT / "book" / "data"


@pytest.fixture(scope="module")
def results():
    paths = [DATA / f"pretraining_objectives_{name}.csv" for name in ("runs", "downstream", "curves")]
    assert all(p.exists() for p in paths), "run `make experiments` to create the pretraining-objectives files"
    tables = []
    for path in paths:
        with path.open() as f:
            tables.append(list(csv.DictReader(f)))
    return (*tables, json.loads((DATA / "pretraining_objectives.json").read_text()))


def test_compute_is_equal_and_counted_consistently(results):
    runs, _, curves, summary = results
    budget = summary["budget_flops"]
    for row in runs:
        steps, per_step = int(row["steps"]), int(row["flops_per_step"])
        assert int(row["train_flops"]) == steps * per_step
        assert abs(steps * per_step - budget) <= per_step / 2, row["variant"]   # the nearest number of steps
        assert int(row["corpus_words"]) == steps * summary["settings"]["batch"] * summary["settings"]["window"]
        last = max(int(c["step"]) for c in curves if c["variant"] == row["variant"] and c["seed"] == row["seed"])
        assert last == steps


def test_t5_counts_and_task_settings(results):
    *_, summary = results
    settings = summary["settings"]
    num_noise = round(settings["window"] * 0.15)                 # 31 * 0.15 = 4.65: no tie, any rounding agrees
    assert (settings["t5_num_noise"], settings["t5_num_spans"]) == (num_noise, max(round(num_noise / 3), 1))
    assert abs(settings["nsp_notnext_fraction"] - 0.5) < 0.02
    tagging = summary["baselines"]["tagging"]
    assert tagging["majority"] < tagging["word_only"] < 1
    assert abs(summary["baselines"]["grammaticality"]["majority"] - 0.5) < 0.03


def test_every_evaluation_is_present_and_an_accuracy(results):
    runs, downstream, _, summary = results
    seeds = {str(s) for s in summary["seeds"]}
    assert len(seeds) >= 3
    variants = set(summary["variants"]) | set(summary["random_init"])
    got = {(r["variant"], r["seed"], r["task"], r["method"]) for r in downstream}
    for v in variants:
        for seed in seeds:
            for task in ("tagging", "grammaticality"):
                for method in ("probe", "finetune"):
                    assert (v, seed, task, method) in got
            if v in summary["zero_shot"]:
                assert (v, seed, "grammaticality", "zero_shot") in got
    assert all(0 <= float(r["accuracy"]) <= 1 for r in downstream)
    assert {(r["variant"], r["seed"]) for r in runs} == {(v, s) for v in summary["variants"] for s in seeds}
