"""Pretraining objectives in miniature: causal LM, MLM, span corruption, masking rates, NSP and ELECTRA.

Book: Pretraining objectives, "Experiments". Regenerate the files with ``make experiments`` (or
``nice .venv/bin/python book/experiments/pretraining_objectives.py``; one thread, about 20 CPU-minutes).
Everything is seeded, and a rerun on the same machine and thread count reproduces the losses (the T5 runs
that t5_diagnostics.py retrains match the committed ones to four decimals). Across machines the runs are not
bit-reproducible (reductions run in another order), and a run can end far from its committed value: a rerun
of T5 seed 0 elsewhere ended at 1.354 instead of 1.462, as far as the spread between seeds. Compare means over
seeds, not single runs.

Corpus: ``TRAIN_DOCS`` documents of about ``DOC_WORDS`` words, each written by the course's grammar with one of
three topics (:func:`topic_grammar`: a pair of nouns gets 80% of the noun probability; states and transitions
are unchanged). Every model (width 64, 4 heads, 2 layers; the encoder-decoder 2 + 2) reads ``[CLS]`` and 31
words. Each variant (``make_objectives``) is trained for the number of steps that spends the FLOPs of
``BUDGET_CLM_STEPS`` steps of the causal LM; a step's FLOPs are measured with ``FlopCounterMode`` (forward and
backward matrix products). Three model seeds.

Downstream, on held-out documents (:func:`build_tasks`): tagging every word with the grammar state that
emitted it, and grammaticality after one random edit, both labelled exactly from the grammar. Each pretrained
model (and each architecture with random weights) is scored by a linear probe on frozen features, by full
fine-tuning, and (for ``ZERO_SHOT`` variants, grammaticality only) by its pretraining head with one threshold.

Writes, under ``book/data/`` next to this script's folder:

- ``pretraining_objectives_runs.csv``: variant, seed, steps, corpus_words, flops_per_step, train_flops,
  n_parameters (trained), n_parameters_backbone (used downstream), final_train_loss (mean of the last 10% of
  the steps), mlm_loss_15 and mlm_loss_own_rate (held-out MLM loss with 15% / the variant's own rate
  selected; MLM variants only, on held-out pairs for the pair variants), nsp_accuracy, CPU seconds;
- ``pretraining_objectives_downstream.csv``: variant, seed, task, method (probe, finetune, zero_shot),
  accuracy;
- ``pretraining_objectives_curves.csv``: variant, seed, step, loss (mean over the last ``CURVE_EVERY`` steps),
  and for ELECTRA its generator's MLM loss, the discriminator's loss and the fraction of replaced words;
- ``pretraining_objectives.json``: the variants, the experiments that compare them, the steps and FLOPs, the
  settings, the task baselines and the run time.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from llmarch.data import StochasticGrammar, default_grammar, get_batch
from llmarch.model import (BertClassificationHead, BertConfig, BertEncoder, BertForMaskedLM, EncoderDecoder,
                           EncoderDecoderConfig, GPT, GPTConfig, count_parameters, shift_right)
from llmarch.objectives import (IGNORE_INDEX, electra_corrupt, mlm_loss, mlm_mask, nsp_pairs, t5_span_counts,
                                t5_span_corruption)
from llmarch.train import warmup_cosine_lr
from tiny_gpt import labelled_transitions, write_csv  # sibling script (this folder is on sys.path when run)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# The corpus: documents of DOC_WORDS words (cut after the last full stop), each from one topic grammar.
TOPICS = (("cat", "cats", "dog", "dogs"), ("bird", "birds", "robot", "robots"),
          ("child", "children", "teacher", "teachers"))
TOPIC_SHARE = 0.8
DOC_WORDS, TRAIN_DOCS, HELDOUT_DOCS = 300, 3000, 1500
TRAIN_SEED, HELDOUT_SEED, TASK_SEED = 0, 1, 2
# Token ids: the grammar's 36 words, then the special tokens.
N_WORDS = 36
CLS, SEP, MASK = 36, 37, 38
SENTINELS = tuple(range(39, 47))
VOCAB = 47
WINDOW = 31              # corpus words per example; every model reads [CLS] + WINDOW = 32 tokens
SEGMENT = 14             # NSP: [CLS] A(14) [SEP] B(14) [SEP] = 31 tokens
# Models: width 64, 2 layers, 4 heads (the encoder-decoder has 2 + 2 layers); ELECTRA's generator is narrower.
D_MODEL, N_LAYERS, N_HEADS = 64, 2, 4
GENERATOR_D_MODEL, GENERATOR_HEADS = 32, 2
# Pretraining: AdamW, warm-up and cosine decay; the compute budget is BUDGET_CLM_STEPS steps of the causal LM.
BATCH, LR, WARMUP, BUDGET_CLM_STEPS = 32, 3e-3, 50, 1500
CURVE_EVERY = 50         # learning curves: mean training loss over every 50 steps
MODEL_SEEDS = (0, 1, 2)
MASK_RATES = (0.05, 0.15, 0.40, 0.80)
ELECTRA_WEIGHT = 50.0    # lambda of Clark et al. (2020): L = L_MLM(generator) + lambda L_RTD(discriminator)
# Downstream tasks (labels from the grammar; see `build_tasks`).
TAG_TRAIN, GRAM_TRAIN, N_TEST = 32, 2048, 1024
ZERO_SHOT_TRAIN = 512    # training windows used to fit the zero-shot threshold
FT_STEPS, FT_BATCH, FT_LR, FT_WARMUP = 200, 32, 1e-3, 20
IGNORE = IGNORE_INDEX


# --------------------------------------------------------------------------------------------------------------
# The corpus: documents, each written by the grammar with a topic
# --------------------------------------------------------------------------------------------------------------

def topic_grammar(grammar: StochasticGrammar, topic_words: set[str], share: float) -> StochasticGrammar:
    """The same grammar (states, words, transitions) with a *topic*: in every state, the words that lead to
    the same next state share their total probability so that those in ``topic_words`` get ``share`` of it
    (equally), the others ``1 - share`` (equally). Groups with no topic word, or only topic words, keep their
    probabilities. The state chain, hence every grammaticality and state label, is unchanged.

    Example: in state ``NP_SG`` the six singular nouns (0.7 in all) lead to ``VP_SG``; with topic
    ``{"cat", "dog"}`` and ``share=0.8`` each of cat, dog gets 0.28 and each other noun 0.035.
    """
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    unknown = set(topic_words) - set(grammar.vocab)
    if unknown:
        raise ValueError(f"topic words {sorted(unknown)} are not in the grammar's vocabulary")
    rules = {}
    for state, options in grammar.rules.items():
        new = []
        for nxt in dict.fromkeys(n for _, n, _ in options):
            group = [(w, p) for w, n, p in options if n == nxt]
            mass = sum(p for _, p in group)
            in_topic = [w for w, _ in group if w in topic_words]
            if not in_topic or len(in_topic) == len(group):
                new += [(w, nxt, p) for w, p in group]
                continue
            n_out = len(group) - len(in_topic)
            new += [(w, nxt, mass * (share / len(in_topic) if w in topic_words else (1 - share) / n_out))
                    for w, _ in group]
        rules[state] = new
    return StochasticGrammar(rules, start=grammar.start)


def sample_document(grammar: StochasticGrammar, n_words: int, seed: int) -> list[str]:
    """Whole sentences from the start state: ``n_words`` sampled words cut after the last full stop."""
    words = grammar.sample(n_words, seed=seed)
    if "." not in words:
        raise ValueError(f"{n_words} words from seed {seed} hold no complete sentence; sample more words")
    return words[: len(words) - words[::-1].index(".")]


# --------------------------------------------------------------------------------------------------------------
# Labels the grammar defines exactly
# --------------------------------------------------------------------------------------------------------------

def _support(grammar: StochasticGrammar) -> np.ndarray:
    """``A[w, s, s'] = True`` iff word ``w`` can take state ``s`` to ``s'`` (the support of the rules)."""
    transitions, _ = labelled_transitions(grammar)
    return transitions > 0


def emitting_states(grammar: StochasticGrammar, ids: np.ndarray) -> np.ndarray:
    """For each position ``t`` of each window ``ids (N, T)``: the index (in ``grammar.rules`` order) of the state
    that emitted word ``t``, if the words ``0..t`` determine it, else ``-1``.

    The window may start anywhere in the text, so the state before word 0 is unknown: the set of possible
    states starts as all states, ``C_0``. The states that can emit word ``t`` are ``E_t = {s in C_t : p(w_t|s) >
    0}`` and ``C_{t+1} = {next(s, w_t) : s in E_t}``. The label is defined where ``|E_t| = 1``: the state is then a
    function of the words a causal model has seen at ``t``, so a causal and a bidirectional model can both
    reach 100%. Raises ``ValueError`` if a window is impossible under the grammar (some ``E_t`` empty).
    """
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids has shape {ids.shape} but must be (N, T)")
    support = _support(grammar)
    n, t_len = ids.shape
    possible = np.ones((n, support.shape[1]), dtype=bool)
    labels = np.full((n, t_len), -1)
    for t in range(t_len):
        step = support[ids[:, t]]                               # (N, S, S')
        emitters = possible & step.any(axis=2)                  # E_t
        if not emitters.any(axis=1).all():
            bad = int(np.flatnonzero(~emitters.any(axis=1))[0])
            raise ValueError(f"window {bad} is impossible under the grammar at position {t}")
        single = emitters.sum(axis=1) == 1
        labels[single, t] = emitters[single].argmax(axis=1)
        possible = (emitters[:, :, None] & step).any(axis=1)    # C_{t+1}
    return labels


def is_grammatical(grammar: StochasticGrammar, ids: np.ndarray) -> np.ndarray:
    """``(N,)`` booleans: window ``i`` of ``ids (N, T)`` has non-zero probability under the grammar started in
    some state (every state has positive stationary probability, the chain being irreducible), i.e. the
    set of possible states ``C_t`` of :func:`emitting_states` never becomes empty."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids has shape {ids.shape} but must be (N, T)")
    support = _support(grammar)
    possible = np.ones((len(ids), support.shape[1]), dtype=bool)
    for t in range(ids.shape[1]):
        possible = (possible[:, :, None] & support[ids[:, t]]).any(axis=1)
    return possible.any(axis=1)


