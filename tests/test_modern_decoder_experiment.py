"""The protocol of book/experiments/modern_decoder.py (read by book/modern-decoder.md) and the consistency of
its committed results. Regenerate the results with `make experiments`.

The learning-rate bracketing is checked on made-up losses whose best rate is known by construction; the
committed files against the protocol they claim (every variant, seed and step present, and every variant's
best rate strictly inside the rates it was trained at, unless the ladder ends).
"""

import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "experiments"))
md = pytest.importorskip("modern_decoder")
DATA = ROOT / "book" / "data"


def rows_with_optimum(optimum: dict[str, float], lrs) -> list[tuple]:
    """Ablation rows whose final loss is |log10(lr / optimum)|, so the best rate tried is the nearest."""
    return [(name, lr, seed, 0, md.STEPS, f"{1 + abs(math.log10(lr / optimum[name])):.5f}", "0")
            for name, *_ in md.VARIANTS for lr in lrs for seed in md.MODEL_SEEDS]


def test_bracketing_extends_only_the_variants_whose_best_rate_is_at_an_edge():
    optimum = {name: 1e-2 for name, *_ in md.VARIANTS} | {"swiglu": 1e-3, "rope": 0.2}
    todo = md.bracketing_lrs(rows_with_optimum(optimum, md.LRS))
    assert sorted(todo) == [("rope", 1e-1), ("swiglu", 1e-3)]


def test_bracketing_stops_after_the_allowed_extensions():
    optimum = {name: 1e-2 for name, *_ in md.VARIANTS} | {"swiglu": 1e-6}
    lrs = list(md.LRS)
    for _ in range(md.MAX_EXTENSIONS):
        (name, lr), = md.bracketing_lrs(rows_with_optimum(optimum, lrs))
        assert name == "swiglu" and lr < min(lrs)
        lrs.append(lr)
    assert md.bracketing_lrs(rows_with_optimum(optimum, lrs)) == []


def test_best_lr_is_the_lowest_mean_final_loss():
    rows = [("gpt2", 1e-2, 0, 0, md.STEPS, "1.0", "0"), ("gpt2", 1e-2, 1, 0, md.STEPS, "3.0", "0"),
            ("gpt2", 3e-3, 0, 0, md.STEPS, "1.9", "0"), ("gpt2", 3e-3, 1, 0, md.STEPS, "1.9", "0"),
            ("gpt2", 3e-3, 0, 0, md.EARLY, "0.1", "0")]  # an early loss must not count
    assert md.best_lr(rows, "gpt2") == 3e-3


@pytest.mark.skipif(not (DATA / "modern_decoder_ablation.csv").exists(), reason="run `make experiments` first")
def test_committed_ablation_follows_the_protocol():
    runs = defaultdict(dict)  # (variant, lr) -> seed -> steps scored
    rows = []
    with open(DATA / "modern_decoder_ablation.csv") as f:
        for row in csv.DictReader(f):
            runs[row["variant"], float(row["lr"])].setdefault(int(row["seed"]), []).append(int(row["step"]))
            rows.append((row["variant"], row["lr"], row["seed"], row["n_parameters"], row["step"], row["eval_loss"],
                         row["train_seconds"]))
    steps = list(range(md.EARLY, md.STEPS + 1, md.EARLY))
    for name, *_ in md.VARIANTS:
        for lr in md.LRS:
            assert {seed: runs[name, lr].get(seed) for seed in md.MODEL_SEEDS} == {s: steps for s in md.MODEL_SEEDS}
    assert md.bracketing_lrs(rows) == []  # every best rate bracketed, or the extensions used up
    summary = json.loads((DATA / "modern_decoder.json").read_text())
    assert summary["best_lr"] == {name: md.best_lr(rows, name) for name, *_ in md.VARIANTS}


@pytest.mark.skipif(not (DATA / "modern_decoder_context.csv").exists(), reason="run `make experiments` first")
def test_committed_context_runs_cover_every_rule_length_and_seed():
    seen = defaultdict(set)
    with open(DATA / "modern_decoder_context.csv") as f:
        for row in csv.DictReader(f):
            seen[row["rule"], int(row["ft_length"])].add((int(row["seed"]), int(row["eval_length"])))
    every = {(seed, n) for seed in md.MODEL_SEEDS for n in md.EVAL_LENGTHS}
    expected = {(rule, ft) for rule in md.EXTENSION_RULES for ft in (0, md.FT_LENGTH)} | {("none", md.CONTEXT)}
    assert set(seen) == expected and all(seen[key] == every for key in expected)
