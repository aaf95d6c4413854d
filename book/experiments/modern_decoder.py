"""From GPT-2 to Llama 3 on the synthetic corpus: an ablation ladder with a learning-rate sweep, and RoPE
context extension.

Book: From GPT-2 to Llama 3, "The ablation" and "Context extension". Regenerate the files with
``make experiments`` or ``nice .venv/bin/python book/experiments/modern_decoder.py --jobs 2`` (about
20 CPU-minutes; ``--jobs N`` runs the independent trainings in N one-thread processes, with the same results
as ``--jobs 1``). Everything is seeded; a rerun on the same machine reproduces the files, but across machines
the runs are not bit-reproducible and single runs can move by as much as the spread between seeds: compare
means over seeds.

Part 1, the ablation. Tiny decoders (``N_LAYERS`` blocks, width 64, 4 heads, 64-token context) are trained
on the course's grammar corpus. The variants form a ladder: the GPT-2-like baseline, then one change at a
time until the model is Llama-like (see ``VARIANTS``); ``post_ln`` (one step *back*, to GPT-1's post-LN) and
``mqa`` (one step further, one key/value head) branch off it. The SwiGLU hidden size is ``2/3`` of the MLP's
``4 d_model`` so that the parameter counts match. Every variant is trained at each learning rate of ``LRS``
for a budget of ``STEPS`` AdamW steps (``WARMUP`` warm-up steps, then cosine decay) with ``MODEL_SEEDS``
seeds, and scored on ``EVAL_TOKENS`` held-out tokens after ``EARLY`` steps and at the end. The budget is what
gives the comparison headroom: trained for 500 steps, every pre-LN variant ends within 0.01 nats of the best
possible loss, and the ladder cannot separate them (the first version of this experiment did exactly that).

Part 2, context extension. Llama-like models trained to convergence on 64-token windows (``EXT_STEPS`` steps
at ``EXT_LR``, one per seed) are evaluated on windows of 64, 128 and 256 tokens with their RoPE frequencies
unchanged and with each scaling rule (factor 4, original context 64): linear position interpolation, dynamic
NTK, YaRN and Llama 3. Each is evaluated as is and after ``FT_STEPS`` fine-tuning steps on 256-token windows
(same tokens per step as pre-training); a control fine-tunes the unscaled model for as many steps on 64-token
windows. The score is ``nll_last`` of the positional-encodings chapter
(``length_generalisation.evaluate_length``): the loss of the same scored tokens for every length, sitting at
the last 16 positions of the window.

Writes, under ``book/data/`` next to this script's folder:

- ``modern_decoder_ablation.csv``: variant, lr, seed, n_parameters, step, eval_loss (held-out, nats per
  token), train_seconds;
- ``modern_decoder_context.csv``: rule, ft_length (0: not fine-tuned), seed, eval_length, nll_last, nll_all;
- ``modern_decoder.json``: the configuration of every variant, the training settings, the grammar's entropy
  rate and the run times.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.layers import swiglu_hidden_size
from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.train import train
from length_generalisation import evaluate_length  # sibling script (this folder is on sys.path when run)
from tiny_gpt import write_csv

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

CONTEXT, D_MODEL, N_LAYERS, N_HEADS = 64, 64, 2, 4
TRAIN_TOKENS, HELDOUT_TOKENS = 1_000_000, 100_000
EVAL_TOKENS = 16_384  # held-out tokens the ablation scores (256 windows of 64)
TRAIN_SEED, EVAL_SEED, MODEL_SEEDS = 0, 1, (0, 1, 2, 3, 4)
# Part 1: every variant at every learning rate, a budget that leaves headroom, scored early and at the end.
# A variant whose best rate is at an edge of LRS also gets the next rate of LR_LADDER beyond it (at most
# MAX_EXTENSIONS more), so that every variant's best rate is bracketed.
LR_LADDER = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
LRS, MAX_EXTENSIONS = LR_LADDER[2:5], 2
STEPS, EARLY, WARMUP, BATCH_SIZE = 150, 50, 15, 32

GPT2_LIKE = GPTConfig(vocab_size=36, context_length=CONTEXT, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS,
                      activation="gelu_tanh")
# Parameter-matched SwiGLU: 3 * d * (2/3 * 4d) = 2 * d * 4d (Shazeer, 2020); 170 for d_model 64.
SWIGLU_D_FF = swiglu_hidden_size(D_MODEL, multiple_of=1)

# (name, what changes, overrides applied on top of the previous rung of the ladder or of a named variant)
VARIANTS = [
    ("gpt2", "GPT-2-like baseline", None, {}),
    ("post_ln", "post-LN instead of pre-LN", "gpt2", {"norm_first": False}),
    ("rmsnorm", "+ RMSNorm", "gpt2", {"norm": "rmsnorm"}),
    ("swiglu", "+ SwiGLU (parameter-matched)", "rmsnorm", {"ffn": "swiglu", "activation": None, "d_ff": SWIGLU_D_FF}),
    ("rope", "+ RoPE instead of learned positions", "swiglu", {"pos_encoding": "rope", "rope_layout": "half"}),
    ("no_bias", "+ no biases", "rope", {"bias": False, "mlp_bias": False}),
    ("untied", "+ untied output layer", "no_bias", {"tie_embeddings": False}),
    ("llama", "+ GQA, 2 key/value heads (Llama-like)", "untied", {"n_kv_heads": 2}),
    ("mqa", "MQA, 1 key/value head", "llama", {"n_kv_heads": 1}),
]

# Part 2: converged Llama-like models, then each RoPE scaling rule, with and without a short fine-tune.
EXT_STEPS, EXT_LR, EXT_WARMUP = 500, 3e-3, 50
FACTOR = 4.0
EXTENSION_RULES = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": FACTOR},
    "dynamic": {"rope_type": "dynamic", "factor": FACTOR},
    "yarn": {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": CONTEXT},
    "llama3": {"rope_type": "llama3", "factor": FACTOR, "original_max_position_embeddings": CONTEXT},
}
EVAL_LENGTHS = (64, 128, 256)
FT_LENGTH, FT_STEPS, FT_BATCH, FT_LR, FT_WARMUP = 256, 40, 8, 1e-3, 5
CONTROL_FT_BATCH = FT_BATCH * FT_LENGTH // CONTEXT  # the control fine-tunes on 64-token windows, same tokens


def variant_configs() -> dict[str, GPTConfig]:
    configs = {}
    for name, _, parent, overrides in VARIANTS:
        configs[name] = replace(GPT2_LIKE if parent is None else configs[parent], **overrides)
    return configs


def with_rule(config: GPTConfig, rule: str) -> GPTConfig:
    """The same model with a RoPE scaling rule; ``context_length`` stays the original 64 tokens, which is
    the ``max_position_embeddings`` that dynamic NTK scaling measures the current length against."""
    return replace(config, rope_scaling=EXTENSION_RULES[rule])


_CORPORA: dict[str, torch.Tensor] = {}


def corpora() -> tuple[torch.Tensor, torch.Tensor]:
    """The training corpus and the held-out stream, built once per process."""
    if not _CORPORA:
        grammar = default_grammar()
        _CORPORA["train"] = synthetic_corpus(TRAIN_TOKENS, seed=TRAIN_SEED, grammar=grammar)
        _CORPORA["eval"] = synthetic_corpus(HELDOUT_TOKENS, seed=EVAL_SEED, grammar=grammar)
    return _CORPORA["train"], _CORPORA["eval"]


def ablation_run(name: str, lr: float, seed: int) -> list[tuple]:
    """One variant at one learning rate and seed: rows (variant, lr, seed, n_parameters, step, eval_loss,
    train_seconds), one per evaluation (after ``EARLY`` steps, every ``EARLY`` steps, and at the end)."""
    torch.set_num_threads(1)
    train_data, eval_data = corpora()
    t0 = time.process_time()
    torch.manual_seed(seed)
    model = GPT(variant_configs()[name])
    result = train(model, train_data, steps=STEPS, context_length=CONTEXT, batch_size=BATCH_SIZE, lr=lr,
                   warmup=WARMUP, eval_data=eval_data[: EVAL_TOKENS + 1], eval_every=EARLY,
                   seed=TRAIN_SEED + seed)
    seconds = time.process_time() - t0
    print(f"{name:8s} lr {lr:.0e} seed {seed}: early {result.eval_loss[0]:.4f}, final {result.eval_loss[-1]:.4f} "
          f"({seconds:.0f} CPU-s)", flush=True)
    return [(name, lr, seed, count_parameters(model), step, f"{loss:.5f}", f"{seconds:.1f}")
            for step, loss in zip(result.steps, result.eval_loss)]


def context_runs(seed: int) -> tuple[list[tuple], dict]:
    """Part 2 for one seed: rows (rule, ft_length, seed, eval_length, nll_last, nll_all) and CPU seconds."""
    torch.set_num_threads(1)
    train_data, eval_data = corpora()
    t0 = time.process_time()
    torch.manual_seed(seed)
    base = GPT(variant_configs()["llama"])
    train(base, train_data, steps=EXT_STEPS, context_length=CONTEXT, batch_size=BATCH_SIZE, lr=EXT_LR,
          warmup=EXT_WARMUP, eval_every=EXT_STEPS, seed=TRAIN_SEED + seed)
    seconds = {"pretrain": round(time.process_time() - t0, 1)}
    settings = [(rule, 0) for rule in EXTENSION_RULES] + [(rule, FT_LENGTH) for rule in EXTENSION_RULES]
    rows = []
    for rule, ft_length in settings + [("none", CONTEXT)]:
        model = GPT(with_rule(base.config, rule))
        model.load_state_dict(base.state_dict())
        if ft_length:
            torch.manual_seed(seed)
            batch = FT_BATCH if ft_length == FT_LENGTH else CONTROL_FT_BATCH
            train(model, train_data, steps=FT_STEPS, context_length=ft_length, batch_size=batch, lr=FT_LR,
                  warmup=FT_WARMUP, eval_every=FT_STEPS, seed=100 + seed)
        for length in EVAL_LENGTHS:
            nll_last, nll_all, _ = evaluate_length(model, eval_data, length)
            rows.append((rule, ft_length, seed, length, f"{nll_last:.5f}", f"{nll_all:.5f}"))
    seconds["total"] = round(time.process_time() - t0, 1)
    print(f"context extension seed {seed}: "
          + "  ".join(f"{r[0]}/ft{r[1]}@{r[3]}={r[4]}" for r in rows if r[3] == 256), flush=True)
    return rows, seconds


def best_lr(rows: list[tuple], name: str) -> float:
    """The learning rate with the lowest mean final loss of ``name`` over the seeds, in ablation rows."""
    finals: dict[float, list[float]] = {}
    for variant, lr, _, _, step, loss, _ in rows:
        if variant == name and int(step) == STEPS:
            finals.setdefault(float(lr), []).append(float(loss))
    return min(finals, key=lambda lr: sum(finals[lr]) / len(finals[lr]))


def bracketing_lrs(rows: list[tuple]) -> list[tuple[str, float]]:
    """(variant, learning rate) pairs still to run so that each variant's best rate is not at the edge of
    the rates it was trained at (within ``MAX_EXTENSIONS`` extra rates of ``LR_LADDER``)."""
    todo = []
    for name, *_ in VARIANTS:
        tried = sorted({float(row[1]) for row in rows if row[0] == name})
        best = best_lr(rows, name)
        if len(tried) - len(LRS) >= MAX_EXTENSIONS:
            continue
        i = LR_LADDER.index(best)
        if best == tried[0] and i > 0:
            todo.append((name, LR_LADDER[i - 1]))
        elif best == tried[-1] and i + 1 < len(LR_LADDER):
            todo.append((name, LR_LADDER[i + 1]))
    return todo


def read_rows(path: Path) -> list[tuple]:
    """A CSV written by a previous run, as tuples of strings (the header dropped); none if it is absent."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [tuple(row) for row in csv.reader(f)][1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="one-thread worker processes (default 1)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already in book/data's CSVs and run only the missing ones (the runs "
                             "are deterministic, so the files equal those of a full run on the same machine)")
    args = parser.parse_args()
    start = time.perf_counter()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    ablation_csv, context_csv = DATA_DIR / "modern_decoder_ablation.csv", DATA_DIR / "modern_decoder_context.csv"
    ablation_rows = read_rows(ablation_csv) if args.resume else []
    context_rows = read_rows(context_csv) if args.resume else []
    old_summary = json.loads((DATA_DIR / "modern_decoder.json").read_text()) if args.resume else {}
    context_seconds = {int(seed): cpu for seed, cpu in old_summary.get("extension_cpu_seconds", {}).items()}
    done = {(row[0], float(row[1]), int(row[2])) for row in ablation_rows}
    jobs = [(name, lr, seed) for seed in MODEL_SEEDS for name, *_ in VARIANTS for lr in LRS]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        context = {seed: pool.submit(context_runs, seed) for seed in MODEL_SEEDS
                   if not any(int(row[2]) == seed for row in context_rows)}
        while jobs:
            futures = [pool.submit(ablation_run, *job) for job in jobs if job not in done]
            ablation_rows += [row for future in futures for row in future.result()]
            done.update(jobs)
            jobs = [(name, lr, seed) for name, lr in bracketing_lrs(ablation_rows) for seed in MODEL_SEEDS]
        for seed, future in context.items():
            rows, context_seconds[seed] = future.result()
            context_rows += rows
    order = {name: i for i, (name, *_) in enumerate(VARIANTS)}
    ablation_rows.sort(key=lambda row: (int(row[2]), order[row[0]], float(row[1]), int(row[4])))
    context_rows.sort(key=lambda row: int(row[2]))  # stable: each seed's rows keep their order
    write_csv(ablation_csv, ["variant", "lr", "seed", "n_parameters", "step", "eval_loss", "train_seconds"],
              ablation_rows)
    write_csv(context_csv, ["rule", "ft_length", "seed", "eval_length", "nll_last", "nll_all"], context_rows)

    configs = variant_configs()
    summary = {
        "variants": [{"name": name, "change": change, "parent": parent, "config": asdict(configs[name])}
                     for name, change, parent, _ in VARIANTS],
        "lrs": list(LRS), "lr_ladder": list(LR_LADDER), "max_extensions": MAX_EXTENSIONS,
        "best_lr": {name: best_lr(ablation_rows, name) for name, *_ in VARIANTS},
        "steps": STEPS, "early": EARLY, "warmup": WARMUP, "batch_size": BATCH_SIZE,
        "train_tokens_in_corpus": TRAIN_TOKENS, "eval_tokens_scored": EVAL_TOKENS,
        "seeds": {"train_data": TRAIN_SEED, "eval_data": EVAL_SEED, "models": list(MODEL_SEEDS)},
        "entropy_rate": default_grammar().entropy_rate(),
        "extension": {"pretrain_steps": EXT_STEPS, "pretrain_lr": EXT_LR, "pretrain_warmup": EXT_WARMUP,
                      "rules": EXTENSION_RULES, "eval_lengths": list(EVAL_LENGTHS), "ft_length": FT_LENGTH,
                      "ft_steps": FT_STEPS, "ft_batch": FT_BATCH, "control_ft_batch": CONTROL_FT_BATCH,
                      "ft_lr": FT_LR, "ft_warmup": FT_WARMUP},
        "extension_cpu_seconds": {seed: context_seconds[seed] for seed in MODEL_SEEDS},
        "ablation_cpu_seconds": round(sum(float(row[-1]) for row in ablation_rows if int(row[4]) == STEPS), 1),
        "jobs": args.jobs, "resumed": args.resume,  # total_seconds: this invocation only
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    (DATA_DIR / "modern_decoder.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done in {time.perf_counter() - start:.0f} s; results in {DATA_DIR}")


if __name__ == "__main__":
    main()
