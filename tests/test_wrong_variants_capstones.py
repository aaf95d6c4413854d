"""The capstones' classic wrong answers, and what each must cost, whatever the hidden inputs; the capstones through
the real command line (full marks, zero, identical rows under 20 names).

The same method as ``test_wrong_variants.py`` (its harness is reused): each variant is one wrong answer cell, the
rest of the notebook is the solution, and under ten ``--seed`` values it loses exactly the listed cells. The
in-process runs replace the notebook's training run (cell ``model`` of ps11-train) by a model of the stated shape,
built by the variant's own code and loaded with weights the reference trained once per session (the solution's
recipe, about 9 s of CPU): the held-out check then scores those weights and the variant's own forward pass (is it
causal?). The training run itself is graded once, through the command line, with the solution (full marks); the 20
copies there are a submission that left its model untrained, which loses exactly the held-out loss.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder import assignments
from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import release, submission, write
from test_wrong_variants import (SEEDS, Harness, Variant, _test_cells, _visible_failures,
                                 assert_copies_identical, assert_loses_exactly, read_grades, write_copies)
from test_wrong_variants import _namespace as _notebook_namespace

ROOT = Path(__file__).resolve().parents[1]
PS11 = "ps11-train"
TRAINING = {PS11: ("model", "test_heldout_loss")}  # the training cell and the check that needs it
# What the in-process runs execute instead of the training cell: the variant's Llama with the reference's weights.
TRAINED_MODEL = """
model = Llama(len(CORPUS["vocab"]), d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=172)
model.load_state_dict(TRAINED_STATE)
"""

VARIANTS: dict[str, list[Variant]] = {PS11: []}


def variant(assignment: str, name: str, cell: str, loses: set[str], source: str) -> None:
    VARIANTS[assignment].append(Variant(name, cell, frozenset(loses), source.strip("\n") + "\n"))


# ---------------------------------------------------------------------------------------------------------------
# ps11-train
# ---------------------------------------------------------------------------------------------------------------
MODEL = {"test_llama_logits", "test_llama_cache"}
TRAIN = {"test_train_steps", "test_checkpoint"}
ATTENTION = {"test_attention", "test_attention_cache"}
CACHE = {"test_attention_cache", "test_llama_cache"}

RMSNORM_SOURCE = """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        {forward}
"""
variant(PS11, "RMSNorm with eps outside the square root", "RMSNorm", {"test_rmsnorm"} | MODEL | TRAIN,
        RMSNORM_SOURCE.format(forward="return self.weight * x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps)"))
variant(PS11, "RMSNorm centres the features (LayerNorm without bias)", "RMSNorm", {"test_rmsnorm"} | MODEL | TRAIN,
        RMSNORM_SOURCE.format(forward="""x = x - x.mean(dim=-1, keepdim=True)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)"""))
variant(PS11, "SwiGLU gates the up projection's branch", "SwiGLU", {"test_swiglu"} | MODEL | TRAIN, """
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.w2(self.w1(x) * F.silu(self.w3(x)))
""")
ROPE = """
class RotaryEmbedding(nn.Module):
    def __init__(self, d_head, base=10000.0):
        super().__init__()
        self.d_head, self.base = d_head, base

    def forward(self, x, positions):
        half = self.d_head // 2
        theta = self.base ** (-torch.arange(half, dtype=torch.float64) * 2 / self.d_head)
        angles = positions.to(torch.float64)[:, None] * theta[None, :]
        cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
        {rotate}
