"""Pretraining objectives in miniature: causal LM, MLM, span corruption, masking rates, NSP and ELECTRA.

Book: Pretraining objectives, "Experiments". Regenerate the files with ``make experiments`` (or
``nice .venv/bin/python book/experiments/pretraining_objectives.py --jobs 2``: two one-thread worker
processes, about 65 CPU-minutes in all, the sweep on three seeds 20 of them). Everything is seeded, and a rerun on the same
machine and thread count reproduces the losses. Across machines the runs are not bit-reproducible
(reductions run in another order), and a single run can end as far from its committed value as the spread
between seeds (a rerun of one T5 seed elsewhere once ended 0.11 nats off). Compare means over seeds.

Corpus and tasks: :mod:`pretraining_tasks`. Every encoder is pre-LN (``x + SubLayer(LN(x))``, a final LN);
the post-LN BERT encoder of :mod:`llmarch.model` is kept as a control (``mlm_postln``). Width 64, 4 heads,
2 layers (the encoder-decoder 2 + 2). Every model reads 32 tokens: ``[CLS]`` and 31 words; T5's encoder
reads ``[CLS]`` and 34 words after span corruption (34 - 5 noise words + 2 sentinels = 31), so that its
sources are as long as the downstream inputs, as T5 chooses its raw lengths, with masks rolled so that every
position holds words in some sources (``pretraining_models.t5_noise_mask``); the pair models read
``[CLS] A(15) [SEP] B(14) [SEP]``. ELECTRA's
generator (width 32) and discriminator share their embeddings (token, position, segment, and their
LayerNorm; the generator projects them to its width), as in Clark et al. (2020).

Two phases:

1. **Learning-rate sweep** (``SWEEP_LRS`` x ``SWEEP_SEEDS``, pretraining only) for the objectives in
   ``SWEPT``; each takes the rate with the lowest mean held-out pretraining loss (ELECTRA: its total loss
   ``L_MLM + 50 L_RTD``); the other MLM variants take MLM's rate (``LR_FROM``).
2. **Main runs** (``MODEL_SEEDS``): each variant (``make_objectives``) is trained at its rate for the number of
   steps that spends the FLOPs of ``BUDGET_CLM_STEPS`` steps of the causal LM (a step's FLOPs are measured
   with ``FlopCounterMode``: forward and backward matrix products), then scored downstream by a linear probe
   on frozen features, by full fine-tuning, and (``ZERO_SHOT`` variants, grammaticality only) by its
   pretraining head with one threshold; randomly initialised architectures are scored as controls.

``--seeds`` and ``--only`` rerun some runs and merge them into the committed files under a lock, so that
partial reruns can run side by side; ``--jobs N`` spreads the runs over N worker processes.

Writes, under ``book/data/`` next to this script's folder:

- ``pretraining_objectives_sweep.csv``: variant, lr, seed, steps, final_train_loss, heldout_loss, CPU seconds;
- ``pretraining_objectives_runs.csv``: variant, seed, lr, steps, corpus_words, flops_per_step, train_flops,
  n_parameters (trained), n_parameters_backbone (used downstream), final_train_loss (mean of the last 10% of
  the steps), heldout_loss (the pretraining loss on held-out text), mlm_loss_15 and mlm_loss_own_rate
  (held-out MLM loss with 15% / the variant's own rate selected; MLM variants only, on held-out pairs for the
  pair variants), nsp_accuracy, CPU seconds;
- ``pretraining_objectives_downstream.csv``: variant, seed, task, method (probe, finetune, zero_shot),
  accuracy;
- ``pretraining_objectives_curves.csv``: variant, seed, step, loss (mean over the last ``CURVE_EVERY`` steps),
  and for ELECTRA its generator's MLM loss, the discriminator's loss and the fraction of replaced words;
- ``pretraining_objectives.json``: the variants, the experiments that compare them, the chosen learning
  rates, the steps and FLOPs, the settings, the task baselines and the CPU time.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import multiprocessing
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from llmarch.data import default_grammar
from llmarch.model import count_parameters
from llmarch.objectives import nsp_pairs, t5_span_counts
from llmarch.train import warmup_cosine_lr
from pretraining_models import (BATCH, D_MODEL, ELECTRA_WEIGHT, GENERATOR_D_MODEL, N_HEADS, N_LAYERS, T5_WORDS,
                                CausalLM, Electra, MaskedLM, NextSentence, SpanCorruption)
from pretraining_tasks import (CLS, DOC_WORDS, FT_BATCH, FT_LR, FT_STEPS, FT_WARMUP, GRAM_TRAIN, N_TEST, SEP,
                               TAG_TRAIN, TOPIC_SHARE, TOPICS, VOCAB, WINDOW, adamw, build_tasks, fine_tune,
                               linear_probe, sample_corpus, set_lr, task_baselines)
from tiny_gpt import write_csv  # sibling script (this folder is on sys.path when run)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

TRAIN_DOCS, HELDOUT_DOCS = 3000, 1500
TRAIN_SEED, HELDOUT_SEED, TASK_SEED = 0, 1, 2
SEGMENT = 15             # NSP: [CLS] A(15) [SEP] B(14) [SEP] = 32 tokens (B loses one word, BERT's truncation)
# Pretraining: AdamW, warm-up and cosine decay; the compute budget is BUDGET_CLM_STEPS steps of the causal LM.
WARMUP, BUDGET_CLM_STEPS = 50, 1500  # BATCH: pretraining_models
CURVE_EVERY = 50         # learning curves: mean training loss over every 50 steps
HELDOUT_BATCHES = 16     # held-out pretraining loss: 16 batches of 32 held-out examples (fixed sampling seed)
MODEL_SEEDS = (0, 1, 2, 3, 4)
# The learning-rate sweep: pretraining only, on three seeds of its own (one seed once picked a rate by a
# difference far smaller than the spread between seeds).
SWEEP_LRS = (1e-3, 3e-3, 1e-2)
SWEEP_SEEDS = (100, 101, 102)
SWEPT = ("clm", "mlm", "mlm_postln", "t5", "electra")
LR_FROM = {"nsp": "mlm", "pairs": "mlm", "mlm_5": "mlm", "mlm_40": "mlm", "mlm_80": "mlm"}
# A control at a fixed rate: the causal LM at the sweep's runner-up, 1e-3 (its mean held-out loss was within
# 0.001 nats of 1e-2's), to show how much the downstream scores depend on that near-tie.
FIXED_LR = {"clm_lr1e-3": 1e-3}
MASK_RATES = (0.05, 0.15, 0.40, 0.80)
ZERO_SHOT_TRAIN = 512    # training windows used to fit the zero-shot threshold


# Pretraining at equal compute
# --------------------------------------------------------------------------------------------------------------

def flops_per_step(objective: nn.Module) -> int:
    """Floating-point operations of one training step (forward and backward of ``objective.loss`` on one
    batch), counted by ``torch.utils.flop_counter.FlopCounterMode``: every matrix product, attention's
    included; element-wise operations are not counted. The optimiser step is not counted either."""
    with FlopCounterMode(display=False) as counter:
        objective.loss(torch.Generator().manual_seed(0)).backward()
    objective.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def used_parameters(backbone: nn.Module, ids: torch.Tensor) -> int:
    """Number of parameters that the downstream model uses: those that receive a gradient from the backbone's
    hidden states (an encoder-decoder's decoder and the pretraining heads do not)."""
    backbone.zero_grad(set_to_none=True)
    backbone(ids).sum().backward()
    params = {id(p): p for p in backbone.parameters() if p.grad is not None}
    backbone.zero_grad(set_to_none=True)
    return sum(p.numel() for p in params.values())


def pretrain(objective: nn.Module, steps: int, lr: float, seed: int) -> dict:
    """``steps`` AdamW steps (peak rate ``lr``, warm-up, cosine decay; the gradient of the whole loss clipped
    to norm 1) on ``objective.loss``. Returns the mean loss of the last 10% of the steps, the CPU seconds, and
    the learning curve: the mean loss (and the mean of each part an objective reports in ``objective.parts``)
    over every ``CURVE_EVERY`` steps."""
    start = time.process_time()
    generator = torch.Generator().manual_seed(seed)
    optimizer = adamw(objective, lr)
    objective.train()
    losses, parts, curve = [], defaultdict(list), []
    for step in range(steps):
        set_lr(optimizer, warmup_cosine_lr(step, lr, WARMUP, steps))
        loss = objective.loss(generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        for name, value in getattr(objective, "parts", {}).items():
            parts[name].append(value)
        if (step + 1) % CURVE_EVERY == 0 or step + 1 == steps:
            first = step + 1 - ((step + 1) % CURVE_EVERY or CURVE_EVERY)
            curve.append({"step": step + 1, "loss": float(np.mean(losses[first:])),
                          **{name: float(np.mean(values[first:])) for name, values in parts.items()}})
    objective.eval()
    return {"final_loss": float(np.mean(losses[-max(1, steps // 10):])), "curve": curve,
            "cpu_seconds": time.process_time() - start}


@torch.no_grad()
def heldout_loss(objective: nn.Module, heldout) -> float:
    """The pretraining loss on held-out text (``heldout``: a word stream, or NSP pairs for the pair variants):
    the mean of ``HELDOUT_BATCHES`` batches drawn with one fixed seed, so that every run sees the same
    windows (and, for the objectives whose noise does not depend on the model, the same masks)."""
    objective.eval()
    generator = torch.Generator().manual_seed(HELDOUT_SEED)
    return float(np.mean([objective.loss(generator, heldout).item() for _ in range(HELDOUT_BATCHES)]))


# --------------------------------------------------------------------------------------------------------------
# Zero-shot: the pretraining head itself judges grammaticality
# --------------------------------------------------------------------------------------------------------------

def fit_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The threshold ``theta`` that maximises the accuracy of ``label = 1[score > theta]`` on ``(scores,
    labels)`` (midpoints between sorted scores; ties go to the smallest)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 1 or len(scores) < 2:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be equal 1-d shapes, length >= 2")
    order = np.argsort(scores)
    s, y = scores[order], labels[order]
    # predicting 1 above candidate k (k = 0..N): correct = zeros at or below + ones above
    correct = np.concatenate([[0], np.cumsum(y == 0)]) + np.concatenate([np.cumsum((y == 1)[::-1])[::-1], [0]])
    correct[1:-1][s[:-1] == s[1:]] = -1  # no threshold separates equal scores
    k = int(np.argmax(correct))
    if k == 0:
        return float(s[0] - 1.0)
    if k == len(s):
        return float(s[-1] + 1.0)
    return float((s[k - 1] + s[k]) / 2)


def zero_shot_accuracy(objective: nn.Module, task: dict) -> float:
    """Grammaticality from the pretraining head alone: a window's score is its least likely word,
    ``min_t log p(w_t | context)`` (each objective's own notion of context), and the window is called
    grammatical above a threshold fit on ``ZERO_SHOT_TRAIN`` training windows."""
    def score(ids):
        return torch.cat([objective.word_log_probs(ids[i: i + 256]) for i in range(0, len(ids), 256)]).min(1).values
    theta = fit_threshold(score(task["train_ids"][:ZERO_SHOT_TRAIN]).numpy(),
                          task["train_labels"][:ZERO_SHOT_TRAIN].numpy())
    return ((score(task["test_ids"]) > theta).long() == task["test_labels"]).double().mean().item()


# --------------------------------------------------------------------------------------------------------------
# The experiments
# --------------------------------------------------------------------------------------------------------------

def make_objectives(data: torch.Tensor, pairs: dict) -> dict:
    """Every pretrained variant, by name: (objective factory, what it is)."""
    variants = {
        "clm": (lambda: CausalLM(data), "causal LM (GPT)"),
        "clm_lr1e-3": (lambda: CausalLM(data), "causal LM at lr 1e-3 (control)"),
        "mlm": (lambda: MaskedLM(data, 0.15), "MLM 15% (BERT, pre-LN)"),
        "mlm_postln": (lambda: MaskedLM(data, 0.15, post_ln=True), "MLM 15% on BERT's post-LN encoder (control)"),
        "t5": (lambda: SpanCorruption(data), "span corruption (T5, encoder-decoder)"),
        "electra": (lambda: Electra(data), "replaced-token detection (ELECTRA)"),
        "nsp": (lambda: NextSentence(pairs, with_nsp=True), "MLM + NSP on segment pairs (BERT)"),
        "pairs": (lambda: NextSentence(pairs, with_nsp=False), "MLM on segment pairs, no NSP"),
    }
    for rate in MASK_RATES:
        if rate != 0.15:
            variants[f"mlm_{round(rate * 100)}"] = (lambda r=rate: MaskedLM(data, r), f"MLM {rate:.0%}")
    return variants


EXPERIMENTS = {
    "objectives": ["clm", "mlm", "mlm_postln", "t5"],
    "mask_rate": ["mlm_5", "mlm", "mlm_40", "mlm_80"],
    "nsp": ["nsp", "pairs", "mlm"],
    "electra": ["mlm", "electra"],
    "lr_control": ["clm", "clm_lr1e-3"],
}
ZERO_SHOT = ("clm", "mlm", "t5", "electra")
RANDOM_INIT = {"random_decoder": "clm", "random_encoder": "mlm", "random_encoder-decoder": "t5"}


def segment_documents(docs: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Each document cut into consecutive segments of ``SEGMENT`` words (the rest dropped), NSP's units."""
    return [[doc[i: i + SEGMENT] for i in range(0, len(doc) - SEGMENT + 1, SEGMENT)] for doc in docs]


def pair_tensors(docs: list[np.ndarray], seed: int) -> dict:
    """NSP pairs of consecutive ``SEGMENT``-word segments (:func:`llmarch.objectives.nsp_pairs`), cut to
    ``WINDOW + 1`` = 32 tokens as BERT's ``truncate_seq_pair`` does: the longer segment (B when they are equal)
    loses one word, at its front or its back with probability 1/2. ``[CLS] A(15) [SEP] B(14) [SEP]``."""
    generator = torch.Generator().manual_seed(seed)
    examples = nsp_pairs(segment_documents(docs), CLS, SEP, generator)
    ids = torch.stack([e.input_ids for e in examples])          # [CLS] A(15) [SEP] B(15) [SEP]
    first_b = SEGMENT + 2
    drop = torch.where(torch.rand(len(ids), generator=generator) < 0.5, first_b, first_b + SEGMENT - 1)
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[torch.arange(len(ids)), drop] = False
    ids = ids[keep].reshape(len(ids), -1)
    types = torch.cat([torch.zeros(len(ids), first_b, dtype=torch.long),
                       torch.ones(len(ids), ids.shape[1] - first_b, dtype=torch.long)], dim=1)
    return {"input_ids": ids, "token_type_ids": types,
            "labels": torch.tensor([e.next_sentence_label for e in examples])}


def evaluate_downstream(objective: nn.Module, tasks: dict, seed: int) -> list[tuple[str, str, float]]:
    backbone = objective.backbone()
    out = []
    for name, task in tasks.items():
        out.append((name, "probe", linear_probe(backbone, task, task["pooled"])))
        out.append((name, "finetune", fine_tune(backbone, D_MODEL, task, task["pooled"], seed)))
    return out


def select_lrs(sweep_rows: list[dict]) -> dict[str, float]:
    """Each swept objective's learning rate: the one of ``SWEEP_LRS`` with the lowest held-out pretraining loss,
    averaged over the sweep's seeds (a diverged run, NaN, counts as infinite); the variants of ``LR_FROM`` take
    their source's rate, those of ``FIXED_LR`` their fixed rate. ``sweep_rows``: the rows of ``pretraining_objectives_sweep.csv``, which must hold every
    rate of every objective of ``SWEPT`` for the same seeds."""
    losses, seeds = defaultdict(list), defaultdict(set)
    for row in sweep_rows:
        losses[row["variant"], float(row["lr"])].append(float(row["heldout_loss"]))
        seeds[row["variant"], float(row["lr"])].add(row["seed"])
    chosen = {}
    for name in SWEPT:
        if not seeds[name, SWEEP_LRS[0]] or any(seeds[name, lr] != seeds[name, SWEEP_LRS[0]] for lr in SWEEP_LRS):
            raise ValueError(f"the sweep does not hold {name!r} at every lr of {SWEEP_LRS} for the same seeds "
                             f"({ {lr: sorted(seeds[name, lr]) for lr in SWEEP_LRS} }): run the sweep phase first")
        chosen[name] = min(SWEEP_LRS, key=lambda lr: np.nan_to_num(np.mean(losses[name, lr]), nan=np.inf))
    return {**chosen, **{name: chosen[source] for name, source in LR_FROM.items()}, **FIXED_LR}


def chosen_lrs(out_dir: Path = DATA_DIR) -> dict[str, float]:
    """:func:`select_lrs` on ``out_dir``'s sweep file, read under the lock that the runs merge under."""
    with open(Path(tempfile.gettempdir()) / "llmarch-pretraining-objectives.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with (out_dir / "pretraining_objectives_sweep.csv").open() as f:
            return select_lrs(list(csv.DictReader(f)))


# --------------------------------------------------------------------------------------------------------------
# Running: one work item per (variant, seed[, lr]), in this process or in worker processes
# --------------------------------------------------------------------------------------------------------------

HEADERS = {
    "sweep": ["variant", "lr", "seed", "steps", "final_train_loss", "heldout_loss", "cpu_seconds"],
    "runs": ["variant", "seed", "lr", "steps", "corpus_words", "flops_per_step", "train_flops", "n_parameters",
             "n_parameters_backbone", "final_train_loss", "heldout_loss", "mlm_loss_15", "mlm_loss_own_rate",
             "nsp_accuracy", "pretrain_cpu_seconds", "downstream_cpu_seconds"],
    "downstream": ["variant", "seed", "task", "method", "accuracy"],
    "curves": ["variant", "seed", "step", "loss", "generator_mlm", "rtd", "replaced_fraction"],
}
CONTEXT: dict = {}   # the corpus, tasks and variants, built once by `build_context` (inherited by workers)


def build_context(budget_clm_steps: int) -> dict:
    grammar = default_grammar()
    train_docs, _ = sample_corpus(grammar, TRAIN_DOCS, TRAIN_SEED)
    heldout_docs, _ = sample_corpus(grammar, HELDOUT_DOCS, HELDOUT_SEED)
    data = torch.as_tensor(np.concatenate(train_docs))
    heldout = np.concatenate(heldout_docs)
    pairs, heldout_pairs = pair_tensors(train_docs, TRAIN_SEED), pair_tensors(heldout_docs[:300], HELDOUT_SEED)
    tasks = build_tasks(grammar, heldout, np.random.default_rng(TASK_SEED))
    variants = make_objectives(data, pairs)
    torch.manual_seed(0)
    flops = {name: flops_per_step(factory()) for name, (factory, _) in variants.items()}
    budget = budget_clm_steps * flops["clm"]
    return {"grammar": grammar, "data": data, "heldout": torch.as_tensor(heldout), "pairs": pairs,
            "heldout_pairs": heldout_pairs, "tasks": tasks, "variants": variants, "flops": flops,
            "budget": budget, "steps": {name: round(budget / f) for name, f in flops.items()}}


def words_per_example(name: str) -> int:
    return T5_WORDS if name == "t5" else WINDOW


def run_item(item: tuple) -> dict:
    """One work item: ``("sweep", variant, seed, lr)`` (pretraining and its held-out loss),
    ``("main", variant, seed, lr)`` (pretraining and every evaluation) or ``("random", name, seed, None)``
    (the evaluations of a randomly initialised architecture). Returns the rows it adds to each file."""
    torch.set_num_threads(1)
    kind, name, seed, lr = item
    ctx, t0 = CONTEXT, time.process_time()
    if kind == "random":
        torch.manual_seed(seed)
        objective = ctx["variants"][RANDOM_INIT[name]][0]()
        rows = [(name, seed, task, method, f"{acc:.4f}") for task, method, acc in
                evaluate_downstream(objective, ctx["tasks"], seed)]
        print(f"seed {seed} {name}: " + " ".join(f"{r[2][:4]}/{r[3]}={r[4]}" for r in rows), flush=True)
        return {"downstream": rows, "random_cpu": {f"{name}/{seed}": round(time.process_time() - t0, 1)}}
    torch.manual_seed(seed)
    objective = ctx["variants"][name][0]()
    steps = ctx["steps"][name]
    result = pretrain(objective, steps, lr, seed)
    held = heldout_loss(objective, ctx["heldout_pairs"] if isinstance(objective, NextSentence) else ctx["heldout"])
    if kind == "sweep":
        print(f"sweep {name:10s} lr {lr:g} seed {seed}: train {result['final_loss']:.4f} held-out {held:.4f} "
              f"({result['cpu_seconds']:.0f} s)", flush=True)
        return {"sweep": [(name, f"{lr:g}", seed, steps, f"{result['final_loss']:.4f}", f"{held:.4f}",
                           f"{result['cpu_seconds']:.1f}")]}
    extra, tasks = {}, ctx["tasks"]
    if isinstance(objective, NextSentence):  # scored on held-out pairs, the format it was trained on
        pairs = ctx["heldout_pairs"]
        for key, rate in (("mlm_loss_15", 0.15), ("mlm_loss_own_rate", objective.mask_prob)):
            extra[key] = objective.eval_mlm_loss(pairs["input_ids"], rate, seed, pairs["token_type_ids"])
        if objective.with_nsp:
            extra["nsp_accuracy"] = objective.nsp_accuracy(pairs)
    elif isinstance(objective, MaskedLM):
        for key, rate in (("mlm_loss_15", 0.15), ("mlm_loss_own_rate", objective.mask_prob)):
            extra[key] = objective.eval_mlm_loss(tasks["tagging"]["test_ids"], rate, seed)
    t1 = time.process_time()
    results = evaluate_downstream(objective, tasks, seed)
    if name in ZERO_SHOT:
        results.append(("grammaticality", "zero_shot", zero_shot_accuracy(objective, tasks["grammaticality"])))
    curve = [(name, seed, point["step"], *(f"{point[k]:.4f}" if k in point else "" for k in HEADERS["curves"][3:]))
             for point in result["curve"]]
    flops = ctx["flops"][name]
    run = (name, seed, f"{lr:g}", steps, steps * BATCH * words_per_example(name), flops, steps * flops,
           count_parameters(objective), used_parameters(objective.backbone(), tasks["tagging"]["test_ids"][:2]),
           f"{result['final_loss']:.4f}", f"{held:.4f}",
           *(f"{extra[k]:.4f}" if k in extra else "" for k in HEADERS["runs"][11:14]),
           f"{result['cpu_seconds']:.1f}", f"{time.process_time() - t1:.1f}")
    print(f"seed {seed} {name:10s} lr {lr:g} steps {steps:4d} loss {result['final_loss']:.3f} held-out {held:.3f} "
          + " ".join(f"{k}={v:.3f}" for k, v in extra.items()) + " | "
          + " ".join(f"{t[:4]}/{m}={a:.3f}" for t, m, a in results)
          + f" ({result['cpu_seconds']:.0f}+{time.process_time() - t1:.0f} s)", flush=True)
    return {"runs": [run], "curves": curve,
            "downstream": [(name, seed, task, method, f"{acc:.4f}") for task, method, acc in results]}


def run_items(items: list[tuple], jobs: int):
    """Every item, in ``jobs`` one-thread worker processes (forked: they share ``CONTEXT``); yields each item's
    rows per file as it finishes."""
    if jobs == 1:
        yield from map(run_item, items)
        return
    with multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=1) as pool:
        yield from pool.imap_unordered(run_item, items, chunksize=1)


def merge_file(out_dir: Path, name: str, rows: list[tuple], order: list[str]) -> list[dict]:
    """Rows of ``pretraining_objectives_<name>.csv`` whose key (variant, seed; the sweep's variant, lr, seed)
    is not in ``rows``, plus ``rows``, sorted by variant (in ``order``) and key; written back and returned."""
    path = out_dir / f"pretraining_objectives_{name}.csv"
    header, n_key = HEADERS[name], 3 if name == "sweep" else 2
    rows = [tuple(str(x) for x in row) for row in rows]
    rerun = {row[:n_key] for row in rows}
    if path.exists():
        with path.open() as f:
            old = [tuple(r) for r in csv.reader(f)]
        if old and list(old[0]) != header:
            raise ValueError(f"{path} has the columns {old[0]}, not {header}: move it away to start afresh")
        old = old[1:]
        rows = [r for r in old if r[:n_key] not in rerun] + rows
    rows.sort(key=lambda r: (order.index(r[0]), *(float(x) for x in r[1:n_key])))
    write_csv(path, header, rows)
    return [dict(zip(header, r)) for r in rows]


def write_summary(out_dir: Path, files: dict[str, list[dict]], random_cpu: dict, last_run: dict) -> None:
    """``pretraining_objectives.json`` from the merged result files (and the previous summary's CPU times of
    the random-init controls that this run did not redo)."""
    path = out_dir / "pretraining_objectives.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    random_cpu = {**previous.get("random_init_cpu_seconds", {}), **random_cpu}
    try:
        lrs = select_lrs(files["sweep"])
    except ValueError:
        lrs = None
    cpu = {"sweep": sum(float(r["cpu_seconds"]) for r in files["sweep"]),
           "pretrain": sum(float(r["pretrain_cpu_seconds"]) for r in files["runs"]),
           "downstream": sum(float(r["downstream_cpu_seconds"]) for r in files["runs"]),
           "random_init": sum(random_cpu.values())}
    num_noise, num_spans = t5_span_counts(T5_WORDS, 0.15, 3.0)
    ctx = CONTEXT
    summary = {
        "variants": {name: description for name, (_, description) in ctx["variants"].items()},
        "random_init": RANDOM_INIT,
        "experiments": EXPERIMENTS,
        "zero_shot": list(ZERO_SHOT),
        "lr": lrs,
        "sweep": {"lrs": list(SWEEP_LRS), "seeds": sorted({int(r["seed"]) for r in files["sweep"]}),
                  "swept": list(SWEPT), "lr_from": LR_FROM, "fixed": FIXED_LR,
                  "selection": "lowest mean held-out pretraining loss over the sweep seeds (ELECTRA: the total "
                               "loss L_MLM + 50 L_RTD)"},
        "steps": ctx["steps"], "flops_per_step": ctx["flops"], "budget_flops": ctx["budget"],
        "settings": {"window": WINDOW, "t5_words": T5_WORDS, "segment": SEGMENT, "vocab": VOCAB,
                     "d_model": D_MODEL, "n_layers": N_LAYERS, "n_heads": N_HEADS,
                     "generator_d_model": GENERATOR_D_MODEL, "batch": BATCH, "warmup": WARMUP,
                     "budget_clm_steps": round(ctx["budget"] / ctx["flops"]["clm"]), "electra_weight": ELECTRA_WEIGHT,
                     "t5_num_noise": num_noise, "t5_num_spans": num_spans, "heldout_batches": HELDOUT_BATCHES,
                     "topics": TOPICS, "topic_share": TOPIC_SHARE, "doc_words": DOC_WORDS, "train_docs": TRAIN_DOCS,
                     "train_words": len(ctx["data"]), "nsp_pairs": len(ctx["pairs"]["labels"]),
                     "nsp_notnext_fraction": ctx["pairs"]["labels"].double().mean().item(),
                     "tag_train_windows": TAG_TRAIN, "gram_train_windows": GRAM_TRAIN, "test_windows": N_TEST,
                     "zero_shot_train_windows": ZERO_SHOT_TRAIN, "ft_steps": FT_STEPS, "ft_batch": FT_BATCH,
                     "ft_lr": FT_LR, "ft_warmup": FT_WARMUP},
        "seeds": sorted({int(r["seed"]) for r in files["runs"]}),
        "baselines": task_baselines(ctx["grammar"], ctx["tasks"]),
        "cpu_seconds": {k: round(v, 1) for k, v in cpu.items()},
        "total_cpu_seconds": round(sum(cpu.values()), 1),
        "random_init_cpu_seconds": random_cpu,
        "last_run": last_run,
    }
    path.write_text(json.dumps(summary, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("sweep", "main", "all"), default="all",
                        help="the learning-rate sweep, the main runs (at the rates the sweep file selects), or both")
    parser.add_argument("--seeds", nargs="+", type=int, default=MODEL_SEEDS, help="model seeds of the main runs")
    parser.add_argument("--sweep-seeds", nargs="+", type=int, default=SWEEP_SEEDS, help="seeds of the sweep")
    parser.add_argument("--only", nargs="+", choices=[*make_objectives(None, {}), *RANDOM_INIT], default=(),
                        help="run only these variants (and random-init controls) and merge them into the files")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one thread each)")
    parser.add_argument("--budget", type=int, default=BUDGET_CLM_STEPS,
                        help="compute budget in causal-LM steps (smaller only for a smoke test, with --out)")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="folder of the result files")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    CONTEXT.update(build_context(args.budget))
    print("steps at equal compute:", CONTEXT["steps"], flush=True)
    order = [*CONTEXT["variants"], *RANDOM_INIT]
    chosen = set(args.only or order)
    lock = open(Path(tempfile.gettempdir()) / "llmarch-pretraining-objectives.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)   # released between the merges, while this process computes
    files = {name: merge_file(args.out, name, [], order) for name in HEADERS}
    fcntl.flock(lock, fcntl.LOCK_UN)
    random_cpu = {}
    last_run = {"phase": args.phase, "seeds": list(args.seeds), "sweep_seeds": list(args.sweep_seeds),
                "only": list(args.only), "jobs": args.jobs}

    def run_and_merge(items):  # each item's rows are merged into the files as soon as it finishes
        for output in run_items(items, args.jobs):
            random_cpu.update(output.get("random_cpu", {}))
            fcntl.flock(lock, fcntl.LOCK_EX)
            for name in HEADERS:
                files[name] = merge_file(args.out, name, output.get(name, []), order)
            write_summary(args.out, files, random_cpu, last_run)
            fcntl.flock(lock, fcntl.LOCK_UN)

    if args.phase in ("sweep", "all"):
        run_and_merge([("sweep", name, seed, lr) for seed in args.sweep_seeds for name in SWEPT
                       if name in chosen for lr in SWEEP_LRS])
    if args.phase in ("main", "all"):
        lrs = select_lrs(files["sweep"])
        print("learning rates:", lrs, flush=True)
        run_and_merge([(kind, name, seed, lrs.get(name)) for seed in args.seeds
                       for kind, names in (("random", RANDOM_INIT), ("main", CONTEXT["variants"]))
                       for name in names if name in chosen])
    fcntl.flock(lock, fcntl.LOCK_EX)
    files = {name: merge_file(args.out, name, [], order) for name in HEADERS}
    write_summary(args.out, files, random_cpu, {**last_run, "wall_seconds": round(time.perf_counter() - start, 1)})
    fcntl.flock(lock, fcntl.LOCK_UN)
    print(f"done in {time.perf_counter() - start:.0f} s; results in {args.out}")


if __name__ == "__main__":
    main()
