"""A mini scaling study: tiny GPTs of seven sizes, each trained for seven token budgets on the synthetic corpus.

Book: Scaling laws, "A mini scaling study". Regenerate the files with ``make experiments``. This script
alone needs about seven minutes of CPU time on one thread; on a shared, busy 2-core machine it took 17
minutes of wall-clock time (``runtime_seconds`` in the JSON).
Everything is seeded, so a rerun on the same machine reproduces the files; another CPU may differ in the
last digits.

Design (the one of Hoffmann et al.'s Approach 1, scaled down by ten orders of magnitude):

- Seven pre-LN GPTs (``SIZES``: width, depth, heads) from 252 to 150,080 non-embedding parameters. The
  grammar is simple: from about 3,000 parameters on, every model gets within 0.005 nats of the floor, so
  the sizes are packed at the small end, where capacity still limits the loss.
- For every size, one **separate run per token budget** ``D`` in ``BUDGETS`` (32k .. 2M tokens), each with
  its own warm-up + cosine schedule that ends exactly at ``D``. Hoffmann et al. (section 3.1 and their
  Figure A1) point out that the loss at an intermediate point of a long cosine run overestimates the loss
  of a run whose schedule ends there; each run is therefore also evaluated at 1/4, 1/2 and 3/4 of its
  schedule (rows with ``final = 0``), so that the chapter can measure that effect on our own data. Only
  the ``final = 1`` rows are (N, D) points of the scaling law.
- Same initialisation for every budget of a size (seed ``MODEL_SEED``) and the same batch order
  (``TRAIN_SEED``); a fixed batch of ``BATCH_SIZE`` windows of ``CONTEXT`` tokens; AdamW as in
  ``llmarch.train.train``; learning rate ``LR_64 * (64 / d_model) ** 0.75`` (larger for narrower models,
  not tuned per run, see the chapter).
- The training stream holds ``TRAIN_TOKENS`` tokens, twice the largest budget, so that runs see (almost)
  no repeated data. Evaluation: ``EVAL_TOKENS`` held-out tokens (another seed), non-overlapping windows of
  ``CONTEXT`` tokens, every token scored once (``llmarch.train.evaluate``).

Units. Losses are in nats per token. The corpus is tokenised one word per token (the 36-word vocabulary of
``default_grammar``), so the grammar's entropy rate in nats per word *is* its entropy rate per token. It
is not quite the floor of this evaluation, though: a model that sees a window of ``CONTEXT`` tokens cannot
know the grammar state at the start of the window. The irreducible loss of *this* protocol is the loss of
the Bayes-optimal predictor that reads the same windows (a belief filter over grammar states, started from
the stationary distribution: ``tiny_gpt.bayes_predictive``), measured on the same evaluation tokens; it
lies a little above the entropy rate.

Writes, under ``book/data/`` next to this script's folder:

- ``scaling_study.csv``: model, d_model, n_layers, n_heads, n_params (all trainable parameters),
  n_params_non_embedding (Kaplan et al.'s N: without the token and position tables, which the output layer
  shares), budget_tokens, final, step, tokens, flops (``6 * n_params_non_embedding * tokens``), train_loss
  (mean over the steps since the previous evaluation), eval_loss, irreducible_loss (the Bayes window loss
  above), entropy_rate (nats per token); one row per run and evaluation point;
- ``scaling_study.json``: the settings, the two reference losses and the run times.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from llmarch.data import default_grammar, sequential_batches, synthetic_corpus
from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.train import train
from tiny_gpt import bayes_predictive, write_csv  # sibling experiment script (this folder is on sys.path)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

SIZES = [  # (d_model, n_layers, n_heads): 252 .. 150,080 non-embedding parameters
    (4, 1, 2),
    (6, 1, 2),
    (8, 1, 2),
    (16, 1, 2),
    (16, 2, 2),
    (32, 2, 4),
    (64, 3, 4),
]
BUDGETS = [2**k for k in range(15, 22)]  # 32,768 .. 2,097,152 training tokens
CONTEXT, BATCH_SIZE = 32, 16             # 512 tokens per optimiser step
LR_64 = 3e-3                             # the learning rate of the width-64 model (as in tiny_gpt.py)
TRAIN_TOKENS, EVAL_TOKENS = 2 * BUDGETS[-1], 2**15
TRAIN_SEED, EVAL_SEED, MODEL_SEED = 0, 1, 0
EVAL_FRACTIONS = 4                       # evaluate at 1/4, 2/4, 3/4 and 4/4 of every schedule

HEADER = [
    "model", "d_model", "n_layers", "n_heads", "n_params", "n_params_non_embedding", "budget_tokens", "final",
    "step", "tokens", "flops", "train_loss", "eval_loss", "irreducible_loss", "entropy_rate",
]


def learning_rate(d_model: int) -> float:
    return LR_64 * (64 / d_model) ** 0.75


def config_for(d_model: int, n_layers: int, n_heads: int, vocab_size: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab_size, context_length=CONTEXT, d_model=d_model, n_layers=n_layers, n_heads=n_heads)


def bayes_window_loss(grammar, eval_data: torch.Tensor) -> float:
    """Mean NLL of the Bayes-optimal predictor over the same non-overlapping windows that ``evaluate`` scores."""
    total, count = 0.0, 0
    for x, y in sequential_batches(eval_data, 256, CONTEXT):
        probs = bayes_predictive(grammar, x.numpy())
        p = np.take_along_axis(probs, y.numpy()[..., None], axis=-1)[..., 0]
        total += float(-np.log(p).sum())
        count += p.size
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: these models are so small "
                        "that a second thread buys little, and on a busy machine two threads wait on each other)")
    parser.add_argument("--quick", action="store_true", help="two sizes, three small budgets: a smoke test "
                        "that writes to /tmp instead of book/data")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes, budgets, out_dir = SIZES, BUDGETS, DATA_DIR
    if args.quick:
        sizes, budgets, out_dir = SIZES[:2], BUDGETS[:3], Path("/tmp/scaling_study_quick")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    grammar = default_grammar()
    n_train = 2 * budgets[-1] if args.quick else TRAIN_TOKENS
    train_data = synthetic_corpus(n_train, seed=TRAIN_SEED, grammar=grammar)
    eval_data = synthetic_corpus(EVAL_TOKENS + 1, seed=EVAL_SEED, grammar=grammar)
    entropy_rate = grammar.entropy_rate()
    irreducible = bayes_window_loss(grammar, eval_data)
    print(f"corpus ready after {time.perf_counter() - start:.0f} s; entropy rate {entropy_rate:.5f}, "
          f"Bayes window loss on the eval windows {irreducible:.5f} nats/token", flush=True)

    rows, runs = [], []
    for d_model, n_layers, n_heads in sizes:
        config = config_for(d_model, n_layers, n_heads, grammar.vocab_size)
        name = f"d{d_model}_l{n_layers}"
        lr = learning_rate(d_model)
        for budget in budgets:
            torch.manual_seed(MODEL_SEED)
            model = GPT(config)
            n_all = count_parameters(model)
            n_non_emb = count_parameters(model, exclude_embeddings=True)
            steps = budget // (BATCH_SIZE * CONTEXT)
            t0 = time.perf_counter()
            result = train(
                model, train_data, steps=steps, context_length=CONTEXT, batch_size=BATCH_SIZE, lr=lr,
                warmup=max(2, steps // 20), eval_data=eval_data, eval_every=steps // EVAL_FRACTIONS, seed=TRAIN_SEED,
            )
            seconds = time.perf_counter() - t0
            for step, tokens, tr, ev in zip(result.steps, result.tokens, result.train_loss, result.eval_loss):
                rows.append((
                    name, d_model, n_layers, n_heads, n_all, n_non_emb, budget, int(step == steps), step, tokens,
                    f"{6.0 * n_non_emb * tokens:.6g}", f"{tr:.5f}", f"{ev:.5f}", f"{irreducible:.5f}",
                    f"{entropy_rate:.6f}",
                ))
            runs.append({"model": name, "budget_tokens": budget, "steps": steps, "lr": lr, "seconds": round(seconds, 2)})
            print(f"{name:7s} N={n_non_emb:7d} D={budget:8d} lr={lr:.4f}: eval loss {result.eval_loss[-1]:.4f} "
                  f"({seconds:5.1f} s, {time.perf_counter() - start:6.0f} s total)", flush=True)
            write_csv(out_dir / "scaling_study.csv", HEADER, rows)  # after every run: partial results are usable

    settings = {
        "sizes": [{"model": f"d{d}_l{l}", "d_model": d, "n_layers": l, "n_heads": h, "lr": learning_rate(d)}
                  for d, l, h in sizes],
        "budgets_tokens": budgets,
        "context_length": CONTEXT,
        "batch_size": BATCH_SIZE,
        "tokens_per_step": BATCH_SIZE * CONTEXT,
        "lr_rule": f"{LR_64} * (64 / d_model) ** 0.75",
        "schedule": "linear warm-up over max(2, steps // 20) steps, then cosine to 0.1 x lr at the budget",
        "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0.1 on matrices), grad clip 1.0 (llmarch.train.train)",
        "train_tokens_in_corpus": len(train_data),
        "eval_tokens": EVAL_TOKENS,
        "seeds": {"train": TRAIN_SEED, "eval": EVAL_SEED, "model": MODEL_SEED},
        "tokenisation": "one word per token: nats per word = nats per token",
        "entropy_rate_nats_per_token": entropy_rate,
        "irreducible_loss_nats_per_token": irreducible,
        "irreducible_loss_definition": "Bayes-optimal predictor on the same evaluation windows "
                                       f"({CONTEXT} tokens, belief filter from the stationary distribution)",
        "flops_definition": "6 * n_params_non_embedding * tokens (Kaplan et al.'s convention)",
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "runs": runs,
        "runtime_seconds": round(time.perf_counter() - start, 1),
    }
    (out_dir / "scaling_study.json").write_text(json.dumps(settings, indent=2) + "\n")
    print(f"done in {settings['runtime_seconds']:.0f} s; results in {out_dir}")


if __name__ == "__main__":
    main()