"""
variant(PS11, "RoPE pairs adjacent features (interleaved layout)", "RotaryEmbedding",
        {"test_rope"} | ATTENTION | MODEL | TRAIN, ROPE.replace("{rotate}", """x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)"""))
variant(PS11, "RoPE rotates the other way", "RotaryEmbedding", {"test_rope"} | ATTENTION | MODEL | TRAIN,
        ROPE.replace("{rotate}", """x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)"""))

ATTENTION_SOURCE = """
class Attention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, rope_base=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(n_heads * self.d_head, d_model, bias=False)
        self.rope = RotaryEmbedding(self.d_head, rope_base)

    def forward(self, x, cache=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.d_head).transpose(1, 2)
        past = 0 if cache is None else cache.length
        positions = torch.arange({start}, {start} + t)
        q, k = self.rope(q, positions), self.rope(k, positions)
        if cache is not None:
            if cache.k is not None:
                k, v = torch.cat([cache.k, k], dim=-2), torch.cat([cache.v, v], dim=-2)
            cache.k, cache.v = k, v
        group = self.n_heads // self.n_kv_heads
        k, v = {repeat}
        scores = q @ k.transpose(-1, -2) / {scale}
        t_k = k.shape[-2]
        allowed = torch.ones(t, t_k, dtype=torch.bool).tril(diagonal={diagonal})
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, t, self.n_heads * self.d_head)
        return self.o_proj(out)
"""
RIGHT_ATTENTION = {"start": "past", "repeat": "k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
                   "scale": "math.sqrt(self.d_head)", "diagonal": "t_k - t"}


def attention_with(**wrong: str) -> str:
    return ATTENTION_SOURCE.format(**{**RIGHT_ATTENTION, **wrong})


variant(PS11, "attention without the 1/sqrt(d_head) scale", "Attention", ATTENTION | MODEL | TRAIN,
        attention_with(scale="1.0"))
variant(PS11, "GQA pairs query head h with key/value head h % n_kv_heads", "Attention", ATTENTION | MODEL | TRAIN,
        attention_with(repeat="k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)"))
variant(PS11, "cached tokens rotated from position 0", "Attention", CACHE, attention_with(start="0"))
variant(PS11, "cached queries masked from the top left", "Attention", CACHE, attention_with(diagonal="0"))
variant(PS11, "causal mask off by one: each token also sees the next", "Attention",
        ATTENTION | MODEL | TRAIN | {"test_heldout_loss"}, attention_with(diagonal="t_k - t + 1"))

HELDOUT = {"test_heldout_loss"}


def attention_with_fast_path(fast: str) -> str:
    """The right attention in float64 (what the module checks run), and ``fast`` computing the heads' outputs
    (B, H, T, d_head) from q, k, v in float32 (what training and the held-out check run)."""
    return attention_with().replace("        scores = q @ k", f"""        if x.dtype == torch.float32:
            out = {fast}
            return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head))
        scores = q @ k""")


variant(PS11, "float32 fast path: scaled_dot_product_attention without is_causal", "Attention", HELDOUT,
        attention_with_fast_path("F.scaled_dot_product_attention(q, k, v)"))
variant(PS11, "float32 fast path: causal mask off by one", "Attention", HELDOUT, attention_with_fast_path(
    "torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(self.d_head)).masked_fill("
    "~torch.ones(t, t, dtype=torch.bool).tril(diagonal=1), float('-inf')), dim=-1) @ v"))
variant(PS11, "float32 fast path: a 0/1 float mask (added to the scores, not a boolean mask)", "Attention", HELDOUT,
        attention_with_fast_path("F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(t, t).tril())"))

LLAMA_SOURCE = """
class Block(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, rope_base=10000.0, eps=1e-5):
        super().__init__()
        self.norm1 = RMSNorm(d_model, eps)
        self.attn = Attention(d_model, n_heads, n_kv_heads, rope_base)
        self.norm2 = RMSNorm(d_model, eps)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x, cache=None):
        {block}


class Llama(nn.Module):
    def __init__(self, vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, rope_base=10000.0, eps=1e-5):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, n_kv_heads, d_ff, rope_base, eps) for _ in range(n_layers))
        self.norm_f = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, caches=None):
        h = self.tok_emb(idx)
        for i, block in enumerate(self.blocks):
            h = block(h, None if caches is None else caches[i])
        return self.lm_head({final})
