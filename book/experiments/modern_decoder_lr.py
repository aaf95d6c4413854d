"""From GPT-2 to Llama 3: is post-LN's penalty a learning-rate artefact? Three variants, three learning rates.

Book: From GPT-2 to Llama 3, "The ablation" ("Learning rate and budget"). Regenerate with
``nice .venv/bin/python book/experiments/modern_decoder_lr.py`` (also run by ``make experiments``; about
6 CPU-minutes). The ablation of ``modern_decoder.py`` trains every variant at one learning rate (3e-3, 50
warm-up steps) for 500 steps, where every pre-LN model ends within 0.01 nats of the best possible loss. Here
the GPT-2-like model, its post-LN version and the Llama-like model (the configurations of
``modern_decoder.py``) are each trained at ``LRS`` with a short budget (``STEPS`` steps, ``WARMUP`` warm-up
steps), five model seeds each, and scored on held-out text after ``EARLY`` steps and at the end: the budget
leaves room above the floor, and each variant can be compared at its own best learning rate.

Writes ``book/data/modern_decoder_lr.csv``: variant, lr, seed, step, eval_loss (nats per token on
``EVAL_TOKENS`` held-out tokens).
"""

from __future__ import annotations

import time

import torch

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.model import GPT
from llmarch.train import train
from modern_decoder import CONTEXT, DATA_DIR, EVAL_SEED, TRAIN_SEED, TRAIN_TOKENS, variant_configs
from tiny_gpt import write_csv

VARIANTS = ("gpt2", "post_ln", "llama")
LRS = (1e-3, 3e-3, 1e-2)
STEPS, EARLY, WARMUP, BATCH_SIZE = 150, 50, 15, 32
MODEL_SEEDS = (0, 1, 2, 3, 4)
EVAL_TOKENS = 8_192  # 128 windows of 64


def main() -> None:
    start = time.process_time()
    torch.set_num_threads(1)
    grammar = default_grammar()
    train_data = synthetic_corpus(TRAIN_TOKENS, seed=TRAIN_SEED, grammar=grammar)
    eval_data = synthetic_corpus(EVAL_TOKENS + 1, seed=EVAL_SEED, grammar=grammar)
    configs = variant_configs()
    rows = []
    for seed in MODEL_SEEDS:
        for name in VARIANTS:
            for lr in LRS:
                torch.manual_seed(seed)
                model = GPT(configs[name])
                result = train(model, train_data, steps=STEPS, context_length=CONTEXT, batch_size=BATCH_SIZE, lr=lr,
                               warmup=WARMUP, eval_data=eval_data, eval_every=EARLY, seed=TRAIN_SEED + seed)
                rows += [(name, lr, seed, step, f"{loss:.5f}") for step, loss in zip(result.steps, result.eval_loss)]
                print(f"{name:8s} lr {lr:.0e} seed {seed}: early {result.eval_loss[0]:.4f}, final "
                      f"{result.eval_loss[-1]:.4f} ({time.process_time() - start:.0f} CPU-s)", flush=True)
    write_csv(DATA_DIR / "modern_decoder_lr.csv", ["variant", "lr", "seed", "step", "eval_loss"], rows)


if __name__ == "__main__":
    main()
