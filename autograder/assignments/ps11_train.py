"""Trusted checks of ps11-train (capstone: a Llama trained end to end in PyTorch), and the files its release ships.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps11-train/ps11-train.ipynb``. The
functions the checks call are the read-only wrappers of the notebook's "grader-calls" cell: they build the
student's modules from arrays, in float64. References:

- modules and the model: ``llmarch.model.GPT`` with a Llama configuration (``llama_config`` overrides: pre-RMSNorm,
  SwiGLU, rotate-half RoPE, grouped-query attention, no biases, untied head), whose ``state_dict`` keys the
  notebook's modules reproduce; ``llmarch.layers.rms_norm``, ``SwiGLU``, ``llmarch.positional.apply_rope``;
- cached decoding: the reference's full pass (a cache must not change the logits);
- AdamW and clipping: ``torch.optim.AdamW`` and ``torch.nn.utils.clip_grad_norm_``;
- the schedule: the warm-up + cosine rule of DESIGN.md (``llmarch.optim.cosine_schedule``'s contract), written
  out in :func:`ref_lr_schedule`;
- the training loop, uninterrupted and resumed: the same steps run with the reference model, torch's AdamW and
  clipping (the losses it returns, and the weights; a resumed run must equal the uninterrupted one);
- the held-out loss: computed by trusted code, the reference Llama of the shape the notebook states
  (``MODEL_CONFIG``) loaded with the student's trained weights, on fresh sentences of
  ``llmarch.data.default_grammar()`` that never leave the grader; it must be below ``LOSS_TARGET`` (5% above the
  grammar's entropy rate; ``ps11_loss_target.csv`` beside this file shows the reference meeting it under 10 seeds)
  and above ``LOSS_FLOOR``. The student's own model must also be causal in the precision it trains in (its
  logits on pairs of sequences that share a prefix agree on the prefix), and its own loss must not beat the
  floor (a model that sees the future does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks import Case, Check, FailureClass
from llmarch.attention import MultiHeadAttention
from llmarch.data import default_grammar, synthetic_corpus
from llmarch.layers import SwiGLU, rms_norm
from llmarch.model import GPT, llama_config
from llmarch.positional import RotaryEmbedding, apply_rope

NOTEBOOK = "ps11-train.ipynb"
TRUSTED_CALLABLES: dict = {}
FILES = ("ps11_checkpoint.npz", "ps11_corpus.npz")  # shipped beside the notebook; the grader copies them in
LOSS_TARGET = 1.72  # nats per token; the entropy rate of default_grammar() is 1.6325
LOSS_FLOOR = 1.55  # below this a model sees the future: the exact grammar scores 1.62-1.68 on 40 grader draws
HELDOUT_SHAPE = (32, 64)  # sentences x tokens the verdict scores
CAUSAL_TOLERANCE = 1e-4  # float32 logits of a shared prefix may differ by this (relative to the largest logit)
MODEL_CONFIG = {"vocab_size": 36, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 172,
                "rope_base": 10000.0, "eps": 1e-5}  # the model task 10 trains (the notebook states this shape)
TINY = {"vocab_size": 36, "d_model": 16, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 40,
        "rope_base": 10000.0, "eps": 1e-5}  # the checkpoint's model


def _t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))  # a copy: in-place updates must not touch the case's inputs


def reference_llama(config: dict) -> GPT:
    """llmarch's GPT as the Llama the notebook builds (its ``Llama(**config)``), in float64."""
    gpt_config = llama_config(vocab_size=config["vocab_size"], context_length=64, d_model=config["d_model"],
                              n_layers=config["n_layers"], n_heads=config["n_heads"],
                              n_kv_heads=config["n_kv_heads"], d_ff=config["d_ff"], rope_base=config["rope_base"],
                              norm_eps=config["eps"], rope_scaling=None)
    return GPT(gpt_config).double()


def flatten(weights: dict[str, np.ndarray]) -> np.ndarray:
    """State-dict tensors as one vector, in the order of their sorted names (how the notebook's wrappers and the
    grader pass a model's weights)."""
    return np.concatenate([np.ravel(weights[name]) for name in sorted(weights)])


def _loaded(config, flat) -> GPT:
    model = reference_llama(config)
    state, offset = model.state_dict(), 0
    for name in sorted(state):
        n = state[name].numel()
        state[name] = _t(flat[offset:offset + n]).reshape(state[name].shape)
        offset += n
    model.load_state_dict(state)
    return model.eval()


# --- references ---------------------------------------------------------------------------------------------


def ref_rmsnorm(x, weight, eps):
    return rms_norm(_t(x), _t(weight), eps=float(eps)).numpy()


@torch.no_grad()
def ref_swiglu(x, w1, w3, w2):
    ffn = SwiGLU(w1.shape[1], w1.shape[0]).double()
    ffn.load_state_dict({"w1.weight": _t(w1), "w3.weight": _t(w3), "w2.weight": _t(w2)})
    return ffn(_t(x)).numpy()


