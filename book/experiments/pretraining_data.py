"""Pretraining data: why duplicates hurt (memorisation in the tiny GPT), and the waterfall of the course's pipeline.

Book: Pretraining data, "Why duplicates hurt" and "The waterfall". Regenerate the files with ``make experiments``
(``nice -n 10``, one thread; this script alone took about 7 CPU-minutes). Everything is seeded; as for the other
experiments, a rerun on another CPU may differ in the last digits.

Part 1, memorisation. A corpus of ``BASE_TOKENS`` tokens of the course's grammar gets planted sequences:
``SEQS_PER_GROUP`` sequences of ``SEQ_LEN`` grammar tokens (sampled with their own seeds, so none occurs in the
base text), each inserted ``k`` times at random sentence boundaries, for ``k`` in ``COPIES``. The
*deduplicated* corpus is the same corpus after exact deduplication: every planted sequence once. The tiny GPT
(``tiny_gpt_config()``) is trained on each corpus for the same ``STEPS`` steps (equal compute), three seeds
(the seed draws the planted sequences, the base text, the initialisation and the batches). Each model is then
scored on

- the exact continuation rate: greedy decoding of ``SEQ_LEN - PREFIX`` tokens from the first ``PREFIX`` tokens
  of a planted sequence reproduces the rest exactly (the extraction test of Carlini et al., 2021/2023);
- the continuation loss: mean NLL (nats per token) of those same tokens given everything before them;
- the same two numbers for ``FRESH`` *fresh* sequences drawn the same way but never trained on;
- the held-out loss on ``EVAL_TOKENS`` tokens of fresh grammar text (the quality of the model as a
  language model, what duplicates cost at equal compute).

Part 2, the waterfall: see :func:`waterfall` (added with the pipeline).

Writes, under ``book/data/`` next to this script's folder:

- ``pretraining_data_memorisation.csv``: corpus (duplicated/deduplicated), seed, group (copies in the
  duplicated corpus, one of ``COPIES``, or ``fresh``), n_sequences, exact_rate, continuation_nll;
- ``pretraining_data_heldout.csv``: corpus, seed, train_tokens, heldout_loss, train_seconds;
- ``pretraining_data.json``: the settings, the grammar's entropy rate and the run times.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.decoding import gpt_next_logprobs, greedy_decode
from llmarch.model import GPT, tiny_gpt_config
from llmarch.train import evaluate, train
from tiny_gpt import write_csv  # sibling script (this folder is on sys.path when run)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

BASE_TOKENS, EVAL_TOKENS = 640_000, 32_769
SEQ_LEN, PREFIX = 64, 32
# 4 sequences per group: 4 * 64 * 1441 = 368,896 planted tokens, 37% of the duplicated corpus
COPIES, SEQS_PER_GROUP, FRESH = (1, 10, 30, 100, 300, 1000), 4, 16
SEEDS = (0, 1, 2)
STEPS, BATCH_SIZE, LR, WARMUP = 1500, 32, 3e-3, 50


def grammar_sequences(n: int, seed: int) -> list[torch.Tensor]:
    """``n`` distinct sequences of ``SEQ_LEN`` tokens, each sampled from the grammar's start state with its own
    seed (drawn from ``seed``), so they are grammatical text that the base corpus contains only by chance."""
    grammar = default_grammar()
    seeds = np.random.default_rng(seed).choice(10**9, size=n, replace=False) + 10**6
    sequences = [grammar.encode(grammar.sample(SEQ_LEN, seed=int(s))) for s in seeds]
    if len({tuple(s.tolist()) for s in sequences}) != n:
        raise RuntimeError("two planted sequences coincide; choose another seed")
    return sequences


def planted_corpus(base: torch.Tensor, planted: dict[int, list[torch.Tensor]], seed: int,
                   deduplicated: bool) -> torch.Tensor:
    """``base`` with each sequence of ``planted[k]`` inserted ``k`` times (once if ``deduplicated``) after
    randomly chosen sentence ends (``.`` tokens) of the base text."""
    period = default_grammar().encode(["."])[0]
    copies = [seq for k, seqs in planted.items() for seq in seqs for _ in range(1 if deduplicated else k)]
    rng = np.random.default_rng(seed)
    ends = torch.nonzero(base == period).flatten().numpy() + 1
    cuts = np.sort(rng.choice(ends, size=len(copies), replace=False))
    order = rng.permutation(len(copies))
    pieces, start = [], 0
    for cut, i in zip(cuts, order):
        pieces += [base[start:cut], copies[i]]
        start = cut
    pieces.append(base[start:])
    return torch.cat(pieces)


@torch.no_grad()
def continuation_scores(model: GPT, sequences: list[torch.Tensor]) -> tuple[float, float]:
    """(exact continuation rate under greedy decoding from the ``PREFIX``-token prefix, mean NLL per token of
    the last ``SEQ_LEN - PREFIX`` tokens given all tokens before them)."""
    model.eval()
    next_logprobs = gpt_next_logprobs(model)
    exact = 0
    for seq in sequences:
        out = greedy_decode(next_logprobs, seq[:PREFIX].tolist(), SEQ_LEN - PREFIX)
        exact += out[PREFIX:] == seq[PREFIX:].tolist()
    batch = torch.stack(sequences)
    logprobs = torch.log_softmax(model(batch[:, :-1]).double(), dim=-1)
    nll = -logprobs.gather(-1, batch[:, 1:, None])[:, PREFIX - 1:, 0]
    return exact / len(sequences), float(nll.mean())


def memorisation() -> tuple[list, list, dict]:
    grammar = default_grammar()
    config = tiny_gpt_config()
    rows, heldout_rows, seconds = [], [], {}
    for seed in SEEDS:
        sequences = grammar_sequences(SEQS_PER_GROUP * len(COPIES) + FRESH, seed=1000 + seed)
        planted = {k: sequences[i * SEQS_PER_GROUP:(i + 1) * SEQS_PER_GROUP] for i, k in enumerate(COPIES)}
        fresh = sequences[len(COPIES) * SEQS_PER_GROUP:]
        base = synthetic_corpus(BASE_TOKENS, seed=seed, grammar=grammar)
        heldout = synthetic_corpus(EVAL_TOKENS, seed=100 + seed, grammar=grammar)
        for name, deduplicated in (("duplicated", False), ("deduplicated", True)):
            corpus = planted_corpus(base, planted, seed=seed, deduplicated=deduplicated)
            t0 = time.process_time()
            torch.manual_seed(seed)
            model = GPT(config)
            train(model, corpus, steps=STEPS, context_length=config.context_length, batch_size=BATCH_SIZE, lr=LR,
                  warmup=WARMUP, eval_every=STEPS, seed=seed)
            seconds[f"{name}_{seed}"] = round(time.process_time() - t0, 1)
            loss = evaluate(model, heldout, config.context_length)
            heldout_rows.append((name, seed, len(corpus), f"{loss:.5f}", seconds[f"{name}_{seed}"]))
            groups = [(str(k), planted[k]) for k in COPIES] + [("fresh", fresh)]
            for group, seqs in groups:
                exact, nll = continuation_scores(model, seqs)
                rows.append((name, seed, group, len(seqs), f"{exact:.4f}", f"{nll:.5f}"))
            print(f"{name:12s} seed {seed}: held-out {loss:.4f}; "
                  + "  ".join(f"{r[2]}: exact {r[4]} nll {r[5]}" for r in rows[-len(groups):]), flush=True)
    settings = {"base_tokens": BASE_TOKENS, "eval_tokens": EVAL_TOKENS, "seq_len": SEQ_LEN, "prefix": PREFIX,
                "copies": list(COPIES), "seqs_per_group": SEQS_PER_GROUP, "fresh_sequences": FRESH,
                "seeds": list(SEEDS), "steps": STEPS, "batch_size": BATCH_SIZE, "lr": LR, "warmup": WARMUP,
                "context_length": config.context_length, "entropy_rate": grammar.entropy_rate(),
                "train_cpu_seconds": seconds}
    return rows, heldout_rows, settings


def main() -> None:
    start = time.process_time()
    torch.set_num_threads(1)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    rows, heldout_rows, settings = memorisation()
    write_csv(DATA_DIR / "pretraining_data_memorisation.csv",
              ["corpus", "seed", "group", "n_sequences", "exact_rate", "continuation_nll"], rows)
    write_csv(DATA_DIR / "pretraining_data_heldout.csv",
              ["corpus", "seed", "train_tokens", "heldout_loss", "train_cpu_seconds"], heldout_rows)
    summary = {"memorisation": settings, "total_cpu_seconds": round(time.process_time() - start, 1)}
    (DATA_DIR / "pretraining_data.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done in {time.process_time() - start:.0f} CPU seconds; results in {DATA_DIR}")


if __name__ == "__main__":
    main()
