"""A minimal, honest training loop for next-token prediction.

Book: The Transformer block, "Training a tiny GPT".

Honest means: the loss is the mean cross-entropy per predicted token in nats, evaluation uses held-out data
the model never trained on, every token of the evaluation set is scored exactly once, and all randomness
(initialisation, batches) comes from one seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.attention import attention_backend
from llmarch.data import get_batch, sequential_batches, synthetic_corpus
from llmarch.model import GPT, TINY_GPT_CHECKPOINT, tiny_gpt_config
from llmarch.optim import cosine_schedule

__all__ = ["lm_loss", "evaluate", "warmup_cosine_lr", "TrainResult", "train", "train_tiny_gpt", "write_tiny_gpt_checkpoint"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy ``-(1/BT) sum_{b,t} log softmax(logits[b, t])[targets[b, t]]`` in nats.

    Shapes: ``logits (B, T, V)``, ``targets (B, T)`` long.
    """
    check_tensor("logits", logits, dims=3, floating=True)
    check_tensor("targets", targets, dims=2)
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"logits has shape {shape_str(logits.shape)} but targets has shape {shape_str(targets.shape)}: expected (B, T, V) and (B, T)")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, data: torch.Tensor, context_length: int, batch_size: int = 32) -> float:
    """Mean NLL per token (nats) of ``model`` on ``data`` (1-d ids), over non-overlapping windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in sequential_batches(data, batch_size, context_length):
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count


def warmup_cosine_lr(step: int, max_lr: float, warmup: int, total: int, min_lr_ratio: float = 0.1) -> float:
    """The schedule of :func:`train` (the tiny GPT's): :func:`llmarch.optim.cosine_schedule` with
    ``min_lr = min_lr_ratio * max_lr``, ``warmup_steps = warmup`` and ``cosine_steps = total``, read one step
    ahead during the warm-up, so that step 0 already trains (``max_lr / warmup``) and the peak comes at step
    ``warmup - 1``: linear warm-up, then cosine decay to ``min_lr_ratio * max_lr`` at ``total`` steps (the
    schedule of GPT-1 and most later models)."""
    return cosine_schedule(step + 1 if 0 <= step < warmup else step, max_lr, min_lr_ratio * max_lr, warmup,
                           max(total, warmup))


@dataclass
class TrainResult:
    """Per-evaluation history: ``steps``, ``tokens`` seen, ``train_loss`` (mean over the steps since the
    last evaluation) and ``eval_loss`` (nats per token on held-out data; empty without ``eval_data``)."""

    steps: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)


def train(
    model: nn.Module,
    train_data: torch.Tensor,
    *,
    steps: int,
    context_length: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    warmup: int = 50,
    weight_decay: float = 0.1,
    eval_data: torch.Tensor | None = None,
    eval_every: int = 100,
    seed: int = 0,
    grad_clip: float = 1.0,
    attn_backend: str | None = "sdpa",
) -> TrainResult:
    """Train ``model`` (ids ``(B, T)`` -> logits ``(B, T, V)``) with AdamW on random windows of ``train_data``.

    Learning rate: :func:`warmup_cosine_lr`. Weight decay applies to matrices only (not to biases, norm
    gains or embeddings' 1-d parameters). Evaluates every ``eval_every`` steps and at the end.
    ``attn_backend``: the attention kernel while training (default ``"sdpa"``: the reference's attention,
    1.1-1.6x faster per step for the book's small models on a CPU; ``None`` keeps the model's own); the
    model's layers get their own backends back afterwards.
    """
    check_tensor("train_data", train_data, dims=1)
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    generator = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95),
    )
    result, running = TrainResult(), []
    model.train()
    with attention_backend(model, attn_backend):
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine_lr(step, lr, warmup, steps)
            x, y = get_batch(train_data, batch_size, context_length, generator)
            loss = lm_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            running.append(loss.item())
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                result.steps.append(step + 1)
                result.tokens.append((step + 1) * batch_size * context_length)
                result.train_loss.append(sum(running) / len(running))
                running = []
                if eval_data is not None:
                    result.eval_loss.append(evaluate(model, eval_data, context_length))
    return result


def train_tiny_gpt(steps: int = 1500, seed: int = 0):
    """The course's small pretrained model: ``tiny_gpt_config()`` trained on 1M tokens of the synthetic
    corpus (seed ``seed``), deterministic on a given machine, about a minute on 2 CPU cores. Returns the
    model in eval mode. ``llmarch.model.load_tiny_gpt`` loads the committed checkpoint of this run."""
    torch.manual_seed(seed)
    config = tiny_gpt_config()
    model = GPT(config)
    train(model, synthetic_corpus(1_000_000, seed=seed), steps=steps, context_length=config.context_length,
          batch_size=32, lr=3e-3, warmup=50, eval_every=steps, seed=seed)
    return model.eval()


def write_tiny_gpt_checkpoint() -> None:
    """``python -m llmarch.train`` (no arguments): retrain the tiny pretrained GPT and overwrite its checkpoint."""
    model = train_tiny_gpt()
    TINY_GPT_CHECKPOINT.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), TINY_GPT_CHECKPOINT)
    print(f"wrote {TINY_GPT_CHECKPOINT}")
