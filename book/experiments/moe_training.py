"""A Mixtral-style and a DeepSeek-style tiny model trained a few steps with their balancing terms, and without.

Book: From GPT-2 to Llama 3, "After Llama 3" (mixture of experts). Run with
``nice .venv/bin/python book/experiments/moe_training.py`` (three seeds, about 30 s on one CPU core); the chapter can
also call :func:`train_variants` (one seed, about 10 s) and :func:`table` itself.

Every variant is a 2-layer, width-32 decoder on the course's grammar corpus with 8 routed SwiGLU experts of
hidden size 32, top-2 routing, trained ``STEPS`` AdamW steps (batch 16, 32-token windows) from the same seed:

- ``mixtral``: softmax router, Switch's balancing loss (coefficient 0.02) and the router z-loss (1e-3), added to
  the language-model loss through ``model.aux_loss()``;
- ``mixtral, no aux loss``: the same router without either term;
- ``deepseek``: multi-head latent attention, a dense first layer, then one shared expert plus the sigmoid router
  with 4 groups (top 2 groups), no auxiliary loss; after each step ``update_expert_biases`` moves each expert's
  selection bias by ``gamma = 0.01`` towards balance;
- ``deepseek, no bias update``: the same without the bias step.

Columns: held-out loss (nats per token), and on the held-out tokens, averaged over the MoE layers: the largest
expert load over the mean load (1 is perfect balance, 4 means one expert takes every token's first or second
choice), Switch's balancing loss ``E sum_e f_e P_e`` (1 at balance), and the number of experts that get less
than a tenth of the mean load. Writes ``book/data/moe_training.csv`` (one row per seed and variant) next to this
script's folder.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from llmarch.data import default_grammar, get_batch, synthetic_corpus
from llmarch.mla import MLAConfig
from llmarch.model import GPT, llama_config
from llmarch.moe import MoEConfig, MoEFeedForward, update_expert_biases

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
STEPS, BATCH, CONTEXT, LR = 150, 16, 32, 3e-3
SEEDS = (0, 1, 2)
COLUMNS = ["variant", "eval_loss", "max_over_mean_load", "balance_loss", "starved_experts", "seconds"]


def variant_configs():
    """``{name: (GPTConfig, update the selection biases after each step)}``."""
    vocab = len(default_grammar().vocab)
    base = dict(vocab_size=vocab, context_length=CONTEXT, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=64)
    mixtral = MoEConfig(n_experts=8, top_k=2, d_expert=32, balance_coef=0.02, z_coef=1e-3)
    deepseek = MoEConfig(n_experts=8, top_k=2, d_expert=32, n_shared_experts=1, router="sigmoid_bias", n_group=4,
                         topk_group=2, balance_coef=0.0, z_coef=0.0, bias_update_rate=0.01, first_dense_layers=1)
    mla = MLAConfig(kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    no_aux = MoEConfig(**{**vars(mixtral), "balance_coef": 0.0, "z_coef": 0.0})
    return {
        "mixtral": (llama_config("mistral-7b", **base, sliding_window=None, moe=mixtral), False),
        "mixtral, no aux loss": (llama_config("mistral-7b", **base, sliding_window=None, moe=no_aux), False),
        "deepseek": (llama_config("llama-3-8b", **base, moe=deepseek, mla=mla), True),
        "deepseek, no bias update": (llama_config("llama-3-8b", **base, moe=deepseek, mla=mla), False),
    }


def routing_stats(model: GPT) -> dict[str, float]:
    """Load statistics of the last forward, averaged over the model's MoE layers."""
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    ratio = [float(m.aux["load"].max() / m.aux["load"].mean()) for m in layers]
    starved = [int((m.aux["load"] < 0.1 * m.aux["load"].mean()).sum()) for m in layers]
    balance = [float(m.aux["balance"]) for m in layers]
    return {"max_over_mean_load": sum(ratio) / len(layers), "balance_loss": sum(balance) / len(layers),
            "starved_experts": sum(starved) / len(layers)}


def train_variant(config, update_biases: bool, train_data, eval_x, eval_y, steps: int = STEPS, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = GPT(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    batches = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = get_batch(train_data, BATCH, CONTEXT, generator=batches)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()) + model.aux_loss()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if update_biases:
            update_expert_biases(model)
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        eval_loss = float(torch.nn.functional.cross_entropy(model(eval_x).flatten(0, 1), eval_y.flatten()))
    return {"eval_loss": eval_loss, **routing_stats(model), "seconds": seconds}


def train_variants(steps: int = STEPS, seed: int = 0) -> list[dict]:
    """One row per variant (see the module docstring), every variant from the same ``seed`` (initial weights and
    batches). One seed is a demonstration, not a measurement: compare several before claiming a difference."""
    train_data, eval_data = synthetic_corpus(50_000, seed=1), synthetic_corpus(8 * CONTEXT + 1, seed=2)
    eval_x, eval_y = eval_data[:-1].view(8, CONTEXT), eval_data[1:].view(8, CONTEXT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only wait on each other
    try:
        return [{"variant": name, **train_variant(config, update, train_data, eval_x, eval_y, steps, seed)}
                for name, (config, update) in variant_configs().items()]
    finally:
        torch.set_num_threads(threads)


def table(rows: list[dict]) -> str:
    lines = [f"{'variant':<26}{'eval loss':>10}{'max/mean load':>15}{'balance loss':>14}{'starved':>9}"]
    lines += [f"{r['variant']:<26}{r['eval_loss']:>10.3f}{r['max_over_mean_load']:>15.2f}{r['balance_loss']:>14.3f}"
              f"{r['starved_experts']:>9.1f}" for r in rows]
    return "\n".join(lines)


def main() -> None:
    rows = [{"seed": seed, **row} for seed in SEEDS for row in train_variants(seed=seed)]
    for seed in SEEDS:
        print(f"seed {seed}\n{table([r for r in rows if r['seed'] == seed])}")
    from tiny_gpt import write_csv  # sibling script (this folder is on sys.path when run)
    write_csv(DATA_DIR / "moe_training.csv", ["seed", *COLUMNS], [[r[c] for c in ["seed", *COLUMNS]] for r in rows])


if __name__ == "__main__":
    main()
