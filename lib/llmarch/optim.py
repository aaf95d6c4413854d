"""AdamW written from scratch, and the warm-up + cosine learning-rate schedule.

Book: Training at scale, "A training stack from scratch".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["AdamW", "cosine_schedule"]


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019, Algorithm 2), per parameter ``theta``:

    ``theta <- theta - lr * weight_decay * theta`` (decay applied to the weights, not to the gradient),
    ``m <- beta1 m + (1 - beta1) g``, ``v <- beta2 v + (1 - beta2) g^2``,
    ``theta <- theta - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)``.

    Book: Training at scale, "A training stack from scratch".

    State per parameter: ``step`` (a 0-d float tensor, like torch's), ``exp_avg`` (m) and ``exp_avg_sq`` (v),
    so a state dict loads into ``torch.optim.AdamW`` and back. Parameter groups may override any default.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"].item()
                grad, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1.0 - lr * decay)
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = (v.sqrt() / math.sqrt(1.0 - beta2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1.0 - beta1**t))
        return loss


def cosine_schedule(step: int, max_lr: float, min_lr: float, warmup_steps: int, cosine_steps: int) -> float:
    """Linear warm-up, then cosine decay to a floor, as a pure function of ``step`` (counted from 0):

    ``max_lr * step / warmup_steps`` while ``step < warmup_steps`` (0 at step 0);
    ``min_lr + (max_lr - min_lr) * (1 + cos(pi * (step - warmup_steps) / (cosine_steps - warmup_steps))) / 2``
    while ``warmup_steps <= step <= cosine_steps``; ``min_lr`` after ``cosine_steps``.

    Book: Training at scale, "A training stack from scratch".

    >>> cosine_schedule(5, 1.0, 0.1, 10, 110), cosine_schedule(60, 1.0, 0.1, 10, 110)
    (0.5, 0.55)
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0 or cosine_steps < warmup_steps:
        raise ValueError(f"need 0 <= warmup_steps <= cosine_steps, got warmup_steps={warmup_steps}, "
                         f"cosine_steps={cosine_steps}")
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step > cosine_steps:
        return min_lr
    if cosine_steps == warmup_steps:  # no decay phase: the peak is reached at step == warmup_steps
        return max_lr
    progress = (step - warmup_steps) / (cosine_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