def ref_rope(x, positions, base):
    return apply_rope(_t(x), torch.as_tensor(np.asarray(positions)), base=float(base), interleaved=False).numpy()


@torch.no_grad()
def ref_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads, base, split=None):
    d_model = wq.shape[1]
    attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=False, pos_encoding="rope",
                              rotary=RotaryEmbedding(d_model // n_heads, base=float(base), interleaved=False)).double()
    attn.load_state_dict({"q_proj.weight": _t(wq), "k_proj.weight": _t(wk), "v_proj.weight": _t(wv),
                          "o_proj.weight": _t(wo)})
    return attn(_t(x), is_causal=True).numpy()  # a cache must not change the result: the full pass decides


@torch.no_grad()
def ref_logits(weights, config, idx, prompt=None):
    """Logits of the reference with the flat ``weights``; cached decoding must give the full pass's."""
    return _loaded(config, weights)(torch.as_tensor(np.asarray(idx), dtype=torch.long)).numpy()


def ref_adamw(start, grads, lrs, betas, eps, weight_decay, missing=None):
    """The parameter after each step of torch's AdamW; at the steps where ``missing`` is true its grad is None."""
    p = _t(start).clone().requires_grad_()
    opt = torch.optim.AdamW([p], lr=float(lrs[0]), betas=tuple(betas), eps=float(eps), weight_decay=float(weight_decay),
                            foreach=False)
    missing = np.zeros(len(grads), dtype=bool) if missing is None else missing
    path = []
    for g, lr, none in zip(grads, lrs, missing):
        p.grad = None if none else _t(g)
        opt.param_groups[0]["lr"] = float(lr)
        opt.step()
        path.append(p.detach().clone())
    return torch.stack(path).numpy()


def ref_lr_schedule(step, max_lr, min_lr, warmup_steps, cosine_steps):
    """DESIGN.md's ``cosine_schedule``: ``max_lr * step / warmup_steps`` while ``step < warmup_steps``, cosine from
    ``max_lr`` to ``min_lr`` until ``cosine_steps``, then ``min_lr``."""
    if step < warmup_steps:
        return np.float64(max_lr * step / warmup_steps)
    if step > cosine_steps:
        return np.float64(min_lr)
    progress = (step - warmup_steps) / (cosine_steps - warmup_steps)
    return np.float64(min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def ref_clip(g1, g2, max_norm):
    """The notebook's ``clip_two``: two gradients and, between them, a parameter whose grad is None."""
    a, b = torch.zeros(g1.shape, dtype=torch.float64), torch.zeros(g2.shape, dtype=torch.float64)
    a.grad, b.grad = _t(g1), _t(g2)
    norm = torch.nn.utils.clip_grad_norm_([a, torch.zeros(2, dtype=torch.float64), b], float(max_norm))
    return norm.numpy(), a.grad.numpy(), b.grad.numpy()


def ref_training(weights, config, xs, ys, hp):
    """The loop of the notebook's ``train_steps`` with the reference model, torch's AdamW and clip_grad_norm_:
    the weights after the run, flat (:func:`flatten`), and the loss of every step (before its update)."""
    model = _loaded(config, weights).train()
    opt = torch.optim.AdamW(model.parameters(), betas=tuple(hp["betas"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], foreach=False)
    losses = []
    for step in range(len(xs)):
        opt.param_groups[0]["lr"] = float(ref_lr_schedule(step, hp["max_lr"], hp["min_lr"], hp["warmup_steps"],
                                                          hp["cosine_steps"]))
        logits = model(torch.as_tensor(xs[step], dtype=torch.long))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(ys[step]).reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
        opt.step()
        losses.append(loss.item())
    state = model.state_dict()
    return torch.cat([state[name].detach().reshape(-1) for name in sorted(state)]).numpy(), np.array(losses)


def ref_resumed(weights, config, xs, ys, hp, resume_at):
    """A resumed run must end with the weights of the uninterrupted one."""
    return ref_training(weights, config, xs, ys, hp)[0]


def ref_heldout(idx):
    return np.zeros(0), np.zeros(0)  # only fixes that two values come back (weights, logits); the verdict decides


# --- fresh inputs -------------------------------------------------------------------------------------------

# Every `cases` function starts with deterministic edge cases (the same for every seed), built so that each known
# wrong variant of tests/test_wrong_variants_capstones.py fails them every time; random cases come in addition.


def random_weights(rng, config, scale=0.3) -> dict[str, np.ndarray]:
    """Weights for the state_dict of ``Llama(**config)``: matrices N(0, scale^2) (large enough that every part
    moves the logits), norm gains in [0.5, 1.5]."""
    shapes = {name: tuple(p.shape) for name, p in reference_llama(config).state_dict().items()}
    return {name: (rng.uniform(0.5, 1.5, size=shape) if len(shape) == 1 else rng.normal(0, scale, size=shape))
            for name, shape in shapes.items()}


def _random_config(rng):
    """A random Llama configuration; its ``eps`` is never the default 1e-5 (a norm built without it shows)."""
    n_kv = int(rng.choice([1, 2]))
    n_heads = n_kv * int(rng.choice([1, 2, 3]))
    d_head = 2 * int(rng.integers(1, 4))
    return {"vocab_size": int(rng.integers(5, 20)), "d_model": n_heads * d_head, "n_layers": int(rng.integers(1, 3)),
            "n_heads": n_heads, "n_kv_heads": n_kv, "d_ff": int(rng.integers(3, 12)),
            "rope_base": float(np.exp(rng.uniform(np.log(50), np.log(1e5)))), "eps": float(rng.choice([1e-2, 0.1]))}


def _rmsnorm(rng):
    d = int(rng.integers(2, 12))
    small = rng.normal(size=(3, d)) * 1e-3  # eps matters here: eps outside the root, or squared, gives another value
    return [Case((np.array([[1.0, 2.0, 2.0, 4.0]]), np.array([1.0, 1.0, 0.5, 2.0]), 0.0),
                 note="the worked example, eps 0"),
            Case((np.ones((1, 2)), np.ones(2), 3.0), note="eps 3, inside the square root"),
            Case((np.full((2, 5), 3.0) + np.arange(5), rng.uniform(0.5, 2, size=5), 1e-5),
                 note="rows with a non-zero mean: RMS, not standard deviation"),
            Case((small, rng.normal(size=d), 1e-5), note="tiny rows, where eps matters"),
            Case((rng.normal(size=(2, int(rng.integers(1, 4)), d)) * 3 + 1, rng.normal(size=d), 1e-5),
                 note="a batch (B, T, d)")]


def _swiglu(rng):
    d, d_ff = int(rng.integers(2, 9)), int(rng.integers(2, 13))
    weights = lambda: (rng.normal(size=(d_ff, d)), rng.normal(size=(d_ff, d)), rng.normal(size=(d, d_ff)) / 2)
    large = rng.normal(size=(4, d)) * 3
    large[0, 0], large[1, 0] = -6.0, 6.0  # the gate closes (silu(-6) ~ 0) and opens
    return [Case((rng.normal(size=(2, 3, d)), *weights()), note="a batch (B, T, d)"),
            Case((large, *weights()), note="(T, d) rows, large inputs")]


def _rope(rng):
    t, d = int(rng.integers(2, 9)), 2 * int(rng.integers(1, 6))
    past = int(rng.integers(1, 100_000))
    return [Case((rng.normal(size=(1, 2, 6, 8)), np.arange(6), 10000.0), note="six positions from 0, base 10000"),
            Case((rng.normal(size=(2, 1, 3, 4)), np.array([1000, 54321, 99999]), 100.0),
                 note="far positions that are not consecutive, base 100"),
            Case((rng.normal(size=(int(rng.integers(1, 3)), int(rng.integers(1, 4)), t, d)), np.arange(past, past + t),
                  float(np.exp(rng.uniform(np.log(100), np.log(1e6))))),
                 note="positions after a long cache, a random base")]


def _attention_weights(rng, d_model, n_heads, n_kv_heads):
    """q_proj, k_proj, v_proj and o_proj weights."""
    d_head = d_model // n_heads
    return (rng.normal(size=(n_heads * d_head, d_model)), rng.normal(size=(n_kv_heads * d_head, d_model)),
            rng.normal(size=(n_kv_heads * d_head, d_model)), rng.normal(size=(d_model, n_heads * d_head)) / 2)


def _attention_case(rng, note, n_heads, n_kv_heads, d_head, t, *extra):
    d_model = n_heads * d_head
    x = rng.normal(size=(int(rng.integers(1, 3)), t, d_model)) / np.sqrt(d_model)
    base = float(np.exp(rng.uniform(np.log(10), np.log(1e4))))
    return Case((x, *_attention_weights(rng, d_model, n_heads, n_kv_heads), n_heads, n_kv_heads, base, *extra),
                note=note)


def _attention(rng):
    return [_attention_case(rng, "6 query heads on 2 key/value heads: h // 3, not h % 2", 6, 2, 2, 5),
            _attention_case(rng, "4 heads, one key/value head each", 4, 4, 4, 4),
            _attention_case(rng, "multi-query attention, a random length", 2, 1, 6, int(rng.integers(1, 8)))]


def _attention_cache(rng):
    t = int(rng.integers(2, 8))
    return [_attention_case(rng, "5 tokens, a prompt of 3, 4 query heads on 2", 4, 2, 2, 5, 3),
            _attention_case(rng, "a random length and prompt, multi-query", 2, 1, 4, t, int(rng.integers(1, t)))]


def _llama(rng):
    config = _random_config(rng)
    idx = lambda c, t: rng.integers(0, c["vocab_size"], size=(2, t))
    return [Case((flatten(random_weights(rng, TINY)), TINY, idx(TINY, 9)),
                 note="the tiny configuration, random weights"),
            Case((flatten(random_weights(rng, config)), config, idx(config, int(rng.integers(1, 9)))),
                 note="a random configuration")]


def _llama_cache(rng):
    config = _random_config(rng)
    t = int(rng.integers(2, 9))
    return [Case((flatten(random_weights(rng, TINY)), TINY, rng.integers(0, 36, size=(2, 8)), 3),
                 note="the tiny configuration, a prompt of 3 then one token at a time"),
            Case((flatten(random_weights(rng, config)), config, rng.integers(0, config["vocab_size"], size=(1, t)),
                  int(rng.integers(1, t))), note="a random configuration and prompt length")]


def _adamw_case(rng, shape, steps, weight_decay, note):
    grads = rng.normal(size=(steps, *shape)) * 10.0 ** rng.integers(-3, 2, size=(steps,) + (1,) * len(shape))
    lrs = rng.uniform(0.01, 0.1, size=steps)
    betas = [float(rng.uniform(0.7, 0.95)), float(rng.uniform(0.9, 0.999))]
    return Case((rng.normal(size=shape), grads, lrs, betas, float(rng.choice([1e-8, 1e-3])), weight_decay), note=note)


def _adamw(rng):
    grads = rng.normal(size=(4, 3))
    return [Case((np.array([1.0, -2.0, 0.5]), grads, np.full(4, 0.1), [0.9, 0.99], 1e-8, 0.0),
                 {"missing": np.array([False, True, False, True])},
                 note="no gradient (grad None) at steps 2 and 4, no weight decay"),
            Case((np.array([1.0, -2.0, 0.5]), grads, np.full(4, 0.1), [0.9, 0.99], 1e-8, 0.2),
                 {"missing": np.array([True, False, True, False])},
                 note="no gradient (grad None) at steps 1 and 3, weight decay 0.2"),
            Case((np.ones(3), np.full((3, 3), 1e-4), np.array([0.1, 0.1, 0.1]), [0.9, 0.999], 1e-8, 0.0),
                 note="three steps of tiny gradients, no weight decay"),
            Case((np.array([2.0, -1.0]), np.array([[1.0, 1.0], [1.0, -1.0], [0.0, 0.0]]), np.array([0.5, 0.2, 0.1]),
                  [0.5, 0.9], 1e-3, 0.3), note="three steps, the last gradient zero, weight decay 0.3"),
            _adamw_case(rng, (2, 3), int(rng.integers(2, 7)), 0.0, "random (2, 3) weights, no weight decay"),
            _adamw_case(rng, (4,), int(rng.integers(2, 7)), float(rng.uniform(0.01, 0.5)),
                        "random (4,) weights, a random weight decay")]


def _lr_schedule(rng):
    max_lr, min_lr = float(rng.uniform(1e-3, 1.0)), 0.0
    min_lr = max_lr * float(rng.uniform(0.01, 0.5))
    warmup = int(rng.integers(1, 50))
    cosine = warmup + int(rng.integers(1, 500))
    fixed = [(0, 1.0, 0.1, 10, 110), (5, 1.0, 0.1, 10, 110), (10, 1.0, 0.1, 10, 110), (60, 1.0, 0.1, 10, 110),
             (110, 1.0, 0.1, 10, 110), (111, 1.0, 0.1, 10, 110), (35, 2.0, 0.0, 10, 60)]
    steps = [int(rng.integers(0, warmup)), warmup, int(rng.integers(warmup, cosine + 1)), cosine,
             cosine + int(rng.integers(1, 100))]
    fixed_notes = ["step 0", "halfway through the warm-up", "step = warmup_steps", "halfway through the cosine",
                   "step = cosine_steps", "one step after the cosine", "min_lr 0, in the cosine"]
    step_notes = ["random values, a step in the warm-up", "random values, step = warmup_steps",
                  "random values, a step in the cosine", "random values, step = cosine_steps",
                  "random values, a step after the cosine"]
    return ([Case(args, note=note) for args, note in zip(fixed, fixed_notes)]
            + [Case((s, max_lr, min_lr, warmup, cosine), note=note) for s, note in zip(steps, step_notes)])


def _clip(rng):
    g1, g2 = rng.normal(size=(3, 4)), rng.normal(size=(5,))
    norm = float(np.sqrt(np.sum(g1**2) + np.sum(g2**2)))
    return [Case((np.array([3.0, 0.0]), np.array([4.0]), 1.0), note="a 3-4-5 norm over two tensors, max_norm 1"),
            Case((np.array([0.3, 0.0]), np.array([0.4]), 1.0), note="a total norm below max_norm"),
            Case((np.array([[1.0, 2.0]]), np.array([2.0]), 10.0), note="a 2-D tensor, max_norm 10"),
            Case((g1, g2, norm * float(rng.uniform(0.05, 0.9))), note="random gradients above max_norm"),
            Case((g1 * 0.1, g2 * 0.1, norm), note="random gradients below max_norm")]


def _training_case(rng, note, config, steps, batch, t, resume_at=None):
    """Random batches and hyper-parameters; ``clip`` is below every gradient norm of these runs, so clipping acts at
    every step (a missing or per-tensor clip shows)."""
    xs = rng.integers(0, config["vocab_size"], size=(steps, batch, t))
    ys = rng.integers(0, config["vocab_size"], size=(steps, batch, t))
    warmup = int(rng.integers(1, steps - 1))  # cosine_steps = steps - 1 > warmup_steps
    hp = {"max_lr": float(rng.uniform(0.01, 0.05)), "min_lr": 0.001, "warmup_steps": warmup,
          "cosine_steps": steps - 1, "clip": float(rng.uniform(0.01, 0.05)), "betas": [0.9, 0.95],
          "eps": 1e-8, "weight_decay": 0.1}
    args = (flatten(random_weights(rng, config, scale=0.2)), config, xs, ys, hp)
    return Case(args if resume_at is None else (*args, resume_at), note=note)


def _train_steps(rng):
    return [_training_case(rng, "5 steps of the tiny configuration, clipping at every step", TINY, 5, 2, 6),
            _training_case(rng, "4 steps of a random configuration, clipping at every step", _random_config(rng),
                           4, 2, 5)]


def _resume(rng):
    return [_training_case(rng, "the tiny configuration, 6 steps, resumed after 3", TINY, 6, 2, 6, 3),
            _training_case(rng, "a random configuration, 5 steps, resumed after 2", _random_config(rng), 5, 2, 4, 2)]


@dataclass
class HeldOutCase(Case):
    """``args`` holds the pairs sent to the student's model: rows ``2i`` are fresh sentences, rows ``2i + 1`` the same
    tokens before position ``prefixes[i]`` and other tokens from there on. ``heldout`` (never sent to the sandbox):
    the sentences ``(B, T + 1)`` on which the reference, loaded with the student's weights, is scored."""

    prefixes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    heldout: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))


def heldout_sentences(seed: int, shape=HELDOUT_SHAPE) -> np.ndarray:
    """``shape[0]`` sequences of ``shape[1] + 1`` tokens, each sampled from the grammar's start (a sentence start)."""
    rows, length = shape
    return np.stack([synthetic_corpus(length + 1, seed=seed + i).numpy() for i in range(rows)])


def _pairs(rng, sentences):
    """Rows ``2i``: the sentences; rows ``2i + 1``: the same tokens before ``prefixes[i]`` and random tokens from there
    on, the first of them another word. The prefixes run from 1 (position 0 must not see position 1) to T - 1."""
    rows, length = sentences.shape
    vocab = default_grammar().vocab_size
    prefixes = np.linspace(1, length - 1, rows).round().astype(np.int64)
    pairs = np.repeat(sentences, 2, axis=0)
    for i, p in enumerate(prefixes):
        pairs[2 * i + 1, p:] = rng.integers(0, vocab, size=length - p)
        pairs[2 * i + 1, p] = (sentences[i, p] + rng.integers(1, vocab)) % vocab
    return pairs, prefixes


def _heldout(rng):
    sentences = heldout_sentences(int(rng.integers(10**6, 2**31)))[:, :-1]
    pairs, prefixes = _pairs(rng, sentences)
    return [HeldOutCase((pairs,), note="pairs of fresh sentences that share a prefix", prefixes=prefixes,
                        heldout=heldout_sentences(int(rng.integers(10**6, 2**31))))]


def heldout_loss(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy (nats per token) of ``logits (B, T, V)`` against ``targets (B, T)``."""
    return float(F.cross_entropy(torch.as_tensor(logits).reshape(-1, logits.shape[-1]),
                                 torch.as_tensor(targets, dtype=torch.long).reshape(-1)))


@torch.no_grad()
def reference_heldout_loss(weights: np.ndarray, heldout: np.ndarray) -> float:
    """The trusted held-out loss: the reference Llama of shape ``MODEL_CONFIG`` with ``weights`` (flat) scores the
    sentences ``heldout (B, T + 1)`` in float64."""
    logits = _loaded(MODEL_CONFIG, np.asarray(weights, dtype=np.float64))(torch.as_tensor(heldout[:, :-1]))
    return heldout_loss(logits.numpy(), heldout[:, 1:])


SEES_THE_FUTURE = ("no model that predicts each token from the ones before it can do that: your model sees the "
                   "future. Check its causal mask in the precision you train in (float32), e.g. a fast path")


def _causality_problem(case: HeldOutCase, logits: np.ndarray) -> str | None:
    """The message when a pair's logits differ before the position where its tokens start to differ."""
    scale = CAUSAL_TOLERANCE * max(1.0, float(np.abs(logits[np.isfinite(logits)]).max(initial=0.0)))
    for i, p in enumerate(case.prefixes):
        same, changed = logits[2 * i, :p], logits[2 * i + 1, :p]
        if not np.allclose(same, changed, rtol=0.0, atol=scale):
            return (f"two sequences with the same tokens at positions 0..{p - 1} and other tokens from position {p} on "
                    f"gave different logits at positions 0..{p - 1}: {SEES_THE_FUTURE}")
    return None


def _verdict_heldout(cases, returned):
    """The first problem of the captured weights and logits, named by the case, or None."""
    case = cases[0]
    problem = _heldout_problem(case, *returned[0])
    return None if problem is None else f"{case.label(0, 1, 'heldout_outputs')}: {problem}"


def _heldout_problem(case: HeldOutCase, weights: np.ndarray, logits: np.ndarray) -> str | None:
    pairs = case.args[0]
    expected = (*pairs.shape, default_grammar().vocab_size)
    if logits.shape != expected:
        return f"your model's logits have shape {logits.shape}; expected {expected} (B, T, vocab_size)"
    if np.isnan(logits).any() or np.isposinf(logits).any():
        return "your model's logits are nan or +inf"  # -inf (an impossible word) is allowed
    own = heldout_loss(logits[0::2, :-1], pairs[0::2, 1:])
    if own < LOSS_FLOOR:
        return (f"your model's own logits score {own:.4f} nats per token on {pairs[0::2, 1:].size} fresh tokens, more "
                f"than {default_grammar().entropy_rate() - LOSS_FLOOR:.2f} below the entropy rate "
                f"{default_grammar().entropy_rate():.4f}; {SEES_THE_FUTURE}")
    problem = _causality_problem(case, logits)
    if problem:
        return problem
    count = sum(t.numel() for t in reference_llama(MODEL_CONFIG).state_dict().values())
    if weights.ndim != 1 or weights.size != count:
        return (f"the trained `model` has {weights.size} weights; the grader scores a Llama of the shape task 10 "
                f"states, which has {count}: train that model")
    if not np.isfinite(weights).all():
        return "the trained `model` has weights that are nan or infinite"
    loss = reference_heldout_loss(weights, case.heldout)
    if loss < LOSS_FLOOR:
        return f"the held-out loss is {loss:.4f} nats per token, below {LOSS_FLOOR}; {SEES_THE_FUTURE}"
    if not loss < LOSS_TARGET:
        return (f"the held-out loss on {case.heldout[:, 1:].size} fresh tokens is {loss:.4f} nats per token; the "
                f"target is below {LOSS_TARGET} (the entropy rate is {default_grammar().entropy_rate():.4f})")
    return None


MODEL = ("rmsnorm_forward", "swiglu_forward", "rope_forward", "attention_forward")  # what a Llama is built from
TRAINING = ("llama_logits", "adamw_trajectory", "lr_schedule", "clip_two")  # what the training loop calls
CHECKS = {
    "test_rmsnorm": Check("rmsnorm_forward", _rmsnorm, ref_rmsnorm),
    "test_swiglu": Check("swiglu_forward", _swiglu, ref_swiglu),
    "test_rope": Check("rope_forward", _rope, ref_rope),
    "test_attention": Check("attention_forward", _attention, ref_attention, depends_on=("rope_forward",)),
    "test_attention_cache": Check("attention_cached", _attention_cache, ref_attention,
                                  depends_on=("rope_forward", "attention_forward")),
    "test_llama_logits": Check("llama_logits", _llama, ref_logits, depends_on=MODEL),
    "test_llama_cache": Check("llama_cached_logits", _llama_cache, ref_logits,
                              depends_on=(*MODEL, "attention_cached", "llama_logits")),
    "test_adamw": Check("adamw_trajectory", _adamw, ref_adamw),
    "test_lr_schedule": Check("lr_schedule", _lr_schedule, ref_lr_schedule, rtol=1e-9, atol=1e-12),
    "test_clip": Check("clip_two", _clip, ref_clip),
    "test_train_steps": Check("trained_weights", _train_steps, ref_training, rtol=1e-6, atol=1e-9,
                              depends_on=(*MODEL, *TRAINING), returns=("weights", "losses")),
    "test_checkpoint": Check("resumed_weights", _resume, ref_resumed, rtol=1e-6, atol=1e-9,
                             depends_on=(*MODEL, *TRAINING, "trained_weights")),
    "test_heldout_loss": Check("heldout_outputs", _heldout, ref_heldout, verdict=_verdict_heldout,
                               depends_on=("rope_forward", "attention_forward", "llama_logits", "trained_weights"),
                               returns=("weights", "logits")),
}


# --- the files the release ships ----------------------------------------------------------------------------


@torch.no_grad()
def release_files() -> dict[str, dict[str, np.ndarray]]:
    """The arrays of ``ps11_checkpoint.npz`` (a tiny Llama ``TINY`` with random weights, inputs, and the
    reference's outputs of each module, in float64) and ``ps11_corpus.npz`` (200,000 training tokens of the grammar
    corpus, its vocabulary, and 32 held-out sentences for the visible test). Deterministic."""
    rng = np.random.default_rng(11)
    weights = random_weights(rng, TINY)
    model = _loaded(TINY, flatten(weights))
    block = model.blocks[0]
    arrays = dict(weights)
    arrays["rms_x"], arrays["rms_weight"] = rng.normal(size=(2, 3, 16)) + 0.5, rng.uniform(0.5, 1.5, size=16)
    arrays["rms_out"] = ref_rmsnorm(arrays["rms_x"], arrays["rms_weight"], 1e-5)
    arrays["ffn_x"] = rng.normal(size=(2, 3, 16))
    arrays["ffn_out"] = block.ffn(_t(arrays["ffn_x"])).numpy()
    arrays["rope_x"] = rng.normal(size=(2, 2, 6, 8))
    arrays["rope_out"] = ref_rope(arrays["rope_x"], np.arange(6), 10000.0)
    arrays["rope_far"] = ref_rope(arrays["rope_x"][:, :, :2], np.array([1000, 123457]), 10000.0)
    arrays["attn_x"] = rng.normal(size=(2, 7, 16)) / 4
    arrays["attn_out"] = block.attn(_t(arrays["attn_x"]), is_causal=True).numpy()
    arrays["idx"] = rng.integers(0, 36, size=(2, 10))
    arrays["logits"] = model(torch.as_tensor(arrays["idx"])).numpy()
    arrays["logits_eps"] = _loaded({**TINY, "eps": 0.1}, flatten(weights))(torch.as_tensor(arrays["idx"])).numpy()
    grammar = default_grammar()
    corpus = {"train": synthetic_corpus(200_000, seed=2024).numpy().astype(np.uint8),
              "vocab": np.array(grammar.vocab), "heldout": heldout_sentences(7_000_000)}
    return {"ps11_checkpoint.npz": arrays, "ps11_corpus.npz": corpus}


def write_release_files(folder: Path) -> None:
    """Write :func:`release_files` into ``folder`` (``solutions/ps11-train``; nbgrader copies them to the release)."""
    for name, arrays in release_files().items():
        np.savez_compressed(Path(folder) / name, **arrays)


# --- failure classes ----------------------------------------------------------------------------------------


def _rms(x):
    return np.sqrt(np.mean(np.asarray(x) ** 2, axis=-1))


def _schedule_at(where):
    """A schedule case whose step is at ``where(step, warmup_steps, cosine_steps)``."""
    return lambda case: where(case.args[0], case.args[3], case.args[4])


def _first_difference(pairs, i):
    return int(np.argmax(pairs[2 * i] != pairs[2 * i + 1]))


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).
FAILURE_CLASSES = [
    FailureClass("eps 0, the worked example", "test_rmsnorm", lambda case: case.args[2] == 0),
    FailureClass("a large eps (inside vs outside the square root)", "test_rmsnorm", lambda case: case.args[2] >= 1),
    FailureClass("rows with a large mean (RMS, not standard deviation)", "test_rmsnorm",
                 lambda case: np.abs(np.mean(case.args[0], axis=-1)).min() > 1),
    FailureClass("tiny rows, where eps matters", "test_rmsnorm", lambda case: _rms(case.args[0]).max() < 0.01),
    FailureClass("a batch (B, T, d)", "test_rmsnorm", lambda case: case.args[0].ndim == 3),
    FailureClass("SwiGLU on a batch (B, T, d)", "test_swiglu", lambda case: case.args[0].ndim == 3),
    FailureClass("inputs that close and open the gate (w1 vs w3)", "test_swiglu",
                 lambda case: case.args[0].min() <= -5 and case.args[0].max() >= 5),
    FailureClass("positions from 0", "test_rope", lambda case: case.args[1][0] == 0 and case.args[0].shape[-1] >= 4),
    FailureClass("far positions (float64 angles)", "test_rope", lambda case: np.max(case.args[1]) >= 50_000),
    FailureClass("positions that are not consecutive", "test_rope", lambda case: np.any(np.diff(case.args[1]) != 1)),
    FailureClass("a base other than 10000", "test_rope", lambda case: case.args[2] != 10000.0),
    FailureClass("grouped-query attention, several key/value heads (h // g, not h % n_kv)", "test_attention",
                 lambda case: case.args[5] > case.args[6] > 1),
    FailureClass("multi-query attention", "test_attention", lambda case: case.args[6] == 1),
    FailureClass("several tokens (causal mask and scale)", "test_attention", lambda case: case.args[0].shape[1] >= 4),
    FailureClass("a cached prompt, then new tokens at later positions", "test_attention_cache",
                 lambda case: 1 < case.args[8] < case.args[0].shape[1] - 1),
    FailureClass("grouped-query attention with a cache", "test_attention_cache",
                 lambda case: case.args[5] > case.args[6]),
    FailureClass("a norm eps other than the default (eps passed on to every norm)", "test_llama_logits",
                 lambda case: case.args[1]["eps"] != 1e-5),
    FailureClass("two layers, grouped-query", "test_llama_logits",
                 lambda case: case.args[1]["n_layers"] == 2 and case.args[1]["n_heads"] > case.args[1]["n_kv_heads"]),
    FailureClass("cached decoding with a norm eps other than the default", "test_llama_cache",
                 lambda case: case.args[1]["eps"] != 1e-5),
    FailureClass("a prompt, then one token at a time", "test_llama_cache",
                 lambda case: case.args[3] < case.args[2].shape[1] - 1),
    FailureClass("a gradient that is None at some steps, no weight decay (the step count)", "test_adamw",
                 lambda case: case.kwargs.get("missing", np.zeros(1)).any() and case.args[5] == 0),
    FailureClass("a gradient that is None at the first step, with weight decay", "test_adamw",
                 lambda case: case.kwargs.get("missing", np.zeros(1))[0] and case.args[5] > 0),
    FailureClass("tiny gradients over several steps (bias correction, eps)", "test_adamw",
                 lambda case: len(case.args[1]) >= 3 and np.abs(case.args[1]).max() <= 1e-3),
    FailureClass("weight decay with a zero gradient (decoupled, times lr)", "test_adamw",
                 lambda case: case.args[5] > 0 and not np.any(case.args[1][-1])),
    FailureClass("step 0", "test_lr_schedule", lambda case: case.args[0] == 0),
    FailureClass("step = warmup_steps", "test_lr_schedule", _schedule_at(lambda s, w, c: s == w)),
    FailureClass("inside the cosine", "test_lr_schedule", _schedule_at(lambda s, w, c: w < s < c)),
    FailureClass("step = cosine_steps", "test_lr_schedule", _schedule_at(lambda s, w, c: s == c)),
    FailureClass("after cosine_steps", "test_lr_schedule", _schedule_at(lambda s, w, c: s > c)),
    FailureClass("min_lr > 0 in the cosine", "test_lr_schedule",
                 lambda case: case.args[2] > 0 and case.args[3] < case.args[0] < case.args[4]),
    FailureClass("a norm over two tensors above max_norm (one global norm)", "test_clip",
                 lambda case: np.sqrt(np.sum(case.args[0] ** 2) + np.sum(case.args[1] ** 2)) > case.args[2]),
    FailureClass("a norm below max_norm (unchanged)", "test_clip",
                 lambda case: np.sqrt(np.sum(case.args[0] ** 2) + np.sum(case.args[1] ** 2)) < case.args[2]),
    FailureClass("a parameter whose grad is None (clip_two passes one in every call)", "test_clip",
                 lambda case: len(case.args) == 3),
    FailureClass("clipping at every step of a run", "test_train_steps", lambda case: case.args[4]["clip"] <= 0.05),
    FailureClass("warm-up then cosine within the run (the schedule's step)", "test_train_steps",
                 lambda case: 1 <= case.args[4]["warmup_steps"] < case.args[4]["cosine_steps"] < len(case.args[2])),
    FailureClass("a norm eps other than the default in training", "test_train_steps",
                 lambda case: case.args[1]["eps"] != 1e-5),
    FailureClass("several steps (the losses returned, one per step)", "test_train_steps",
                 lambda case: len(case.args[2]) >= 4),
    FailureClass("a run resumed in the middle", "test_checkpoint",
                 lambda case: 0 < case.args[5] < len(case.args[2]) - 1),
    FailureClass("weight decay and moments to restore", "test_checkpoint",
                 lambda case: case.args[4]["weight_decay"] > 0 and case.args[5] >= 2),
    FailureClass("pairs that share a prefix of one token (position 0 must not see position 1)", "test_heldout_loss",
                 lambda case: _first_difference(case.args[0], 0) == 1),
    FailureClass("pairs that differ at every later position (causality in the trained model's precision)",
                 "test_heldout_loss",
                 lambda case: all(_first_difference(case.args[0], i) == p for i, p in enumerate(case.prefixes))),
    FailureClass("fresh sentences the grader scores with its own Llama", "test_heldout_loss",
                 lambda case: case.heldout.shape == (HELDOUT_SHAPE[0], HELDOUT_SHAPE[1] + 1)),
]


if __name__ == "__main__":
    write_release_files(Path(__file__).resolve().parents[2] / "solutions" / "ps11-train")
