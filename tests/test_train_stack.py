"""llmarch.optim and the training stack of llmarch.train, each against an oracle: torch's AdamW and
clip_grad_norm_, the definition of the schedule on worked points, the large batch for gradient accumulation,
and an uninterrupted run for a stopped and resumed one (bit for bit)."""

import logging
import math

import numpy as np
import pytest
import torch

from llmarch.model import GPT, GPTConfig
from llmarch.optim import AdamW, cosine_schedule
from llmarch.train import (
    MemmapBatches,
    clip_grad_norm,
    load_checkpoint,
    save_checkpoint,
    train_step,
    weight_decay_groups,
    write_token_file,
)

TINY = dict(vocab_size=11, context_length=8, d_model=16, n_layers=2, n_heads=2)


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides}))


def test_adamw_equals_torch_adamw_step_for_step_in_float64():
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (3,), (2, 2, 2)]
    ours = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    kwargs = dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6)
    opt = AdamW([{"params": ours[:2], "weight_decay": 0.1}, {"params": ours[2:], "weight_decay": 0.0}], **kwargs)
    ref = torch.optim.AdamW([{"params": theirs[:2], "weight_decay": 0.1},
                             {"params": theirs[2:], "weight_decay": 0.0}], foreach=False, **kwargs)
    for step in range(30):
        for group in (*opt.param_groups, *ref.param_groups):
            group["lr"] = cosine_schedule(step, 3e-2, 3e-3, 5, 25)
        for a, b in zip(ours, theirs):
            g = torch.randn(a.shape, generator=gen, dtype=torch.float64) * 10 ** (step % 4 - 2)
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for a, b in zip(ours, theirs):
            assert (a - b).abs().max().item() < 1e-12
    assert torch.equal(opt.state[ours[0]]["step"], ref.state[theirs[0]]["step"])


def test_adamw_rejects_bad_hyperparameters():
    p = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="betas"):
        AdamW(p, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="lr"):
        AdamW(p, lr=-1.0)


def test_cosine_schedule_on_its_definition():
    lr = lambda t: cosine_schedule(t, max_lr=1.0, min_lr=0.1, warmup_steps=10, cosine_steps=110)  # noqa: E731
    assert lr(0) == 0.0 and lr(5) == 0.5 and lr(10) == 1.0
    assert lr(60) == pytest.approx(0.55)  # half way: cos(pi/2) = 0
    assert lr(35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr(110) == pytest.approx(0.1) and lr(111) == 0.1 and lr(10_000) == 0.1
    with pytest.raises(ValueError, match="warmup_steps <= cosine_steps"):
        cosine_schedule(0, 1.0, 0.1, 10, 5)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_equals_torch(max_norm):
    gen = torch.Generator().manual_seed(1)
    ours = [torch.randn(s, generator=gen, requires_grad=True) for s in [(4, 3), (7,)]]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn(a.shape, generator=gen)
        b.grad = a.grad.clone()
    norm = clip_grad_norm(ours, max_norm)
    ref = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    torch.testing.assert_close(norm, ref)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)


def test_weight_decay_groups_name_matrices_only():
    groups = {g["name"]: g for g in weight_decay_groups(_model(tie_embeddings=False), 0.1)}
    assert groups["decay"]["weight_decay"] == 0.1 and groups["no_decay"]["weight_decay"] == 0.0
    assert groups["decay"]["names"] == [
        f"blocks.{i}.{m}.weight" for i in range(2)
        for m in ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "ffn.w1", "ffn.w2"]
    ] + ["lm_head.weight"]
    no_decay = set(groups["no_decay"]["names"])
    assert {"tok_emb.weight", "pos_emb.weight", "norm_f.weight", "norm_f.bias", "blocks.0.norm1.weight",
            "blocks.1.attn.q_proj.bias", "blocks.1.ffn.w2.bias"} <= no_decay
    tied = {g["name"]: g["names"] for g in weight_decay_groups(_model(), 0.1)}
    assert "lm_head.weight" not in tied["decay"] + tied["no_decay"]  # tied: it is tok_emb.weight, not decayed
    assert "tok_emb.weight" in tied["no_decay"]


def test_memmap_batches_read_windows_of_the_file_and_split_the_batch_over_ranks(tmp_path):
    ids = np.arange(1000) % 11
    tokens = write_token_file(tmp_path / "tokens.bin", ids)
    assert isinstance(tokens, np.memmap)
    whole = MemmapBatches(tmp_path / "tokens.bin", global_batch=6, context_length=8, seed=3)
    x, y = next(whole)
    assert x.shape == y.shape == (6, 8) and x.dtype == torch.long and whole.position == 1
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    for row in x:  # each row is a window of the file
        start = int(np.flatnonzero(ids == int(row[0]))[0])
        assert torch.equal(row, torch.from_numpy((np.arange(start, start + 8) % 11).astype(np.int64)))
    parts = [MemmapBatches(tokens, 6, 8, seed=3, rank=r, world_size=3).batch(0)[0] for r in range(3)]
    assert torch.equal(torch.cat(parts), x)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        MemmapBatches(tmp_path / "missing.bin", 6, 8)
    with pytest.raises(ValueError, match="not divisible by world_size 4"):
        MemmapBatches(tokens, 6, 8, world_size=4)


def _run(model, optimizer, batches, steps, start=0):
    for step in range(start, steps):
        for group in optimizer.param_groups:
            group["lr"] = cosine_schedule(step, 1e-2, 1e-3, 1, 4)
        train_step(model, optimizer, [next(batches), next(batches)], grad_clip=1.0)  # 2 micro-batches


