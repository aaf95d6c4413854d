"""From GPT-2 to Llama 3 on the synthetic corpus: an ablation ladder, and RoPE context extension.

Book: From GPT-2 to Llama 3, "The ablation" and "Context extension". Regenerate the files with
``make experiments`` (this script alone took 11.5 minutes on a 2-core CPU shared with other work). Everything is seeded; a
rerun on the same machine and thread count reproduces the files, but across machines the runs are not
bit-reproducible and single runs can move by as much as the spread between seeds: compare means over seeds.

Part 1, the ablation. Tiny decoders (``N_LAYERS`` blocks, width 64, 4 heads, 64-token context) are trained
on the course's grammar corpus, ``STEPS`` AdamW steps each, three model seeds per variant. The variants form
a ladder: the GPT-2-like baseline, then one change at a time until the model is Llama-like (see
``VARIANTS``); ``post_ln`` (one step *back*, to GPT-1's post-LN) and ``mqa`` (one step further, one key/value
head) branch off it. The SwiGLU hidden size is ``2/3`` of the MLP's ``4 d_model`` so that the parameter counts
match. Each model is scored by its mean NLL on held-out text (non-overlapping 64-token windows).

Part 2, context extension. The Llama-like models of part 1 (trained on 64-token windows) are evaluated on
windows of 64, 128 and 256 tokens with their RoPE frequencies unchanged and with each scaling rule (factor
4, original context 64): linear position interpolation, dynamic NTK, YaRN and Llama 3. Each is evaluated as
is and after ``FT_STEPS`` fine-tuning steps on 256-token windows (same tokens per step as pre-training). The
score is ``nll_last`` of the positional-encodings chapter (``length_generalisation.evaluate_length``): the
loss of the same scored tokens for every length, sitting at the last 16 positions of the window.

Writes, under ``book/data/`` next to this script's folder:

- ``modern_decoder_ablation.csv``: variant, seed, n_parameters, train_loss (the mean training loss over all
  ``STEPS`` steps, a measure of how fast a variant learns), eval_loss (held-out, after training; nats per
  token), train_seconds;
- ``modern_decoder_context.csv``: rule, finetuned (0/1), seed, eval_length, nll_last, nll_all;
- ``modern_decoder.json``: the configuration of every variant, the training settings, the grammar's entropy
  rate and the run times.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.layers import swiglu_hidden_size
from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.train import evaluate, train
from length_generalisation import evaluate_length  # sibling script (this folder is on sys.path when run)
from tiny_gpt import write_csv

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

CONTEXT, D_MODEL, N_LAYERS, N_HEADS = 64, 64, 2, 4
TRAIN_TOKENS, EVAL_TOKENS = 1_000_000, 100_000
TRAIN_SEED, EVAL_SEED, MODEL_SEEDS = 0, 1, (0, 1, 2)
STEPS, BATCH_SIZE, LR, WARMUP = 500, 32, 3e-3, 50
EVAL_HELD_OUT = 32_768  # held-out tokens scored by the ablation (512 windows of 64)

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


def variant_configs() -> dict[str, GPTConfig]:
    configs = {}
    for name, _, parent, overrides in VARIANTS:
        configs[name] = replace(GPT2_LIKE if parent is None else configs[parent], **overrides)
    return configs


def with_rule(config: GPTConfig, rule: str) -> GPTConfig:
    """The same model with a RoPE scaling rule; ``context_length`` stays the original 64 tokens, which is
    the ``max_position_embeddings`` that dynamic NTK scaling measures the current length against."""
    return replace(config, rope_scaling=EXTENSION_RULES[rule])


def main() -> None:
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.set_num_threads(2)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    grammar = default_grammar()
    train_data = synthetic_corpus(TRAIN_TOKENS, seed=TRAIN_SEED, grammar=grammar)
    eval_data = synthetic_corpus(EVAL_TOKENS, seed=EVAL_SEED, grammar=grammar)
    configs = variant_configs()

    rows, runs, llama_models = [], {}, {}
    for seed in MODEL_SEEDS:
        for name, _, _, _ in VARIANTS:
            t0 = time.perf_counter()
            torch.manual_seed(seed)
            model = GPT(configs[name])
            result = train(model, train_data, steps=STEPS, context_length=CONTEXT, batch_size=BATCH_SIZE, lr=LR,
                           warmup=WARMUP, eval_every=STEPS, seed=TRAIN_SEED + seed)
            seconds = time.perf_counter() - t0
            with torch.no_grad():
                eval_loss = evaluate(model, eval_data[: EVAL_HELD_OUT + 1], CONTEXT)
            train_loss = result.train_loss[-1]  # eval_every=STEPS: the mean over all steps
            rows.append((name, seed, count_parameters(model), f"{train_loss:.5f}", f"{eval_loss:.5f}",
                         f"{seconds:.1f}"))
            runs[f"{name}_{seed}"] = round(seconds, 1)
            if name == "llama":
                llama_models[seed] = model
            print(f"{name:8s} seed {seed}  eval {eval_loss:.4f}  ({seconds:.0f} s)", flush=True)
    write_csv(DATA_DIR / "modern_decoder_ablation.csv",
              ["variant", "seed", "n_parameters", "train_loss", "eval_loss", "train_seconds"], rows)

    context_rows, ft_runs = [], {}
    for seed, base in llama_models.items():
        for rule in EXTENSION_RULES:
            for finetuned in (0, 1):
                model = GPT(with_rule(base.config, rule))
                model.load_state_dict(base.state_dict())
                if finetuned:
                    t0 = time.perf_counter()
                    torch.manual_seed(seed)
                    train(model, train_data, steps=FT_STEPS, context_length=FT_LENGTH, batch_size=FT_BATCH, lr=FT_LR,
                          warmup=FT_WARMUP, eval_every=FT_STEPS, seed=100 + seed)
                    ft_runs[f"{rule}_{seed}"] = round(time.perf_counter() - t0, 1)
                for length in EVAL_LENGTHS:
                    nll_last, nll_all, _ = evaluate_length(model, eval_data, length)
                    context_rows.append((rule, finetuned, seed, length, f"{nll_last:.5f}", f"{nll_all:.5f}"))
        print(f"context extension seed {seed}: "
              + "  ".join(f"{r[0]}{'+ft' if r[1] else ''}@{r[3]}={r[4]}" for r in context_rows
                          if r[2] == seed and r[3] == 256), flush=True)
    write_csv(DATA_DIR / "modern_decoder_context.csv",
              ["rule", "finetuned", "seed", "eval_length", "nll_last", "nll_all"], context_rows)

    summary = {
        "variants": [{"name": name, "change": change, "config": asdict(configs[name])}
                     for name, change, _, _ in VARIANTS],
        "steps": STEPS, "batch_size": BATCH_SIZE, "lr": LR, "warmup": WARMUP,
        "train_tokens_in_corpus": TRAIN_TOKENS, "eval_tokens_scored": EVAL_HELD_OUT,
        "seeds": {"train_data": TRAIN_SEED, "eval_data": EVAL_SEED, "models": list(MODEL_SEEDS)},
        "entropy_rate": grammar.entropy_rate(),
        "extension": {"rules": EXTENSION_RULES, "eval_lengths": list(EVAL_LENGTHS), "ft_length": FT_LENGTH,
                      "ft_steps": FT_STEPS, "ft_batch": FT_BATCH, "ft_lr": FT_LR, "ft_warmup": FT_WARMUP},
        "train_seconds": runs,
        "finetune_seconds": ft_runs,
        "total_seconds": round(time.perf_counter() - start, 1),
        "total_cpu_seconds": round(time.process_time() - cpu_start, 1),
    }
    (DATA_DIR / "modern_decoder.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done in {time.perf_counter() - start:.0f} s; results in {DATA_DIR}")


if __name__ == "__main__":
    main()
