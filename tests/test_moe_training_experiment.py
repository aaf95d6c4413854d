"""book/experiments/moe_training.py (the mixture-of-experts training table of book/modern-decoder.md): a short
run of its protocol, and its committed results against the protocol they claim."""

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "experiments"))
mt = pytest.importorskip("moe_training")


def test_a_short_run_gives_a_row_per_variant_with_its_routing_statistics():
    rows = mt.train_variants(steps=2)
    assert [r["variant"] for r in rows] == list(mt.variant_configs())
    for r in rows:
        assert r["max_over_mean_load"] >= 1 and r["balance_loss"] >= 1 - 1e-6 and 0 < r["eval_loss"] < 10
    assert len(mt.table(rows).splitlines()) == 1 + len(rows)


def test_the_committed_results_hold_every_seed_and_variant():
    with (ROOT / "book" / "data" / "moe_training.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["seed", *mt.COLUMNS]
    assert sorted((int(r["seed"]), r["variant"]) for r in rows) == sorted(
        (seed, name) for seed in mt.SEEDS for name in mt.variant_configs())
