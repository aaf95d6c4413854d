"""What T5's encoder learned: three diagnostics on the span-corruption models.

Book: Pretraining objectives, "Experiments", "What T5's encoder learned". Regenerate with
``nice .venv/bin/python book/experiments/t5_diagnostics.py`` after ``pretraining_objectives.py`` (one thread,
about 3 CPU-minutes; also run by ``make experiments``). It retrains the ``t5`` variant of
``pretraining_objectives.py`` with the same corpus, budget, learning rate (the one its sweep chose, read from
``pretraining_objectives_sweep.csv``) and the first ``N_SEEDS`` seeds (the runs are not bit-reproducible across
machines, so a seed may end a little off its committed loss), keeps a randomly initialised encoder-decoder per
seed as the control, and measures:

1. **Zeroed memory**: the held-out span-corruption loss with the encoder's output, and with the memory
   replaced by zeros (the decoder then sees no source at all). A decoder that ignored its encoder would lose
   nothing.
2. **Layer-wise probes**: the tagging probe of the chapter (logistic regression, per word) on the encoder's
   states after the embedding, after each block, and after the final norm (the features used downstream).
3. **Inputs in pretraining's format**: the same probe on windows of ``T5_WORDS`` held-out words corrupted
   exactly as in pretraining (:func:`pretraining_models.t5_noise_mask`: two noise spans of five words in all
   become <S0>, <S1>; 32 tokens with [CLS]); the kept words carry their tags, the sentinels are not scored.

Writes ``book/data/pretraining_objectives_t5_diagnostics.csv``: variant (t5, random_encoder-decoder), seed,
measure, layer, value.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from llmarch.data import default_grammar
from llmarch.model import shift_right
from pretraining_models import T5_WORDS, CausalLM, SpanCorruption, t5_format, t5_noise_mask
from pretraining_objectives import (BUDGET_CLM_STEPS, DATA_DIR, HELDOUT_DOCS, HELDOUT_SEED, MODEL_SEEDS, TASK_SEED,
                                    TRAIN_DOCS, TRAIN_SEED, chosen_lrs, flops_per_step, pretrain)
from pretraining_tasks import (CLS, SENTINELS, IGNORE, N_TEST, TAG_TRAIN, VOCAB, accuracy, build_tasks, emitting_states,
                               fit_logistic_regression, sample_corpus)
from tiny_gpt import write_csv

N_SPAN_EVAL = 2048    # held-out windows for the span loss
N_SEEDS = 3           # the first three seeds of the main experiment


@torch.no_grad()
def encoder_states(t5, ids: torch.Tensor) -> list[torch.Tensor]:
    """The encoder's states ``(N, T, d)`` after the embedding, after each block, and after the final norm."""
    positions = torch.arange(ids.shape[1])
    h = t5.tok_emb(ids) + t5.src_pos_emb(positions)
    states = [h]
    for block in t5.encoder_blocks:
        h = block(h)
        states.append(h)
    states.append(t5.encoder_norm(h))
    return states


@torch.no_grad()
def span_losses(t5, windows: torch.Tensor, seed: int) -> dict[str, float]:
    """Held-out span-corruption loss (nats per target token) with the encoder's memory and with zeros."""
    source, targets = t5_format(windows, torch.Generator().manual_seed(seed))
    memory = t5.encode(source)
    decoder_in = shift_right(targets, CLS)
    out = {}
    for name, mem in (("memory", memory), ("zeroed_memory", torch.zeros_like(memory))):
        logits = t5.decode(decoder_in, mem)
        out[name] = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE).item()
    return out


