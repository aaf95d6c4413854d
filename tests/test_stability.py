"""Soft-capping and the z-loss against brute-force loops over their definitions."""

import math

import pytest
import torch

from llmarch.stability import soft_cap, z_loss


def test_soft_cap_matches_definition_and_bounds():
    x = torch.tensor([-1e4, -60.0, -1.0, 0.0, 1e-3, 29.0, 1e4], dtype=torch.float64)
    capped = soft_cap(x, 30.0)
    for value, got in zip(x.tolist(), capped.tolist()):
        assert got == pytest.approx(30.0 * math.tanh(value / 30.0), rel=1e-15, abs=1e-300)
    assert capped.abs().max() <= 30.0
    assert capped[4] == pytest.approx(1e-3, rel=1e-6)  # identity to first order near zero
    assert soft_cap(x, None) is x


def test_soft_cap_rejects_bad_cap():
    with pytest.raises(ValueError, match="cap must be positive"):
        soft_cap(torch.zeros(2), 0.0)


def test_z_loss_matches_loop():
    logits = torch.randn(3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    total = 0.0
    for row in logits.reshape(-1, 7).tolist():
        total += math.log(sum(math.exp(v) for v in row)) ** 2
    assert z_loss(logits).item() == pytest.approx(total / 15, rel=1e-12)
    # Shifting every logit of a row by c moves log Z by c: the loss is not shift-invariant, which is its point.
    assert z_loss(logits - torch.logsumexp(logits, -1, keepdim=True)).item() == pytest.approx(0.0, abs=1e-20)


def test_z_loss_names_bad_input():
    with pytest.raises(ValueError, match="floating"):
        z_loss(torch.ones(2, 3, dtype=torch.long))
