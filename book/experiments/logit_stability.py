"""Attention-logit growth at high learning rates, and four ways to train through it: nothing, QK-norm,
soft-capping of attention and output logits (Gemma 2), and the z-loss (PaLM).

Book: From GPT-2 to Llama 3, "After Llama 3", section "Stability: more norms, bounded logits". Regenerate the
files with ``make experiments`` or ``.venv/bin/python book/experiments/logit_stability.py`` (about 4
CPU-minutes on one thread; the CPU time is in the summary). Everything is seeded; a rerun on the same machine
reproduces the files.

A two-layer Llama-like model of the synthetic grammar (width 64, 4 heads, SwiGLU of width 170, 64-token
context) is trained for ``STEPS`` AdamW steps with no warm-up and a constant rate, at every rate of ``LRS``,
with every variant of ``VARIANTS`` and every seed of ``SEEDS`` (the seed sets the initial weights and the
batches, the same for every variant). Every ``RECORD_EVERY`` steps it records the training batch's
cross-entropy (the z-loss term left out), the held-out cross-entropy of ``EVAL_WINDOWS`` fixed windows, the
largest raw attention score ``|q . k| / sqrt(d_head)`` of the batch over both layers (before any cap), and
the mean and largest log-partition function ``log Z = logsumexp(logits)`` of the output logits the loss sees
(after the output cap, if any).

Soft-capping follows Gemma 2: ``cap * tanh(s / cap)`` on the scaled attention scores before the causal mask
(cap 50) and on the output logits (cap 30), ``llmarch.stability.soft_cap``. The z-loss follows PaLM:
``1e-4 * mean(log(Z)^2)`` added to the loss, ``llmarch.stability.z_loss``. QK-norm is
``GPTConfig(qk_norm=True)`` (per head, as Qwen3 and Gemma 3).

Writes, under ``book/data/`` next to this script's folder:

- ``logit_stability.csv``: variant, lr, seed, step, train_loss, eval_loss, max_score, mean_log_z, max_log_z;
- ``logit_stability.json``: the settings and the CPU time.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from llmarch.data import get_batch, synthetic_corpus
from llmarch.model import GPT, llama_config
from llmarch.stability import soft_cap, z_loss

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

CONTEXT, D_MODEL, N_LAYERS, N_HEADS, D_FF = 64, 64, 2, 4, 170
TRAIN_TOKENS, TRAIN_SEED, EVAL_SEED, EVAL_WINDOWS = 200_000, 0, 1, 64
STEPS, BATCH_SIZE, RECORD_EVERY = 120, 16, 10
LRS = (3e-3, 1e-2, 3e-2, 1e-1)
SEEDS = (0, 1, 2, 3, 4)
ATTENTION_CAP, OUTPUT_CAP, Z_LOSS_WEIGHT = 50.0, 30.0, 1e-4  # Gemma 2's caps, PaLM's weight
VARIANTS = {  # name: (qk_norm, attention cap, output cap, z-loss weight)
    "baseline": (False, None, None, 0.0),
    "qk_norm": (True, None, None, 0.0),
    "soft_cap": (False, ATTENTION_CAP, OUTPUT_CAP, 0.0),
    "z_loss": (False, None, None, Z_LOSS_WEIGHT),
}
HEADER = ["variant", "lr", "seed", "step", "train_loss", "eval_loss", "max_score", "mean_log_z", "max_log_z"]


def capped_attend(attn, cap: float | None, largest: list[float]):
    """A replacement for ``attn.attend`` (causal self-attention, no mask or bias) that soft-caps the scaled
    scores ``q k^T / sqrt(d_head)`` at ``cap`` (None: no cap) before the causal mask, and appends the largest
    raw ``|score|`` to ``largest``. q ``(B, H, T, d)``, k, v ``(B, H_kv, T, d)`` -> ``(B, H, T, d)``."""

    def attend(q, k, v, mask=None, bias=None, is_causal=False, return_weights=False):
        assert mask is None and bias is None and is_causal, "causal self-attention only"
        group = attn.n_heads // attn.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        largest.append(scores.detach().abs().max().item())
        t = scores.shape[-1]
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        weights = soft_cap(scores, cap).masked_fill(future, float("-inf")).softmax(dim=-1)
        return weights @ v, weights

    return attend


def build(variant: str, seed: int):
    """The seeded model of ``variant`` and its output cap; the attention of every layer goes through
    :func:`capped_attend`, which records into the returned list."""
    qk_norm, attention_cap, output_cap, _ = VARIANTS[variant]
    torch.manual_seed(seed)
    model = GPT(llama_config(vocab_size=36, context_length=CONTEXT, d_model=D_MODEL, n_layers=N_LAYERS,
                             n_heads=N_HEADS, n_kv_heads=N_HEADS, d_ff=D_FF, qk_norm=qk_norm))
    largest: list[float] = []
    for block in model.blocks:
        block.attn.attend = capped_attend(block.attn, attention_cap, largest)
    return model, output_cap, largest


def run(variant: str, lr: float, seed: int, corpus: torch.Tensor, eval_x, eval_y) -> list[tuple]:
    """One training run; a row per record (see ``HEADER``)."""
    model, output_cap, largest = build(variant, seed)
    weight = VARIANTS[variant][3]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    batches, rows = torch.Generator().manual_seed(seed), []
    for step in range(1, STEPS + 1):
        x, y = get_batch(corpus, BATCH_SIZE, CONTEXT, batches)
        largest.clear()
        logits = soft_cap(model(x), output_cap)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        total = loss + weight * z_loss(logits) if weight else loss
        opt.zero_grad()
        total.backward()
        opt.step()
        if step % RECORD_EVERY == 0:
            log_z = torch.logsumexp(logits.detach(), dim=-1)
            with torch.no_grad():
                eval_loss = F.cross_entropy(soft_cap(model(eval_x), output_cap).flatten(0, 1), eval_y.flatten())
            rows.append((variant, lr, seed, step, f"{loss.item():.5f}", f"{eval_loss.item():.5f}",
                         f"{max(largest[:N_LAYERS]):.2f}", f"{log_z.mean().item():.4f}",
                         f"{log_z.max().item():.4f}"))
    return rows


def main() -> None:
    torch.set_num_threads(1)  # faster for a model this small
    start = time.process_time()
    corpus = synthetic_corpus(TRAIN_TOKENS, seed=TRAIN_SEED)
    held_out = synthetic_corpus(EVAL_WINDOWS * CONTEXT + 1, seed=EVAL_SEED)
    eval_x = held_out[:-1].view(EVAL_WINDOWS, CONTEXT)
    eval_y = held_out[1:].view(EVAL_WINDOWS, CONTEXT)
    rows = []
    for lr in LRS:
        for variant in VARIANTS:
            for seed in SEEDS:
                rows += run(variant, lr, seed, corpus, eval_x, eval_y)
                print(f"lr {lr:.0e} {variant:9s} seed {seed}: eval {rows[-1][5]}, score {rows[-1][6]}", flush=True)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    with (DATA_DIR / "logit_stability.csv").open("w", newline="") as f:
        csv.writer(f).writerows([HEADER, *rows])
    summary = {
        "model": {"context_length": CONTEXT, "d_model": D_MODEL, "n_layers": N_LAYERS, "n_heads": N_HEADS,
                  "d_ff": D_FF},
        "steps": STEPS, "batch_size": BATCH_SIZE, "record_every": RECORD_EVERY, "lrs": list(LRS),
        "seeds": list(SEEDS), "train_tokens": TRAIN_TOKENS, "eval_windows": EVAL_WINDOWS,
        "attention_cap": ATTENTION_CAP, "output_cap": OUTPUT_CAP, "z_loss_weight": Z_LOSS_WEIGHT,
        "variants": {name: dict(zip(("qk_norm", "attention_cap", "output_cap", "z_loss_weight"), v))
                     for name, v in VARIANTS.items()},
        "cpu_seconds": round(time.process_time() - start, 1),
    }
    (DATA_DIR / "logit_stability.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done in {summary['cpu_seconds']:.0f} CPU-s; results in {DATA_DIR}")


if __name__ == "__main__":
    main()
