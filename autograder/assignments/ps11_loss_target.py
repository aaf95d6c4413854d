"""Evidence for ps11-train's held-out loss target: the reference trained under the notebook's budget, 10 seeds.

``python -m autograder.assignments.ps11_loss_target`` trains llmarch's Llama (``ps11_train.reference_llama``) exactly
as the solution's training cell does (the same size, batches, schedule, AdamW settings and clipping, one CPU
thread), with seeds 0..9 for the initialisation and the batches, scores each run on the grader's fresh held-out
sentences (``ps11_train.heldout_sentences``, a different sample per seed) and writes ``ps11_loss_target.csv``
beside this file: seed, held-out loss, margin below the target, CPU seconds of the training.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from autograder.assignments.ps11_train import (
    LOSS_TARGET,
    heldout_loss,
    heldout_sentences,
    ref_lr_schedule,
    reference_llama,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).with_name("ps11_loss_target.csv")
# The solution's training cell (solutions/ps11-train, cell "model").
CONFIG = {"vocab_size": 36, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 172,
          "rope_base": 10000.0, "eps": 1e-5}
CONTEXT, BATCH, STEPS = 64, 32, 150
HP = {"max_lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 15, "cosine_steps": STEPS, "clip": 1.0}


def train_reference(seed: int) -> tuple[torch.nn.Module, float]:
    """The reference model trained as the solution trains (float32); returns it and the CPU seconds it took."""
    torch.manual_seed(seed)
    tokens = torch.as_tensor(np.load(ROOT / "exercises" / "ps11-train" / "ps11_corpus.npz")["train"], dtype=torch.long)
    model = reference_llama(CONFIG).float().train()  # GPT's init: N(0, 0.02) weights, norm gains 1, as the notebook
    opt = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95), weight_decay=0.1)
    starts = torch.randint(len(tokens) - CONTEXT, (STEPS, BATCH), generator=torch.Generator().manual_seed(seed))
    started = time.process_time()
    for step in range(STEPS):
        opt.param_groups[0]["lr"] = float(ref_lr_schedule(step, HP["max_lr"], HP["min_lr"], HP["warmup_steps"],
                                                          HP["cosine_steps"]))
        windows = tokens[starts[step][:, None] + torch.arange(CONTEXT + 1)]
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), HP["clip"])
        opt.step()
    return model.eval(), time.process_time() - started


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for seed in range(10):
        model, seconds = train_reference(seed)
        tokens = heldout_sentences(10**6 * (seed + 1))
        with torch.no_grad():
            logits = model(torch.as_tensor(tokens[:, :-1])).double().numpy()
        loss = heldout_loss(logits, tokens[:, 1:])
        rows.append({"seed": seed, "heldout_loss": f"{loss:.4f}", "margin": f"{LOSS_TARGET - loss:.4f}",
                     "cpu_seconds": f"{seconds:.1f}"})
        print(rows[-1], flush=True)
    with open(RESULTS, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