"""
RIGHT_BLOCK = "h = x + self.attn(self.norm1(x), cache)\n        return h + self.ffn(self.norm2(h))"
variant(PS11, "Llama block is post-norm", "Llama", MODEL | TRAIN, LLAMA_SOURCE.format(
    block="h = self.norm1(x + self.attn(x, cache))\n        return self.norm2(h + self.ffn(h))", final="h"))
variant(PS11, "Llama without the final norm", "Llama", MODEL | TRAIN,
        LLAMA_SOURCE.format(block=RIGHT_BLOCK, final="h"))
variant(PS11, "Block builds its norms without eps (always 1e-5)", "Llama", MODEL | TRAIN,
        LLAMA_SOURCE.format(block=RIGHT_BLOCK, final="self.norm_f(h)").replace("RMSNorm(d_model, eps)\n",
                                                                               "RMSNorm(d_model)\n"))
variant(PS11, "Llama block feeds the attention's output to both branches", "Llama", MODEL | TRAIN,
        LLAMA_SOURCE.format(block="h = self.attn(self.norm1(x), cache)\n        return x + h + self.ffn(self.norm2(h))",
                            final="self.norm_f(h)"))

ADAMW_SOURCE = """
class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t, m, v = state["step"], state["m"], state["v"]
                g = {grad}
                p.mul_({decay})
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = m / {correct1}
                v_hat = v / {correct2}
                p.sub_(lr * m_hat / {denominator})
"""
RIGHT_ADAMW = {"grad": "p.grad", "decay": "1 - lr * decay", "correct1": "(1 - beta1**t)",
               "correct2": "(1 - beta2**t)", "denominator": "(v_hat.sqrt() + eps)"}


def adamw_with(**wrong: str) -> str:
    return ADAMW_SOURCE.format(**{**RIGHT_ADAMW, **wrong})


ADAMW = {"test_adamw"} | TRAIN
variant(PS11, "AdamW without bias correction", "AdamW", ADAMW, adamw_with(correct1="1.0", correct2="1.0"))
variant(PS11, "AdamW with L2 regularisation instead of decoupled decay", "AdamW", ADAMW,
        adamw_with(grad="p.grad + decay * p", decay="1.0"))
variant(PS11, "AdamW decay not scaled by the learning rate", "AdamW", ADAMW, adamw_with(decay="1 - decay"))
variant(PS11, "AdamW with eps inside the square root", "AdamW", ADAMW, adamw_with(denominator="(v_hat + eps).sqrt()"))
variant(PS11, "AdamW bias correction one step late", "AdamW", ADAMW,
        adamw_with(correct1="(1 - beta1**(t + 1))", correct2="(1 - beta2**(t + 1))"))
variant(PS11, "AdamW treats a missing gradient as zero (decays, counts the step)", "AdamW", {"test_adamw"},
        adamw_with(grad="torch.zeros_like(p) if p.grad is None else p.grad").replace(
            "                if p.grad is None:\n                    continue\n", ""))

SCHEDULE_SOURCE = """
def lr_schedule(step, max_lr, min_lr, warmup_steps, cosine_steps):
    if step < warmup_steps:
        return {warmup}
    if step > cosine_steps:
        return min_lr
    progress = (step - warmup_steps) / (cosine_steps - warmup_steps)
    return {cosine}