def random_edit(ids: np.ndarray, vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """One random edit per window of ``ids (N, T)``: with probability 1/2 swap two neighbouring words that
    differ, otherwise replace one word by a different word drawn uniformly from the vocabulary."""
    ids = np.array(ids, copy=True)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids has shape {ids.shape} but must be (N, T) with T >= 2")
    for row in ids:
        if rng.random() < 0.5:
            candidates = np.flatnonzero(row[:-1] != row[1:])
            if len(candidates):
                i = rng.choice(candidates)
                row[i], row[i + 1] = row[i + 1], row[i]
                continue
        i = rng.integers(len(row))
        row[i] = (row[i] + rng.integers(1, vocab_size)) % vocab_size
    return ids


def balanced_grammaticality_set(grammar: StochasticGrammar, stream: np.ndarray, n: int, window: int,
                                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` edited windows of ``window`` words from ``stream``, half still grammatical (label 1), half not
    (label 0), in random order. Random edits break the grammar most of the time, so windows are edited
    until each class has ``n // 2``."""
    if n % 2:
        raise ValueError(f"n must be even to balance the two classes, got {n}")
    kept = {0: [], 1: []}
    while min(len(kept[0]), len(kept[1])) < n // 2:
        starts = rng.integers(0, len(stream) - window, size=4 * n)
        edited = random_edit(stream[starts[:, None] + np.arange(window)], grammar.vocab_size, rng)
        for row, label in zip(edited, is_grammatical(grammar, edited).astype(int)):
            kept[label].append(row)
    ids = np.stack(kept[0][: n // 2] + kept[1][: n // 2])
    labels = np.repeat([0, 1], n // 2)
    order = rng.permutation(n)
    return ids[order], labels[order]


# --------------------------------------------------------------------------------------------------------------
# Downstream evaluation: linear probing of frozen features, and full fine-tuning
# --------------------------------------------------------------------------------------------------------------

def fit_logistic_regression(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float = 1e-3,
                            max_iter: int = 200) -> nn.Linear:
    """Multinomial logistic regression ``p(y | x) = softmax(W z + b)`` on standardised features ``z`` (the
    mean and standard deviation of the training features are folded into the returned layer), fit by L-BFGS
    on the mean cross-entropy plus ``l2 * ||W||^2``. ``x (N, d)`` float, ``y (N,)`` long."""
    if x.dim() != 2 or y.shape != x.shape[:1]:
        raise ValueError(f"x has shape {tuple(x.shape)} and y {tuple(y.shape)}: expected (N, d) and (N,)")
    x = x.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    layer = nn.Linear(x.shape[1], n_classes).double()
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    optimizer = torch.optim.LBFGS(layer.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(layer(z), y) + l2 * layer.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():  # fold the standardisation in: W ((x - m) / s) + b = (W / s) x + (b - W (m / s))
        weight = layer.weight / std
        layer.bias -= (layer.weight * (mean / std)).sum(1)
        layer.weight.copy_(weight)
    return layer.float()


class Classifier(nn.Module):
    """A linear head on a pretrained backbone (``ids (B, T) -> hidden states (B, T, d)``): per token
    (``pooled=False``, logits ``(B, T, C)``) or on the mean of the hidden states over the positions
    (``pooled=True``, logits ``(B, C)``)."""

    def __init__(self, backbone: nn.Module, d_model: int, n_classes: int, pooled: bool):
        super().__init__()
        self.backbone, self.pooled = backbone, pooled
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.backbone(ids)
        return self.head(h.mean(dim=1) if self.pooled else h)


@torch.no_grad()
def frozen_features(backbone: nn.Module, ids: torch.Tensor, pooled: bool, batch_size: int = 256) -> torch.Tensor:
    """Hidden states of a frozen backbone: ``(N, T, d)``, or their mean over positions ``(N, d)``."""
    backbone.eval()
    out = [backbone(ids[i: i + batch_size]) for i in range(0, len(ids), batch_size)]
    h = torch.cat(out)
    return h.mean(dim=1) if pooled else h


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of labelled items (label != -100) whose arg-max class is the label."""
    keep = labels != IGNORE
    return (logits.argmax(-1)[keep] == labels[keep]).double().mean().item()


def linear_probe(backbone: nn.Module, task: dict, pooled: bool) -> float:
    """Feature-based transfer: logistic regression on frozen features; test accuracy."""
    def flat(ids, labels):
        h = frozen_features(backbone, ids, pooled)
        if pooled:
            return h, labels
        keep = labels != IGNORE
        return h[keep], labels[keep]

    x, y = flat(task["train_ids"], task["train_labels"])
    layer = fit_logistic_regression(x, y, task["n_classes"])
    x_test, y_test = flat(task["test_ids"], task["test_labels"])
    with torch.no_grad():
        return accuracy(layer(x_test), y_test)


def fine_tune(backbone: nn.Module, d_model: int, task: dict, pooled: bool, seed: int) -> float:
    """Full fine-tuning of a copy of ``backbone`` with a new linear head (AdamW, warm-up and cosine decay,
    ``FT_STEPS`` steps of ``FT_BATCH`` examples); test accuracy."""
    torch.manual_seed(seed)
    model = Classifier(copy.deepcopy(backbone), d_model, task["n_classes"], pooled)
    generator = torch.Generator().manual_seed(seed)
    optimizer = adamw(model, FT_LR)
    model.train()
    ids, labels = task["train_ids"], task["train_labels"]
    for step in range(FT_STEPS):
        set_lr(optimizer, warmup_cosine_lr(step, FT_LR, FT_WARMUP, FT_STEPS))
        rows = torch.randint(len(ids), (FT_BATCH,), generator=generator)
        logits = model(ids[rows])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[rows].reshape(-1), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return accuracy(model(task["test_ids"]), task["test_labels"])


def adamw(model: nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW as ``llmarch.train.train`` sets it up: weight decay 0.1 on matrices only, betas (0.9, 0.95)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# --------------------------------------------------------------------------------------------------------------
# Corpus and tasks
# --------------------------------------------------------------------------------------------------------------

def sample_corpus(grammar: StochasticGrammar, n_docs: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``n_docs`` documents (token-id arrays), each from the topic grammar of a uniformly drawn topic, and their
    topics."""
    grammars = [topic_grammar(grammar, set(words), TOPIC_SHARE) for words in TOPICS]
    topics = np.random.default_rng(seed).integers(len(TOPICS), size=n_docs)
    docs = [grammar.encode(sample_document(grammars[k], DOC_WORDS, seed * 1_000_000 + i)).numpy()
            for i, k in enumerate(topics)]
    return docs, topics


def with_cls(windows) -> torch.Tensor:
    """``(N, WINDOW)`` word ids -> ``(N, WINDOW + 1)`` model inputs with [CLS] first."""
    windows = torch.as_tensor(np.asarray(windows), dtype=torch.long)
    return torch.cat([torch.full((len(windows), 1), CLS), windows], dim=1)


def build_tasks(grammar: StochasticGrammar, stream: np.ndarray, rng: np.random.Generator) -> dict:
    """The two downstream tasks, on held-out text. Inputs are ``[CLS] + WINDOW`` words, like pretraining's.

    - ``tagging``: for every word, the grammar state that emitted it (13 classes), where the words so far
      determine it (:func:`emitting_states`; -100 elsewhere: 4% of the words, near the start of a window). Few labels:
      ``TAG_TRAIN`` windows (about 1,000 labelled words) to train, ``N_TEST`` windows to test.
    - ``grammaticality``: after one random edit (:func:`random_edit`), is the window still possible under the
      grammar? Balanced, ``GRAM_TRAIN`` windows to train, ``N_TEST`` to test.
    """
    n = len(stream) // WINDOW
    windows = stream[: n * WINDOW].reshape(n, WINDOW)[rng.permutation(n)[: TAG_TRAIN + N_TEST]]
    states = emitting_states(grammar, windows)
    tags = torch.cat([torch.full((len(states), 1), IGNORE), torch.as_tensor(np.where(states < 0, IGNORE, states))], 1)
    ids, labels = balanced_grammaticality_set(grammar, stream, GRAM_TRAIN + N_TEST, WINDOW, rng)
    return {
        "tagging": {"train_ids": with_cls(windows[:TAG_TRAIN]), "train_labels": tags[:TAG_TRAIN],
                    "test_ids": with_cls(windows[TAG_TRAIN:]), "test_labels": tags[TAG_TRAIN:],
                    "n_classes": len(grammar.rules), "pooled": False},
        "grammaticality": {"train_ids": with_cls(ids[:GRAM_TRAIN]), "train_labels": torch.as_tensor(labels[:GRAM_TRAIN]),
                           "test_ids": with_cls(ids[GRAM_TRAIN:]), "test_labels": torch.as_tensor(labels[GRAM_TRAIN:]),
                           "n_classes": 2, "pooled": True},
    }


def task_baselines(grammar: StochasticGrammar, tasks: dict) -> dict:
    """Reference accuracies on the test sets: the majority class, and for tagging the best rule that sees only
    the word itself (each word's most frequent state, counted on the test set: an upper bound for any
    word-by-word rule)."""
    tag = tasks["tagging"]
    keep = tag["test_labels"] != IGNORE
    words, states = tag["test_ids"][keep].numpy(), tag["test_labels"][keep].numpy()
    counts = np.zeros((VOCAB, len(grammar.rules)))
    np.add.at(counts, (words, states), 1)
    gram = tasks["grammaticality"]["test_labels"].numpy()
    return {
        "tagging": {"majority": float(np.bincount(states).max() / len(states)),
                    "word_only": float(counts.max(axis=1).sum() / len(states)),
                    "labelled_train_words": int((tag["train_labels"] != IGNORE).sum()),
                    "labelled_fraction": float(keep[:, 1:].double().mean())},
        "grammaticality": {"majority": float(max(gram.mean(), 1 - gram.mean()))},
    }


# --------------------------------------------------------------------------------------------------------------
# The objectives. Each holds the modules it trains, samples its own batches, and exposes the encoder whose
# features the downstream tasks use (``backbone``: ids (B, T) -> hidden states (B, T, D_MODEL)).
# --------------------------------------------------------------------------------------------------------------

class Backbone(nn.Module):
    """``ids -> getattr(model, method)(ids)``: the hidden states a pretrained model offers downstream."""

    def __init__(self, model: nn.Module, method: str):
        super().__init__()
        self.model, self.method = model, method

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.method)(ids)


def bert_config(d_model: int = D_MODEL, n_heads: int = N_HEADS) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, d_model=d_model, n_layers=N_LAYERS, n_heads=n_heads,
                      max_position_embeddings=WINDOW + 1, pad_token_id=None)


def encoder_decoder(n_decoder_layers: int) -> EncoderDecoder:
    return EncoderDecoder(EncoderDecoderConfig(
        vocab_size=VOCAB, max_source_length=WINDOW + 1, max_target_length=WINDOW + 1, d_model=D_MODEL,
        n_encoder_layers=N_LAYERS, n_decoder_layers=n_decoder_layers, n_heads=N_HEADS, decoder_start_token_id=CLS))


def special_positions(ids: torch.Tensor) -> torch.Tensor:
    """True at [CLS] and [SEP], which are never masked."""
    return (ids == CLS) | (ids == SEP)


class CausalLM(nn.Module):
    """GPT: next-token prediction on ``[CLS] + 31`` words; every word is a target (the first given [CLS] only)."""

    family = "decoder"

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data
        self.gpt = GPT(GPTConfig(vocab_size=VOCAB, context_length=WINDOW + 1, d_model=D_MODEL, n_layers=N_LAYERS,
                                 n_heads=N_HEADS))

    def loss(self, generator):
        ids = with_cls(get_batch(self.data, BATCH, WINDOW, generator)[0])
        logits = self.gpt(ids)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def backbone(self) -> nn.Module:
        return Backbone(self.gpt, "features")

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``log p(w_t | [CLS], w_1 .. w_{t-1})`` for each word: ``(N, WINDOW)``."""
        log_probs = torch.log_softmax(self.gpt(ids)[:, :-1], dim=-1)
        return log_probs.gather(-1, ids[:, 1:, None])[..., 0]


class MaskedLM(nn.Module):
    """MLM with ``mask_prob`` and 80/10/10 on ``[CLS] + 31`` words (or on NSP pairs, see :class:`NextSentence`);
    the loss covers the selected words only (``mlm_loss``). The encoder is BERT's (post-LN, with BERT's MLM
    head), or with ``pre_ln=True`` the pre-LN encoder of :class:`llmarch.model.EncoderDecoder` with its tied
    output layer as the MLM head (its decoder is frozen and never run): a control for the norm placement."""

    family = "encoder"

    def __init__(self, data: torch.Tensor | None, mask_prob: float = 0.15, pre_ln: bool = False):
        super().__init__()
        self.data, self.mask_prob, self.pre_ln = data, mask_prob, pre_ln
        if pre_ln:
            self.encoder = encoder_decoder(n_decoder_layers=1)
            for block in self.encoder.decoder_blocks:
                block.requires_grad_(False)
            self.encoder.tgt_pos_emb.requires_grad_(False)
            self.encoder.decoder_norm.requires_grad_(False)
        else:
            self.bert = BertForMaskedLM(bert_config())

    def hidden(self, ids: torch.Tensor, token_type_ids=None) -> torch.Tensor:
        return self.encoder.encode(ids) if self.pre_ln else self.bert.encode(ids, token_type_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.encoder.lm_head(hidden) if self.pre_ln else self.bert.mlm_logits(hidden)

    def mlm(self, ids: torch.Tensor, generator, mask_prob: float, token_type_ids=None):
        inputs, labels = mlm_mask(ids, MASK, VOCAB, special_positions(ids), mask_prob, generator)
        if not (labels != IGNORE).any():  # a 5% rate can select nothing in a tiny batch: keep one target
            labels[0, 1] = ids[0, 1]
        hidden = self.hidden(inputs, token_type_ids)
        return mlm_loss(self.logits(hidden), labels), hidden

    def loss(self, generator):
        ids = with_cls(get_batch(self.data, BATCH, WINDOW, generator)[0])
        return self.mlm(ids, generator, self.mask_prob)[0]

    def backbone(self) -> nn.Module:
        return Backbone(self.encoder, "encode") if self.pre_ln else Backbone(self.bert, "encode")

    @torch.no_grad()
    def eval_mlm_loss(self, ids: torch.Tensor, mask_prob: float, seed: int, token_type_ids=None) -> float:
        """MLM loss on held-out ``ids`` with a fixed mask (``seed``)."""
        generator = torch.Generator().manual_seed(seed)
        return self.mlm(ids, generator, mask_prob, token_type_ids)[0].item()

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """Pseudo-log-likelihood terms: ``log p(w_t | all other words)``, with ``w_t`` alone replaced by [MASK]."""
        out = []
        for t in range(1, ids.shape[1]):
            masked = ids.clone()
            masked[:, t] = MASK
            log_probs = torch.log_softmax(self.logits(self.hidden(masked))[:, t], dim=-1)
            out.append(log_probs.gather(-1, ids[:, t, None])[:, 0])
        return torch.stack(out, dim=1)


class NextSentence(MaskedLM):
    """BERT's input format, ``[CLS] A [SEP] B [SEP]`` with segment embeddings (``pairs`` from ``nsp_pairs``),
    with the MLM loss plus, if ``with_nsp``, the next-sentence loss on [CLS] (BERT), or MLM alone."""

    def __init__(self, pairs: dict, with_nsp: bool):
        super().__init__(data=None)
        self.pairs, self.with_nsp = pairs, with_nsp
        self.nsp_head = BertClassificationHead(bert_config(), num_labels=2) if with_nsp else None

    def loss(self, generator):
        rows = torch.randint(len(self.pairs["input_ids"]), (BATCH,), generator=generator)
        ids, types = self.pairs["input_ids"][rows], self.pairs["token_type_ids"][rows]
        loss, hidden = self.mlm(ids, generator, self.mask_prob, types)
        if self.with_nsp:
            loss = loss + F.cross_entropy(self.nsp_head(hidden), self.pairs["labels"][rows])
        return loss

    @torch.no_grad()
    def nsp_accuracy(self, pairs: dict) -> float:
        hidden = self.bert.encode(pairs["input_ids"], pairs["token_type_ids"])
        return accuracy(self.nsp_head(hidden), pairs["labels"])


class SpanCorruption(nn.Module):
    """T5: span corruption (15% noise, mean span 3) of the 31 words; the encoder reads ``[CLS] + corrupted``
    words, the decoder predicts the sentinel-delimited spans. 2 encoder + 2 decoder layers."""

    family = "encoder-decoder"

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data
        self.t5 = encoder_decoder(n_decoder_layers=N_LAYERS)

    def loss(self, generator):
        words = get_batch(self.data, BATCH, WINDOW, generator)[0]
        inputs, targets = t5_span_corruption(words, 0.15, 3.0, SENTINELS, generator)
        logits = self.t5(with_cls(inputs), shift_right(targets, CLS))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    def backbone(self) -> nn.Module:
        return Backbone(self.t5, "encode")

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``log p(w_t | all other words)``: ``w_t`` alone is the noise span, target ``<S0> w_t``."""
        decoder_in = torch.tensor([[CLS, SENTINELS[0]]]).expand(len(ids), 2)
        out = []
        for t in range(1, ids.shape[1]):
            source = ids.clone()
            source[:, t] = SENTINELS[0]
            out.append(torch.log_softmax(self.t5(source, decoder_in)[:, 1], dim=-1).gather(-1, ids[:, t, None])[:, 0])
        return torch.stack(out, dim=1)


class Electra(nn.Module):
    """ELECTRA: a small MLM generator (width 32) fills the [MASK]s of 15% of the words with samples; the
    discriminator (the BERT-size encoder) labels every word as original or replaced. Loss
    ``L_MLM + ELECTRA_WEIGHT * L_RTD``; the generator gets no gradient from the discriminator."""

    family = "encoder"

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data
        self.generator_model = BertForMaskedLM(bert_config(GENERATOR_D_MODEL, GENERATOR_HEADS))
        self.discriminator = BertEncoder(bert_config())
        self.rtd_head = nn.Linear(D_MODEL, 1)

    def loss(self, generator):
        ids = with_cls(get_batch(self.data, BATCH, WINDOW, generator)[0])
        inputs, labels = mlm_mask(ids, MASK, VOCAB, special_positions(ids), 0.15, generator,
                                  mask_replace_prob=1.0, random_replace_prob=0.0)
        generator_logits = self.generator_model(inputs)
        corrupted, replaced = electra_corrupt(ids, labels, generator_logits, generator)
        rtd_logits = self.rtd_head(self.discriminator(corrupted))[..., 0]
        words = ~special_positions(ids)
        rtd = F.binary_cross_entropy_with_logits(rtd_logits[words], replaced[words].float())
        generator_loss = mlm_loss(generator_logits, labels)
        self.parts = {"generator_mlm": generator_loss.item(), "rtd": rtd.item(),
                      "replaced_fraction": replaced[words].double().mean().item()}
        return generator_loss + ELECTRA_WEIGHT * rtd

    def backbone(self) -> nn.Module:
        return self.discriminator

    @torch.no_grad()
    def word_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``log p(original)`` of each word according to the discriminator: ``log sigmoid(-logit)``."""
        return F.logsigmoid(-self.rtd_head(self.discriminator(ids))[:, 1:, 0])


# --------------------------------------------------------------------------------------------------------------
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


def pretrain(objective: nn.Module, steps: int, seed: int) -> dict:
    """``steps`` AdamW steps (warm-up, cosine decay) on ``objective.loss``. Returns the mean loss of the last
    10% of the steps, the CPU seconds, and the learning curve: the mean loss (and the mean of each part an
    objective reports in ``objective.parts``) over every ``CURVE_EVERY`` steps."""
    start = time.process_time()
    generator = torch.Generator().manual_seed(seed)
    optimizer = adamw(objective, LR)
    objective.train()
    losses, parts, curve = [], defaultdict(list), []
    for step in range(steps):
        set_lr(optimizer, warmup_cosine_lr(step, LR, WARMUP, steps))
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
        "mlm": (lambda: MaskedLM(data, 0.15), "MLM 15% (BERT)"),
        "t5": (lambda: SpanCorruption(data), "span corruption (T5, encoder-decoder)"),
        "mlm_preln": (lambda: MaskedLM(data, 0.15, pre_ln=True), "MLM 15% on the pre-LN encoder of the encoder-decoder"),
        "electra": (lambda: Electra(data), "replaced-token detection (ELECTRA)"),
        "nsp": (lambda: NextSentence(pairs, with_nsp=True), "MLM + NSP on segment pairs (BERT)"),
        "pairs": (lambda: NextSentence(pairs, with_nsp=False), "MLM on segment pairs, no NSP"),
    }
    for rate in MASK_RATES:
        if rate != 0.15:
            variants[f"mlm_{round(rate * 100)}"] = (lambda r=rate: MaskedLM(data, r), f"MLM {rate:.0%}")
    return variants


EXPERIMENTS = {
    "objectives": ["clm", "mlm", "mlm_preln", "t5"],
    "mask_rate": ["mlm_5", "mlm", "mlm_40", "mlm_80"],
    "nsp": ["nsp", "pairs", "mlm"],
    "electra": ["mlm", "electra"],
}
ZERO_SHOT = ("clm", "mlm", "t5", "electra")
RANDOM_INIT = {"random_decoder": "clm", "random_encoder": "mlm", "random_encoder-decoder": "t5"}


def segment_documents(docs: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Each document cut into consecutive segments of ``SEGMENT`` words (the rest dropped), NSP's units."""
    return [[doc[i: i + SEGMENT] for i in range(0, len(doc) - SEGMENT + 1, SEGMENT)] for doc in docs]


def pair_tensors(docs: list[np.ndarray], seed: int) -> dict:
    examples = nsp_pairs(segment_documents(docs), CLS, SEP, torch.Generator().manual_seed(seed))
    return {"input_ids": torch.stack([e.input_ids for e in examples]),
            "token_type_ids": torch.stack([e.token_type_ids for e in examples]),
            "labels": torch.tensor([e.next_sentence_label for e in examples])}


def evaluate_downstream(objective: nn.Module, tasks: dict, seed: int) -> list[tuple[str, str, float]]:
    backbone = objective.backbone()
    out = []
    for name, task in tasks.items():
        out.append((name, "probe", linear_probe(backbone, task, task["pooled"])))
        out.append((name, "finetune", fine_tune(backbone, D_MODEL, task, task["pooled"], seed)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=len(MODEL_SEEDS), help="number of model seeds (default 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start, cpu_start = time.perf_counter(), time.process_time()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    grammar = default_grammar()
    train_docs, _ = sample_corpus(grammar, TRAIN_DOCS, TRAIN_SEED)
    heldout_docs, _ = sample_corpus(grammar, HELDOUT_DOCS, HELDOUT_SEED)
    data = torch.as_tensor(np.concatenate(train_docs))
    heldout = np.concatenate(heldout_docs)
    pairs, heldout_pairs = pair_tensors(train_docs, TRAIN_SEED), pair_tensors(heldout_docs[:300], HELDOUT_SEED)
    tasks = build_tasks(grammar, heldout, np.random.default_rng(TASK_SEED))
    mlm_eval_ids = tasks["tagging"]["test_ids"]
    variants = make_objectives(data, pairs)

    torch.manual_seed(0)
    flops = {name: flops_per_step(factory()) for name, (factory, _) in variants.items()}
    budget = BUDGET_CLM_STEPS * flops["clm"]
    steps = {name: round(budget / f) for name, f in flops.items()}
    print("steps at equal compute:", steps, flush=True)

    run_rows, downstream_rows, curve_rows = [], [], []
    for seed in MODEL_SEEDS[: args.seeds]:
        for name, family_of in RANDOM_INIT.items():
            torch.manual_seed(seed)
            objective = variants[family_of][0]()
            for task, method, acc in evaluate_downstream(objective, tasks, seed):
                downstream_rows.append((name, seed, task, method, f"{acc:.4f}"))
        for name, (factory, _) in variants.items():
            torch.manual_seed(seed)
            objective = factory()
            result = pretrain(objective, steps[name], seed)
            extra = {}
            if isinstance(objective, NextSentence):  # scored on held-out pairs, the format it was trained on
                for key, rate in (("mlm_loss_15", 0.15), ("mlm_loss_own_rate", objective.mask_prob)):
                    extra[key] = objective.eval_mlm_loss(heldout_pairs["input_ids"], rate, seed,
                                                         heldout_pairs["token_type_ids"])
            elif isinstance(objective, MaskedLM):
                extra["mlm_loss_15"] = objective.eval_mlm_loss(mlm_eval_ids, 0.15, seed)
                extra["mlm_loss_own_rate"] = objective.eval_mlm_loss(mlm_eval_ids, objective.mask_prob, seed)
            if isinstance(objective, NextSentence) and objective.with_nsp:
                extra["nsp_accuracy"] = objective.nsp_accuracy(heldout_pairs)
            t0 = time.process_time()
            results = evaluate_downstream(objective, tasks, seed)
            if name in ZERO_SHOT:
                results.append(("grammaticality", "zero_shot", zero_shot_accuracy(objective, tasks["grammaticality"])))
            for task, method, acc in results:
                downstream_rows.append((name, seed, task, method, f"{acc:.4f}"))
            curve_rows += [(name, seed, point["step"], *(f"{point[k]:.4f}" if k in point else "" for k in
                                                          ("loss", "generator_mlm", "rtd", "replaced_fraction")))
                           for point in result["curve"]]
            run_rows.append((name, seed, steps[name], steps[name] * BATCH * WINDOW, flops[name],
                             steps[name] * flops[name], count_parameters(objective),
                             used_parameters(objective.backbone(), mlm_eval_ids[:2]), f"{result['final_loss']:.4f}",
                             *(f"{extra[k]:.4f}" if k in extra else "" for k in
                               ("mlm_loss_15", "mlm_loss_own_rate", "nsp_accuracy")),
                             f"{result['cpu_seconds']:.1f}", f"{time.process_time() - t0:.1f}"))
            print(f"seed {seed} {name:8s} steps {steps[name]:4d} loss {result['final_loss']:.3f} "
                  + " ".join(f"{k}={v:.3f}" for k, v in extra.items()) + " | "
                  + " ".join(f"{t[:4]}/{m}={a:.3f}" for t, m, a in results)
                  + f" ({result['cpu_seconds']:.0f}+{time.process_time() - t0:.0f} s)", flush=True)

    write_csv(DATA_DIR / "pretraining_objectives_runs.csv",
              ["variant", "seed", "steps", "corpus_words", "flops_per_step", "train_flops", "n_parameters",
               "n_parameters_backbone", "final_train_loss", "mlm_loss_15", "mlm_loss_own_rate", "nsp_accuracy",
               "pretrain_cpu_seconds", "downstream_cpu_seconds"], run_rows)
    write_csv(DATA_DIR / "pretraining_objectives_curves.csv",
              ["variant", "seed", "step", "loss", "generator_mlm", "rtd", "replaced_fraction"], curve_rows)
    write_csv(DATA_DIR / "pretraining_objectives_downstream.csv",
              ["variant", "seed", "task", "method", "accuracy"], downstream_rows)
    num_noise, num_spans = t5_span_counts(WINDOW, 0.15, 3.0)
    summary = {
        "variants": {name: description for name, (_, description) in variants.items()},
        "random_init": RANDOM_INIT,
        "experiments": EXPERIMENTS,
        "zero_shot": list(ZERO_SHOT),
        "steps": steps, "flops_per_step": flops, "budget_flops": budget,
        "settings": {"window": WINDOW, "segment": SEGMENT, "vocab": VOCAB, "d_model": D_MODEL, "n_layers": N_LAYERS,
                     "n_heads": N_HEADS, "generator_d_model": GENERATOR_D_MODEL, "batch": BATCH, "lr": LR,
                     "warmup": WARMUP, "budget_clm_steps": BUDGET_CLM_STEPS, "electra_weight": ELECTRA_WEIGHT,
                     "t5_num_noise": num_noise, "t5_num_spans": num_spans, "topics": TOPICS,
                     "topic_share": TOPIC_SHARE, "doc_words": DOC_WORDS, "train_docs": TRAIN_DOCS,
                     "train_words": len(data), "nsp_pairs": len(pairs["labels"]),
                     "nsp_notnext_fraction": pairs["labels"].double().mean().item(),
                     "tag_train_windows": TAG_TRAIN, "gram_train_windows": GRAM_TRAIN, "test_windows": N_TEST,
                     "zero_shot_train_windows": ZERO_SHOT_TRAIN, "ft_steps": FT_STEPS, "ft_batch": FT_BATCH,
                     "ft_lr": FT_LR, "ft_warmup": FT_WARMUP},
        "seeds": list(MODEL_SEEDS[: args.seeds]),
        "baselines": task_baselines(grammar, tasks),
        "total_seconds": round(time.perf_counter() - start, 1),
        "total_cpu_seconds": round(time.process_time() - cpu_start, 1),
    }
    (DATA_DIR / "pretraining_objectives.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done in {summary['total_cpu_seconds']:.0f} CPU s; results in {DATA_DIR}")


if __name__ == "__main__":
    main()
