"""Train a two-layer GPT on data that needs a previous-token head and rewards an induction head.

Book: The Transformer block, "A previous-token head and an induction head". Regenerate the files with
``make experiments`` (about two CPU-minutes). Everything is seeded, so a rerun on the same machine
reproduces the files; another CPU may differ in the last digits.

The data are segments of a second-order Markov source, each followed by an exact copy of itself:

- the source: over ``VOCAB_SIZE`` tokens, every pair of consecutive tokens ``(a, b)`` allows ``CHOICES``
  next tokens (a fixed random table), drawn uniformly. Predicting the next token needs the token *before*
  the current one, which only attention can bring to the current position: the model needs a
  previous-token head. Its best loss on a first copy is ``log CHOICES`` nats per token (after the first two
  tokens of a segment).
- the copy: a segment of random length ``L`` in ``SEGMENT_LENGTHS`` is repeated once. In the copy the next
  token is determined by the first occurrence, so the loss can fall to zero, but only for a model that finds
  the earlier occurrence of the current context and reads what followed it: an induction head
  (Olsson et al., 2022), which in a two-layer model uses the previous-token head's output as its key.

Writes, under ``book/data/``:

- ``induction_gpt.pt``: the trained model's ``state_dict`` (0.4 MB);
- ``induction_gpt.json``: the configuration, the training settings, the learning curve and the CPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.train import train

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHECKPOINT = DATA_DIR / "induction_gpt.pt"
SUMMARY = DATA_DIR / "induction_gpt.json"

VOCAB_SIZE, CHOICES, SEGMENT_LENGTHS = 32, 4, (8, 32)
CONFIG = GPTConfig(vocab_size=VOCAB_SIZE, context_length=64, d_model=64, n_layers=2, n_heads=2)
TABLE_SEED, TRAIN_SEED, MODEL_SEED = 1234, 0, 0
TRAIN_TOKENS, STEPS, BATCH_SIZE, LR, WARMUP, WEIGHT_DECAY = 1_000_000, 3000, 32, 3e-3, 50, 0.0


def transition_table(vocab_size: int = VOCAB_SIZE, choices: int = CHOICES, seed: int = TABLE_SEED) -> np.ndarray:
    """``table[a, b]``: the ``choices`` distinct tokens allowed after the pair ``(a, b)``, shape ``(V, V, choices)``."""
    if not 1 <= choices <= vocab_size:
        raise ValueError(f"choices must be in [1, vocab_size={vocab_size}], got {choices}")
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(vocab_size)[:choices] for _ in range(vocab_size**2)]).reshape(
        vocab_size, vocab_size, choices)


def sample_segments(n: int, length: int, rng: np.random.Generator, table: np.ndarray | None = None) -> np.ndarray:
    """``n`` sequences of ``length`` tokens from the second-order source, shape ``(n, length)``.

    The first two tokens are uniform; then ``x[t] = table[x[t-2], x[t-1], c_t]`` with ``c_t`` uniform.
    """
    if length < 2:
        raise ValueError(f"a segment needs at least 2 tokens, got length={length}")
    table = transition_table() if table is None else table
    x = np.empty((n, length), dtype=np.int64)
    x[:, :2] = rng.integers(table.shape[0], size=(n, 2))
    choice = rng.integers(table.shape[2], size=(n, length))
    for t in range(2, length):
        x[:, t] = table[x[:, t - 2], x[:, t - 1], choice[:, t]]
    return x


def repeated_segments(n_tokens: int, seed: int) -> torch.Tensor:
    """The training stream: segments of random length in ``SEGMENT_LENGTHS``, each followed by its copy,
    concatenated: about ``n_tokens`` tokens (1-d ``long`` tensor)."""
    rng = np.random.default_rng(seed)
    lo, hi = SEGMENT_LENGTHS
    n_segments = n_tokens // (lo + hi) + 1            # 2 * mean length = lo + hi tokens per pair
    lengths = rng.integers(lo, hi + 1, size=n_segments)
    segments = sample_segments(n_segments, hi, rng)
    pieces = [np.concatenate([s[:n], s[:n]]) for s, n in zip(segments, lengths)]
    return torch.from_numpy(np.concatenate(pieces))


def repeated_batch(n_rows: int, length: int, seed: int) -> torch.Tensor:
    """Evaluation rows ``(n_rows, 2 * length)``: a fresh segment of ``length`` tokens, then its copy."""
    segments = sample_segments(n_rows, length, np.random.default_rng(seed))
    return torch.from_numpy(np.concatenate([segments, segments], axis=1))


def load_induction_gpt(path: Path = CHECKPOINT) -> GPT:
    """The model this script trains, from its committed checkpoint, in eval mode."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python book/experiments/induction_heads.py`")
    model = GPT(CONFIG)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"optimiser steps (default {STEPS})")
    args = parser.parse_args()
    torch.set_num_threads(1)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    start = time.process_time()
    data = repeated_segments(TRAIN_TOKENS, TRAIN_SEED)
    torch.manual_seed(MODEL_SEED)
    model = GPT(CONFIG)
    result = train(model, data, steps=args.steps, context_length=CONFIG.context_length, batch_size=BATCH_SIZE,
                   lr=LR, warmup=WARMUP, weight_decay=WEIGHT_DECAY, eval_every=100, seed=TRAIN_SEED)
    cpu_seconds = time.process_time() - start
    torch.save(model.state_dict(), CHECKPOINT)
    summary = {
        "config": asdict(CONFIG),
        "n_parameters": count_parameters(model),
        "vocab_size": VOCAB_SIZE, "choices": CHOICES, "segment_lengths": list(SEGMENT_LENGTHS),
        "seeds": {"table": TABLE_SEED, "train": TRAIN_SEED, "model": MODEL_SEED},
        "train_tokens": len(data), "steps": args.steps, "batch_size": BATCH_SIZE, "lr": LR, "warmup": WARMUP,
        "weight_decay": WEIGHT_DECAY, "cpu_seconds": round(cpu_seconds, 1),
        "learning_curve": {"step": result.steps, "train_loss": [round(x, 5) for x in result.train_loss]},
    }
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"final training loss {result.train_loss[-1]:.4f} nats/token after {args.steps} steps, "
          f"{cpu_seconds:.0f} CPU s; wrote {CHECKPOINT.name} and {SUMMARY.name} in {DATA_DIR}")


if __name__ == "__main__":
    main()