def test_stopped_and_resumed_run_equals_uninterrupted_bit_for_bit(tmp_path):
    tokens = write_token_file(tmp_path / "t.bin", np.random.default_rng(0).integers(0, 11, 500))

    def fresh(seed):
        model = _model(seed, dropout=0.1)  # dropout: the torch RNG state must be restored too
        return model, AdamW(weight_decay_groups(model, 0.1), lr=1e-2), MemmapBatches(tokens, 2, 8, seed=1)

    model, opt, batches = fresh(0)
    _run(model, opt, batches, 4)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt, batches = fresh(0)
    _run(model, opt, batches, 2)
    save_checkpoint(tmp_path / "ckpt.pt", model, opt, 2, batches=batches.state_dict())
    torch.manual_seed(123)  # the RNG moves on before the restart
    model, opt, batches = fresh(7)
    extra = {}
    step = load_checkpoint(tmp_path / "ckpt.pt", model, opt, extra)
    batches.load_state_dict(extra["batches"])
    assert step == 2 and batches.position == 4
    _run(model, opt, batches, 4, start=step)
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_load_checkpoint_names_a_missing_file(tmp_path):
    model = _model()
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(tmp_path / "nope.pt", model, AdamW(model.parameters()))


def test_gradient_accumulation_equals_the_large_batch():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 11, (8, 8), generator=gen)
    y = torch.randint(0, 11, (8, 8), generator=gen)
    params = []
    for micro in (1, 4):
        model = _model(0).double()
        opt = AdamW(model.parameters(), lr=1e-2)
        result = train_step(model, opt, list(zip(x.chunk(micro), y.chunk(micro))), grad_clip=0.5)
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert not result.skipped
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=1e-12)


def test_loss_spike_guard_skips_non_finite_steps_and_logs_them(caplog):
    model = _model(0)
    opt = AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    batch = [(torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8)))]
    handle = model.blocks[0].ffn.w1.weight.register_hook(lambda g: g * math.inf)
    with caplog.at_level(logging.WARNING, logger="llmarch.train"):
        result = train_step(model, opt, batch)
    handle.remove()
    assert result.skipped == "non-finite grad norm" and not opt.state
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "step skipped (non-finite grad norm)" in caplog.text
    with torch.no_grad():
        model.tok_emb.weight[3] = math.nan
    result = train_step(model, opt, [(torch.full((2, 8), 3), batch[0][1])])
    assert result.skipped == "non-finite loss" and not opt.state
    assert all(p.grad is None for p in model.parameters())
    with torch.no_grad():
        model.tok_emb.weight[3] = 0.0
    assert train_step(model, opt, batch).skipped == "" and opt.state  # finite again: the step is taken


class _Arbitrary:
    """An object that only a full unpickler could rebuild."""


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_clip_grad_norm_on_a_non_finite_norm_does_what_torch_does(bad):
    """torch 2.13, error_if_nonfinite=False: an infinite norm scales by 0 (finite gradients become 0, the
    infinite one NaN); a NaN norm makes every gradient NaN."""
    ours = [torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    for params in (ours, theirs):
        params[0].grad, params[1].grad = torch.tensor([1.0, bad, 2.0]), torch.tensor([3.0, 4.0])
    norm = clip_grad_norm(ours, 1.0)
    ref = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    torch.testing.assert_close(norm, ref, equal_nan=True)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, equal_nan=True, rtol=0, atol=0)


def test_checkpoints_load_with_weights_only_and_carry_the_cuda_rng_states(tmp_path, monkeypatch):
    """No GPU here: CUDA's RNG calls are recorded. The file holds tensors and plain values only, so
    torch.load(weights_only=True) reads it; an arbitrary object in it is refused."""
    cuda_state = [torch.arange(8, dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: cuda_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    model = _model()
    opt = AdamW(model.parameters())
    np.random.seed(3)
    save_checkpoint(tmp_path / "c.pt", model, opt, 5)
    expected = np.random.random()
    assert torch.load(tmp_path / "c.pt", weights_only=True)["rng"]["cuda"][0].tolist() == list(range(8))
    assert load_checkpoint(tmp_path / "c.pt", model, opt) == 5
    assert restored and torch.equal(restored[0][0], cuda_state[0])
    assert np.random.random() == expected  # numpy's state survives its trip through tensors

    save_checkpoint(tmp_path / "bad.pt", model, opt, 5, payload=_Arbitrary())
    with pytest.raises(Exception, match="weights_only"):
        load_checkpoint(tmp_path / "bad.pt", model, opt)


def test_fp16_step_after_a_forward_overflow_follows_torch_grad_scaler():
    """Step 1's logits are infinite: the step is skipped, the scale backs off to 2^15, and the next steps run
    (the scaler's cycle was completed), as with torch.amp.GradScaler on the same loop."""
    from llmarch.train import LossScaler

    x, y = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(0)), torch.randint(0, 11, (4, 8))
    runs = []
    for ours in (True, False):
        model = _model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)  # linear in the gradients: fp16 noise stays small
        scaler = LossScaler() if ours else torch.amp.GradScaler("cpu")
        poisoned = [False]
        model.register_forward_hook(lambda m, args, out: out * math.inf if poisoned[0] else None)
        scales, skipped = [], []
        for step in range(4):
            poisoned[0] = step == 1
            if ours:
                skipped.append(bool(train_step(model, opt, [(x, y)], precision="fp16", scaler=scaler).skipped))
            else:
                with torch.autocast("cpu", dtype=torch.float16):
                    logits = model(x)
                scaler.scale(torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
            scales.append(scaler.get_scale())
        runs.append((scales, skipped, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (scales, skipped, weights), (ref_scales, _, ref_weights) = runs
    assert skipped == [False, True, False, False]
    assert scales == ref_scales == [2.0**16, 2.0**15, 2.0**15, 2.0**15]
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-5)