def pretraining_format_tagging(grammar, stream: np.ndarray, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` windows of ``T5_WORDS`` words of ``stream`` (random starts), tagged as the tagging task tags them
    (:func:`pretraining_tasks.emitting_states`) and corrupted as in pretraining (:func:`t5_noise_mask`): ids
    ``(n, 32)`` with [CLS] first and labels ``(n, 32)``, -100 on [CLS], the sentinels and undetermined words."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - T5_WORDS, size=n)
    windows = stream[starts[:, None] + np.arange(T5_WORDS)]
    states = emitting_states(grammar, windows)
    generator = torch.Generator().manual_seed(seed)
    ids, labels = [], []
    for words, tags in zip(windows, states):
        mask = t5_noise_mask(generator).numpy()
        starts_span = mask & ~np.concatenate([[False], mask[:-1]])
        sentinel = np.cumsum(starts_span) - 1   # index of the span a noise word belongs to
        row, row_labels = [CLS], [IGNORE]
        for t in range(T5_WORDS):
            if starts_span[t]:
                row.append(SENTINELS[sentinel[t]])
                row_labels.append(IGNORE)
            elif not mask[t]:
                row.append(int(words[t]))
                row_labels.append(int(tags[t]) if tags[t] >= 0 else IGNORE)
        ids.append(row)
        labels.append(row_labels)
    return torch.tensor(ids), torch.tensor(labels)


def diagnose(name: str, t5, seed: int, tagging: dict, in_format: dict, span_windows: torch.Tensor) -> list[tuple]:
    rows = [(name, seed, measure, "", f"{value:.4f}")
            for measure, value in span_losses(t5, span_windows, seed).items()]
    inputs = {"probe": (tagging["train_ids"], tagging["train_labels"], tagging["test_ids"], tagging["test_labels"]),
              "probe_pretraining_format": (*in_format["train"], *in_format["test"])}
    for measure, (a_ids, a_y, b_ids, b_y) in inputs.items():
        train_states, test_states = encoder_states(t5, a_ids), encoder_states(t5, b_ids)
        layers = ["embedding", *(f"block {i + 1}" for i in range(len(train_states) - 2)), "final norm"]
        for layer, a_x, b_x in zip(layers, train_states, test_states):
            keep = a_y != IGNORE
            fit = fit_logistic_regression(a_x[keep], a_y[keep], tagging["n_classes"])
            with torch.no_grad():
                logits = fit(b_x)
            rows.append((name, seed, measure, layer, f"{accuracy(logits, b_y):.4f}"))
    return rows


def main() -> None:
    torch.set_num_threads(1)
    start = time.process_time()
    grammar = default_grammar()
    train_docs, _ = sample_corpus(grammar, TRAIN_DOCS, TRAIN_SEED)
    heldout_docs, _ = sample_corpus(grammar, HELDOUT_DOCS, HELDOUT_SEED)
    data = torch.as_tensor(np.concatenate(train_docs))
    heldout = np.concatenate(heldout_docs)
    tagging = build_tasks(grammar, heldout, np.random.default_rng(TASK_SEED))["tagging"]
    span_windows = torch.as_tensor(heldout[: N_SPAN_EVAL * T5_WORDS].reshape(N_SPAN_EVAL, T5_WORDS))
    in_format = {"train": pretraining_format_tagging(grammar, heldout, TAG_TRAIN, TASK_SEED),
                 "test": pretraining_format_tagging(grammar, heldout, N_TEST, TASK_SEED + 1)}
    lr = chosen_lrs()["t5"]
    torch.manual_seed(0)
    steps = round(BUDGET_CLM_STEPS * flops_per_step(CausalLM(data)) / flops_per_step(SpanCorruption(data)))
    rows = []
    for seed in MODEL_SEEDS[:N_SEEDS]:
        torch.manual_seed(seed)
        random_t5 = SpanCorruption(data)
        random_t5.eval()
        rows += diagnose("random_encoder-decoder", random_t5.t5, seed, tagging, in_format, span_windows)
        torch.manual_seed(seed)
        objective = SpanCorruption(data)
        result = pretrain(objective, steps, lr, seed)
        rows += diagnose("t5", objective.t5, seed, tagging, in_format, span_windows)
        print(f"seed {seed}: {steps} steps, final loss {result['final_loss']:.4f}, "
              f"{time.process_time() - start:.0f} CPU-s", flush=True)
    write_csv(DATA_DIR / "pretraining_objectives_t5_diagnostics.csv",
              ["variant", "seed", "measure", "layer", "value"], rows)


if __name__ == "__main__":
    main()
