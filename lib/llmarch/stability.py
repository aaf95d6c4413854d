"""Logit bounds that keep large-rate training stable: soft-capping (Gemma 2) and the z-loss (PaLM, ST-MoE).

Book: From GPT-2 to Llama 3, "After Llama 3" (``book/modern-decoder.md``).

- ``soft_cap(x, cap) = cap * tanh(x / cap)`` (Gemma 2, Gemma Team 2024): smooth, odd, the identity to first order
  near 0 and bounded by ``cap``. Gemma 2 caps attention scores at 50 and the output logits at 30.
- ``z_loss(logits) = mean(log(sum_j exp(logits_j))^2)`` over every position (PaLM, Chowdhery et al. 2022, with
  weight 1e-4 on the output logits; ST-MoE's router z-loss, Zoph et al. 2022, with weight 1e-3 on the router's):
  it pulls the log-partition function ``log Z`` towards 0, so the logits cannot drift together without bound.
"""

from __future__ import annotations

import torch

from llmarch._checks import check_tensor

__all__ = ["soft_cap", "z_loss"]


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)``, elementwise, any shape; ``cap=None`` returns ``x`` unchanged."""
    if cap is None:
        return x
    if not cap > 0:
        raise ValueError(f"soft_cap: cap must be positive or None, got {cap!r}")
    return cap * torch.tanh(x / cap)


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean of ``logsumexp(logits, -1)^2`` over every leading position; ``logits (..., V) -> ()``.

    Unweighted: multiply by the coefficient (PaLM: 1e-4; ST-MoE router: 1e-3) when adding it to the loss.
    """
    check_tensor("z_loss: logits", logits, min_dim=1, floating=True)
    return torch.logsumexp(logits, dim=-1).pow(2).mean()