"""
RIGHT_SCHEDULE = {"warmup": "max_lr * step / warmup_steps",
                  "cosine": "min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))"}
SCHEDULE = {"test_lr_schedule"} | TRAIN
variant(PS11, "warm-up starts at max_lr / warmup_steps (step + 1)", "lr_schedule", SCHEDULE,
        SCHEDULE_SOURCE.format(**{**RIGHT_SCHEDULE, "warmup": "max_lr * (step + 1) / warmup_steps"}))
variant(PS11, "cosine decays to zero instead of min_lr", "lr_schedule", SCHEDULE,
        SCHEDULE_SOURCE.format(**{**RIGHT_SCHEDULE, "cosine": "max_lr * 0.5 * (1.0 + math.cos(math.pi * progress))"}))

CLIP_SOURCE = """
def clip_grad_norm(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    {body}
"""
CLIP = {"test_clip"} | TRAIN
variant(PS11, "gradients clipped tensor by tensor", "clip_grad_norm", CLIP, CLIP_SOURCE.format(body="""for g in grads:
        own = g.norm()
        if own > max_norm:
            g.mul_(max_norm / (own + 1e-6))
    return norm"""))
variant(PS11, "clip_grad_norm computes the norm but never clips", "clip_grad_norm", CLIP,
        CLIP_SOURCE.format(body="return norm"))
variant(PS11, "clip_grad_norm fails on a parameter without a gradient", "clip_grad_norm", {"test_clip"},
        CLIP_SOURCE.format(body="""if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return norm""").replace("for p in parameters if p.grad is not None]", "for p in parameters]"))
variant(PS11, "clip_grad_norm returns the norm after clipping", "clip_grad_norm", {"test_clip"},
        CLIP_SOURCE.format(body="""if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return torch.sqrt(sum((g.double() ** 2).sum() for g in grads))"""))

CHECKPOINT_SOURCE = """
def save_checkpoint(path, model, optimizer, step):
    torch.save({{"model": model.state_dict(), "optimizer": {optimizer}, "step": step}}, path)


def load_checkpoint(path, model, optimizer):
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    {load_optimizer}
    return {step}
"""
RIGHT_CHECKPOINT = {"optimizer": "optimizer.state_dict()",
                    "load_optimizer": 'optimizer.load_state_dict(checkpoint["optimizer"])', "step": 'checkpoint["step"]'}
variant(PS11, "checkpoint without the optimizer state", "save_checkpoint", {"test_checkpoint"},
        CHECKPOINT_SOURCE.format(optimizer="None", load_optimizer="pass", step='checkpoint["step"]'))
variant(PS11, "resume restarts the schedule and the data at step 0", "save_checkpoint", {"test_checkpoint"},
        CHECKPOINT_SOURCE.format(**{**RIGHT_CHECKPOINT, "step": "0"}))

LOOP_SOURCE = """
def train_steps(model, optimizer, get_batch, start_step, end_step, hp):
    losses = []
    model.train()
    for step in range(start_step, end_step):
        lr = lr_schedule({schedule_step}, hp["max_lr"], hp["min_lr"], hp["warmup_steps"], hp["cosine_steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(step)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        {zero}
        loss.backward()
        {clip}
        optimizer.step()
        losses.append(loss.item())
    return losses
"""
RIGHT_LOOP = {"schedule_step": "step", "zero": "optimizer.zero_grad()",
              "clip": 'clip_grad_norm(model.parameters(), hp["clip"])'}
variant(PS11, "training loop returns smoothed losses", "train_steps", {"test_train_steps"},
        LOOP_SOURCE.format(**RIGHT_LOOP).replace("losses.append(loss.item())",
                                                 "losses.append(0.9 * (losses or [loss.item()])[-1] + 0.1 * loss.item())"))
variant(PS11, "training loop never zeroes the gradients", "train_steps", TRAIN,
        LOOP_SOURCE.format(**{**RIGHT_LOOP, "zero": "pass"}))
variant(PS11, "training loop reads the schedule one step ahead", "train_steps", TRAIN,
        LOOP_SOURCE.format(**{**RIGHT_LOOP, "schedule_step": "step + 1"}))
variant(PS11, "training loop clips before back-propagating", "train_steps", TRAIN,
        LOOP_SOURCE.format(**{**RIGHT_LOOP, "zero": 'optimizer.zero_grad()\n        clip_grad_norm(model.parameters(), hp["clip"])',
                              "clip": "pass"}))

UNTRAINED = Variant("the model is built but never trained", "model", frozenset({"test_heldout_loss"}), """
torch.manual_seed(0)
model = Llama(len(CORPUS["vocab"]), d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=172)
""")


# ---------------------------------------------------------------------------------------------------------------
# The in-process harness, without the training run
# ---------------------------------------------------------------------------------------------------------------


# The training checks run a few optimizer steps per case, with the reference's and the student's code: under three
# seeds (their deterministic edge cases are what makes a variant lose them), the other checks under ten (the held-out
# check costs about 0.1 s of CPU a seed).
SEEDS_OF = {"test_train_steps": range(3), "test_checkpoint": range(3)}


class FastHarness(Harness):
    """``test_wrong_variants.Harness`` with ``SEEDS_OF`` above."""

    def graded(self, seed: int) -> list[str]:
        return [gid for gid in self.module.CHECKS if seed in SEEDS_OF.get(gid, SEEDS)]


@functools.cache
def trained_state() -> dict:
    """The state_dict of the reference trained by the solution's recipe (seed 0; float32, one thread as the notebook
    trains), computed once per session."""
    import torch

    from autograder.assignments.ps11_loss_target import train_reference

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = train_reference(0)
    finally:
        torch.set_num_threads(threads)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _namespace(assignment: str, v: Variant | None = None) -> dict:
    """The notebook's namespace after every cell but the test cells, executed in the release folder (where the
    notebook finds its data files); instead of the training run, ``TRAINED_MODEL`` (or a variant of that cell)."""
    ns = _notebook_namespace(assignment, v, skip={TRAINING[assignment][0]}, cwd=ROOT / "exercises" / assignment)
    ns["TRAINED_STATE"] = trained_state()
    exec(compile(v.source if v is not None and v.cell == TRAINING[assignment][0] else TRAINED_MODEL,  # noqa: S102
                 f"<{assignment}: the trained model>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    """One harness per assignment, made on first use (its references are computed once per seed)."""
    return functools.cache(lambda assignment: FastHarness(assignment, tmp_path_factory.mktemp(assignment)))


ALL = [(a, v) for a, vs in VARIANTS.items() for v in vs]
IDS = [f"{a.split('-')[0]}: {v.name}" for a, v in ALL]


def test_every_capstone_function_has_wrong_variants():
    for assignment, variants in VARIANTS.items():
        cells = {cell.metadata["nbgrader"]["grade_id"] for cell in release(assignment, _notebook_name(assignment)).cells
                 if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code"}
        assert cells - {TRAINING[assignment][0]} <= {v.cell for v in variants}, cells - {v.cell for v in variants}
        assert len({v.name for v in variants}) == len(variants)


def _notebook_name(assignment: str) -> str:
    return assignments.load(assignment).NOTEBOOK


@pytest.mark.parametrize("assignment", sorted(VARIANTS))
def test_the_solution_loses_nothing(assignment, harnesses, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the checkpoint wrapper writes its file in the working directory
    harness, ns = harnesses(assignment), _namespace(assignment)
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


@pytest.mark.parametrize("assignment,v", ALL, ids=IDS)
def test_a_wrong_variant_loses_exactly_its_cells_under_every_seed(assignment, v, harnesses, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_loses_exactly(harnesses(assignment), _namespace(assignment, v), v)


@pytest.mark.parametrize("assignment,v", ALL, ids=IDS)
def test_a_wrong_variant_fails_visible_tests_only_where_it_loses_points(assignment, v, tmp_path, monkeypatch):
    """Some visible test of the cells the variant loses fails, and none of the cells it keeps. The visible held-out
    test scores the variant's own forward pass and the hidden one the reference's with the same weights, so a wrong
    Llama with well-trained weights fails only the visible one: it counts where the variant loses the hidden one."""
    monkeypatch.chdir(tmp_path)
    graded = set(_test_cells(assignment)) - ({TRAINING[assignment][1]} - v.loses)
    failing = set(_visible_failures(assignment, _namespace(assignment, v), graded))
    assert failing and failing <= v.loses, (sorted(failing), sorted(v.loses))


def test_ps11_release_files_are_what_the_generator_writes():
    """The data files beside the notebook (solutions/ and its release) hold the arrays the generator computes with
    llmarch (so the visible tests' expected values are the reference's): the same tokens and weights, and outputs
    equal up to float64 rounding (a matrix product's summation order may depend on the machine)."""
    from autograder.assignments import ps11_train

    for name, arrays in ps11_train.release_files().items():
        for folder in ("solutions", "exercises"):
            with np.load(ROOT / folder / PS11 / name) as saved:
                assert sorted(saved.files) == sorted(arrays), (folder, name)
                for key, value in arrays.items():
                    where = f"{folder}/{PS11}/{name}: {key}"
                    if value.dtype.kind in "iuU":
                        np.testing.assert_array_equal(saved[key], value, err_msg=where)
                    else:
                        np.testing.assert_allclose(saved[key], value, rtol=1e-12, atol=1e-14, err_msg=where)


def test_ps11_training_clip_acts_at_every_step():
    """The training checks clip far below the gradient norms, so that clipping acts at every step: the global
    gradient norm of the reference model, at its random weights, on the first batch of every case."""
    import torch
    import torch.nn.functional as F

    from autograder.assignments import ps11_train as m

    for seed in range(10):
        rng = np.random.default_rng(seed)
        for case in m._train_steps(rng) + m._resume(rng):
            weights, config, xs, ys, hp = case.args[:5]
            model = m._loaded(config, weights).train()
            logits = model(torch.as_tensor(xs[0]))
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(ys[0]).reshape(-1)).backward()
            norm = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
            assert norm > 5 * hp["clip"], (seed, float(norm), hp["clip"])


# ---------------------------------------------------------------------------------------------------------------
# The real command line
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_ps11_full_marks_zero_and_twenty_identical_rows_through_the_command_line(tmp_path):
    """The solution (training run included) gets full marks, the release zero, and 20 copies of an untrained
    submission identical rows that lose exactly the held-out loss. The wall-clock limit per cell is raised above
    the default 60 s because this test machine may be shared; the CPU time the training used is in the CSV."""
    notebook = _notebook_name(PS11)
    subs = tmp_path / "subs"
    write(submission(PS11, notebook), subs / "solved", notebook)
    write(release(PS11, notebook), subs / "untouched", notebook)
    write_copies(submission(PS11, notebook, answers={UNTRAINED.cell: UNTRAINED.source}), subs, notebook)
    out = tmp_path / "out"
    assert grader_main(["grade", PS11, str(subs), "--out", str(out), "--workers", "2", "--timeout", "240",
                        "--notebook-timeout", "600"]) == 0
    rows = read_grades(out)
    full = sum(i.points for i in _release_items(PS11))
    assert rows["solved"]["status"] == "graded" and float(rows["solved"]["score"]) == full, rows["solved"]
    assert rows["untouched"]["status"] == "graded" and float(rows["untouched"]["score"]) == 0, rows["untouched"]
    assert_copies_identical(rows, PS11, UNTRAINED.loses)


def _release_items(assignment):
    from autograder.notebooks import Template

    return Template.from_release(nbformat.read(ROOT / "exercises" / assignment / _notebook_name(assignment),
                                               as_version=4)).auto_items


def test_ps11_loss_target_is_the_notebooks_and_the_reference_meets_it_under_ten_seeds():
    """The target of the verdict is the one the notebook states, and the committed evidence (the reference trained
    under the notebook's budget, 10 seeds: autograder/assignments/ps11_loss_target.csv) is below it every time."""
    from autograder.assignments import ps11_train as m

    test_cell = _test_cells(PS11)["test_heldout_loss"]
    assert f"loss < {m.LOSS_TARGET}" in test_cell
    with open(ROOT / "autograder" / "assignments" / "ps11_loss_target.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["seed"]) for r in rows] == list(range(10))
    assert all(float(r["heldout_loss"]) < m.LOSS_TARGET for r in rows), rows
