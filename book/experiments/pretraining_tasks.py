"""The corpus, the downstream tasks and the transfer methods of the pretraining-objectives experiment.

Book: Pretraining objectives, "Experiments" (run by ``pretraining_objectives.py``, which reads this module).
Documents written by the course's grammar with a topic; the two tasks whose labels the grammar defines
exactly (tagging every word with the state that emitted it, and grammaticality after one random edit); and
the two ways a pretrained backbone is scored on them (a linear probe on frozen features, full fine-tuning).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from llmarch.data import StochasticGrammar
from llmarch.objectives import IGNORE_INDEX
from llmarch.train import warmup_cosine_lr
from tiny_gpt import labelled_transitions  # sibling script (this folder is on sys.path when run)

# The corpus: documents of DOC_WORDS words (cut after the last full stop), each from one topic grammar.
TOPICS = (("cat", "cats", "dog", "dogs"), ("bird", "birds", "robot", "robots"),
          ("child", "children", "teacher", "teachers"))
TOPIC_SHARE = 0.8
DOC_WORDS = 300
# Token ids: the grammar's 36 words, then the special tokens.
N_WORDS = 36
CLS, SEP, MASK = 36, 37, 38
SENTINELS = tuple(range(39, 47))
VOCAB = 47
WINDOW = 31              # corpus words per example; every model reads [CLS] + WINDOW = 32 tokens downstream
# Downstream tasks (labels from the grammar; see `build_tasks`) and fine-tuning.
TAG_TRAIN, GRAM_TRAIN, N_TEST = 32, 2048, 1024
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
        "grammaticality": {"train_ids": with_cls(ids[:GRAM_TRAIN]),
                           "train_labels": torch.as_tensor(labels[:GRAM_TRAIN]),
                           "test_ids": with_cls(ids[GRAM_TRAIN:]),
                           "test_labels": torch.as_tensor(labels[GRAM_TRAIN:]),
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
