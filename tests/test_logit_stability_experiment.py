"""The protocol of book/experiments/logit_stability.py (read by book/modern-decoder.md, "Stability: more norms,
bounded logits") and the completeness of its committed results."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "experiments"))
stability = pytest.importorskip("logit_stability")
DATA = ROOT / "book" / "data"


def loop_attention(q, k, v, cap):
    """Causal attention of one head with soft-capped scores, one query and one key at a time."""
    t, d = q.shape
    out = torch.zeros_like(v)
    for i in range(t):
        scores = torch.stack([q[i] @ k[j] / math.sqrt(d) for j in range(i + 1)])
        if cap is not None:
            scores = cap * torch.tanh(scores / cap)
        weights = torch.softmax(scores, dim=0)
        out[i] = sum(w * v[j] for j, w in enumerate(weights))
    return out


@pytest.mark.parametrize("cap", [None, 2.0])
def test_capped_attend_is_causal_attention_of_the_capped_scores(cap):
    torch.manual_seed(0)
    model, _, largest = stability.build("soft_cap" if cap else "baseline", seed=0)
    attn = model.blocks[0].attn
    attend = stability.capped_attend(attn, cap, largest)
    q, k, v = (3 * torch.randn(2, attn.n_heads, 7, attn.d_head, dtype=torch.float64) for _ in range(3))
    out, _ = attend(q, k, v, is_causal=True)
    for b in range(2):
        for h in range(attn.n_heads):
            torch.testing.assert_close(out[b, h], loop_attention(q[b, h], k[b, h], v[b, h], cap))
    raw = max(abs(q[b, h, i] @ k[b, h, j]).item() / math.sqrt(attn.d_head)
              for b in range(2) for h in range(attn.n_heads) for i in range(7) for j in range(i + 1))
    assert largest[-1] == pytest.approx(raw)  # the raw score, before the cap


def test_the_uncapped_variants_compute_the_library_model():
    """Only the attention kernel is replaced: without a cap the model's logits are the library's."""
    for variant in ("baseline", "qk_norm"):
        model, output_cap, _ = stability.build(variant, seed=3)
        torch.manual_seed(3)
        reference = type(model)(model.config)
        reference.load_state_dict(model.state_dict())
        ids = torch.randint(0, 36, (2, stability.CONTEXT))
        assert output_cap is None
        torch.testing.assert_close(model(ids), reference(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not (DATA / "logit_stability.csv").exists(), reason="run `make experiments` first")
def test_the_results_hold_every_run_and_record():
    with open(DATA / "logit_stability.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == stability.HEADER
    expected = {(v, lr, seed, step) for v in stability.VARIANTS for lr in stability.LRS for seed in stability.SEEDS
                for step in range(stability.RECORD_EVERY, stability.STEPS + 1, stability.RECORD_EVERY)}
    found = {(r["variant"], float(r["lr"]), int(r["seed"]), int(r["step"])) for r in rows}
    assert found == expected and len(rows) == len(expected)
    assert all(math.isfinite(float(r[c])) for r in rows for c in stability.HEADER[4:])
