"""Every model family on every attention backend equals the reference path (issue 23, part 2).

float64 on CPU for "sdpa", "flash", "flex" and "auto"; "triton" in its interpreter (float32, a fresh process
with TRITON_INTERPRET=1). Covered: full forward, KV-cache decoding (one query, and a chunk of queries at the
end of the keys: the bottom-right causal mask), gradients, grouped-query attention, BERT's and the
encoder-decoder's padding masks, and the ALiBi and T5 biases; and the errors where a backend cannot follow.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import llmarch.efficient.dispatch as dispatch
from llmarch.attention import MultiHeadAttention, set_attention_backend
from llmarch.kv_cache import KVCache
from llmarch.model import (
    GPT, BertForMaskedLM, EncoderDecoder, EncoderDecoderConfig, GPTConfig, bert_config, gpt2_config, llama_config,
)

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=40, context_length=32, d_model=32, n_layers=2, n_heads=4)
FAMILIES = {
    "gpt2": gpt2_config(**TINY),
    "llama-gqa": llama_config(**TINY, n_kv_heads=2, d_ff=64, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "mqa": GPTConfig(**TINY, n_kv_heads=1, pos_encoding="rope"),
    "alibi": GPTConfig(**TINY, pos_encoding="alibi"),
    "t5": GPTConfig(**TINY, pos_encoding="t5"),
    "kerple": GPTConfig(**TINY, pos_encoding="kerple"),
    "qk-norm-window": llama_config(**TINY, n_kv_heads=2, d_ff=64, qk_norm=True, sliding_window=5),
}
BIASED = {"alibi", "t5", "kerple", "qk-norm-window"}  # a bias or a window mask: not for flash
F64 = dict(atol=1e-10, rtol=1e-10)


def ids(*shape, seed=0):
    return torch.randint(2, 40, shape, generator=torch.Generator().manual_seed(seed))


def with_backend(model, backend):
    return set_attention_backend(copy.deepcopy(model), backend)


def cached_logits(model, idx):
    """Logits of ``idx`` fed as a prefill of 5 tokens, one token, then a chunk of the rest (t_q > 1 after a
    cache: queries at the end of the keys)."""
    cache = KVCache(len(model.blocks))
    parts = [model(idx[:, :5], kv_cache=cache), model(idx[:, 5:6], kv_cache=cache),
             model(idx[:, 6:], kv_cache=cache)]
    return torch.cat(parts, dim=1)


@pytest.fixture(scope="module")
def gpt_models():
    torch.manual_seed(0)
    return {name: GPT(config).double().eval() for name, config in FAMILIES.items()}


# Every family on SDPA; flash on the unbiased ones (it takes no bias); Flex (slow on CPU: it is evaluated
# densely, uncompiled) on GQA and both biases; "auto" is SDPA on CPU, once.
GPT_CASES = ([(name, "sdpa") for name in sorted(FAMILIES)] + [(name, "flash") for name in sorted(FAMILIES)
             if name not in BIASED] + [("llama-gqa", "flex"), ("alibi", "flex"), ("t5", "flex"), ("kerple", "flex"), ("mqa", "auto")])


@pytest.mark.parametrize("name,backend", GPT_CASES)
def test_gpt_family_on_backend_equals_reference(gpt_models, name, backend):
    reference = gpt_models[name]
    fast = with_backend(reference, backend)
    idx = ids(2, 11)
    expected = reference(idx)
    with torch.no_grad():  # FlexAttention has no CPU backward
        torch.testing.assert_close(fast(idx), expected, **F64)
        torch.testing.assert_close(cached_logits(fast, idx), expected.detach(), **F64)
    if backend in ("sdpa", "flash"):
        grads = torch.autograd.grad(fast(idx).square().sum(), list(fast.parameters()))
        ref_grads = torch.autograd.grad(expected.square().sum(), list(reference.parameters()))
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, **F64)


@pytest.mark.parametrize("backend", ["flash", "triton"])
def test_backends_without_a_bias_say_so(gpt_models, backend):
    fast = with_backend(gpt_models["alibi"], backend)
    with pytest.raises(ValueError, match=f"backend '{backend}' cannot take a bias: use one of"):
        fast(ids(1, 6))


def test_weights_only_from_the_reference():
    mha = MultiHeadAttention(16, 2, backend="sdpa")
    with pytest.raises(ValueError, match="return_weights=True needs backend='reference'"):
        mha(torch.randn(1, 4, 16), return_weights=True)
    with pytest.raises(ValueError, match="attn_backend must be one of"):
        GPTConfig(**TINY, attn_backend="fast")
    with pytest.raises(ValueError, match="attention backend must be one of"):
        MultiHeadAttention(16, 2, backend="cuda")


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_grouped_query_attention_never_repeats_keys_and_values(gpt_models, backend, monkeypatch):
    reference = gpt_models["llama-gqa"]
    fast = with_backend(reference, backend)
    idx = ids(2, 9)
    expected = reference(idx).detach()

    def refuse(*args, **kwargs):
        raise AssertionError("repeat_kv was called")

    monkeypatch.setattr(dispatch, "repeat_kv", refuse)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    with torch.no_grad():
        torch.testing.assert_close(fast(idx), expected, **F64)


def test_training_dropout_only_where_a_backend_has_it():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, dropout=0.1)).train()
    set_attention_backend(model, "sdpa")
    model(ids(1, 6)).sum().backward()  # SDPA takes dropout_p
    set_attention_backend(model, "flash")
    with pytest.raises(ValueError, match="backend 'flash' cannot take attention dropout"):
        model(ids(1, 6))


def padding():
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    return mask


@pytest.mark.parametrize("backend", ["sdpa", "flash", "flex"])
def test_bert_with_padding_on_backend_equals_reference(backend):
    torch.manual_seed(0)
    config = bert_config(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_position_embeddings=32, dropout=0.0)
    reference = BertForMaskedLM(config).double().eval()
    fast = with_backend(reference, backend)
    idx, segments = ids(2, 9), torch.zeros(2, 9, dtype=torch.long)
    expected = reference(idx, segments, padding())
    with torch.no_grad():
        torch.testing.assert_close(fast(idx, segments, padding()), expected, **F64)
    assert fast.config.attn_backend == backend
    if backend != "flex":
        grads = torch.autograd.grad(fast(idx, segments, padding()).square().sum(), list(fast.parameters()))
        ref_grads = torch.autograd.grad(expected.square().sum(), list(reference.parameters()))
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, **F64)
    if backend == "sdpa":
        with pytest.raises(ValueError, match="backend 'triton' cannot take a mask"):
            set_attention_backend(fast, "triton")(idx, segments, padding())


@pytest.mark.parametrize("backend", ["sdpa", "flash", "flex"])
def test_encoder_decoder_on_backend_equals_reference(backend):
    torch.manual_seed(0)
    config = EncoderDecoderConfig(vocab_size=40, max_source_length=32, max_target_length=32, d_model=32, n_heads=4)
    reference = EncoderDecoder(config).double().eval()
    fast = with_backend(reference, backend)
    src, tgt = ids(2, 9), ids(2, 6, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(fast(src, tgt, padding()), reference(src, tgt, padding()), **F64)
        if backend != "flex":  # cached decoding is covered by the GPT families on flex
            assert torch.equal(fast.generate(src, 6, src_mask=padding()),
                               reference.generate(src, 6, src_mask=padding()))


def test_flash_saves_no_none_for_backward():
    from llmarch.efficient import flash_attention

    q = torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True)
    out = flash_attention(q, q, q, is_causal=True)
    saved = out.grad_fn.saved_tensors
    assert all(isinstance(t, torch.Tensor) for t in saved)
    lse = [t for t in saved if t.shape == (1, 2, 8)]
    torch.testing.assert_close(lse[0], torch.logsumexp((q @ q.transpose(-1, -2) / 2).masked_fill(
        ~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf")), dim=-1), **F64)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_models_on_triton_in_the_interpreter_equal_reference():
    code = """
        import copy, json
        import torch
        from llmarch.attention import set_attention_backend
        from llmarch.kv_cache import KVCache
        from llmarch.model import GPT, GPTConfig, llama_config
        torch.manual_seed(0)
        tiny = dict(vocab_size=40, context_length=32, d_model=32, n_layers=1, n_heads=2)
        errors = {}
        for name, config in {"gpt2": GPTConfig(**tiny), "llama-gqa": llama_config(**tiny, n_kv_heads=1, d_ff=64)}.items():
            reference = GPT(config).eval()
            fast = set_attention_backend(copy.deepcopy(reference), "triton")
            idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
            expected = reference(idx)
            got = fast(idx)
            grads = torch.autograd.grad(got.square().sum(), list(fast.parameters()))
            ref_grads = torch.autograd.grad(expected.square().sum(), list(reference.parameters()))
            cache = KVCache(1)
            with torch.no_grad():
                stepped = torch.cat([fast(idx[:, :5], kv_cache=cache), fast(idx[:, 5:6], kv_cache=cache),
                                     fast(idx[:, 6:], kv_cache=cache)], dim=1)
            errors[name] = [(got - expected).abs().max().item(), (stepped - expected).abs().max().item(),
                            max((a - b).abs().max().item() for a, b in zip(grads, ref_grads))]
        print(json.dumps(errors))
    """
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    for name, errs in json.loads(result.stdout.strip().splitlines()[-1]).items():
        assert max(errs) < 1e-5, (name, errs)  # float32 throughout, dots in "ieee" float32


def test_training_runs_on_sdpa_and_gives_each_layer_its_backend_back(monkeypatch):
    from llmarch.train import train

    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    seen = []
    monkeypatch.setattr(dispatch, "_sdpa", lambda *args: seen.append(1) or F.scaled_dot_product_attention(
        *args[:3], attn_mask=None, is_causal=True))
    train(model, torch.randint(0, 40, (400,)), steps=2, context_length=16, batch_size=2)
    assert seen and all(m.backend == "reference" for m in model.modules() if isinstance(m, MultiHeadAttention))


# ---------------------------------------------------------------------------------------------------------------
# "auto" as it decides on CUDA (simulated here: the kernels it picks run on this CPU, flex eagerly), and flex's
# block mask, built once per forward pass
# ---------------------------------------------------------------------------------------------------------------
WINDOWED = llama_config(**{**TINY, "n_layers": 4}, n_kv_heads=2, d_ff=64, sliding_window=5)


@pytest.fixture
def auto_as_on_cuda(monkeypatch):
    """Every layer's "auto" decides as on a CUDA device: ``choose_backend("cuda", ...)`` of its real inputs."""
    import llmarch.attention

    def on_cuda(q, mask=None, dropout_p=0.0):
        return dispatch.choose_backend("cuda", mask is not None, dropout_p, q.shape[-2])

    monkeypatch.setattr(llmarch.attention, "select_backend", on_cuda)


@pytest.fixture
def block_masks(monkeypatch):
    """The list of the block masks flex builds, (B, H, t_q, t_k) each, from a clean slate."""
    import torch.nn.attention.flex_attention as flex_module

    built, create = [], flex_module.create_block_mask
    monkeypatch.setattr(flex_module, "create_block_mask", lambda fn, *shape, **kw: built.append(shape) or create(
        fn, *shape, **kw))
    monkeypatch.setattr(dispatch, "_LAST_BLOCK_MASK", [])
    return built


def attention_layers(model):
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def test_the_auto_rule_on_cuda_and_elsewhere():
    choose = dispatch.choose_backend
    assert choose("cuda", has_mask=True) == "flex"
    assert choose("cuda", has_mask=True, dropout_p=0.1) == "sdpa"  # flex takes no dropout
    assert choose("cuda", has_mask=True, t_q=1) == "sdpa"  # a decoding step
    assert choose("cuda", has_mask=False) == "sdpa"
    assert {choose("cpu", m, p, t) for m in (True, False) for p in (0.0, 0.1) for t in (1, 4)} == {"sdpa"}
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    assert dispatch.select_backend(q, torch.ones(3, 3, dtype=torch.bool), 0.1) == "sdpa"  # on this CPU


def test_auto_on_cuda_trains_bert_with_padding_and_dropout(auto_as_on_cuda):
    """The fine-tuning that failed on a GPU with "backend 'flex' cannot take attention dropout": in training
    (dropout 0.1) every layer picks SDPA and says so; in evaluation the padded input goes to flex."""
    torch.manual_seed(0)
    config = bert_config(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_position_embeddings=32, dropout=0.1)
    reference = BertForMaskedLM(config).double()
    fast = with_backend(reference, "auto").train()
    idx, segments = ids(2, 9), torch.zeros(2, 9, dtype=torch.long)
    fast(idx, segments, padding()).square().sum().backward()
    assert [m.last_backend for m in attention_layers(fast)] == ["sdpa", "sdpa"]
    fast.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(idx, segments, padding()), reference.eval()(idx, segments, padding()), **F64)
    assert [m.last_backend for m in attention_layers(fast)] == ["flex", "flex"]


def test_flex_builds_one_block_mask_per_forward_for_all_layers(block_masks):
    torch.manual_seed(0)
    for config in (WINDOWED, GPTConfig(**{**TINY, "n_layers": 4})):  # a window mask; causal only
        reference = GPT(config).double().eval()
        fast = with_backend(reference, "flex")
        block_masks.clear()
        with torch.no_grad():
            for seed in range(2):
                idx = ids(2, 11, seed=seed)
                torch.testing.assert_close(fast(idx), reference(idx), **F64)
                assert len(block_masks) <= seed + 1, block_masks  # once per forward at most, not once per layer
        assert block_masks[0] == (2, 4, 11, 11)
        assert {m.last_backend for m in attention_layers(fast)} == {"flex"}


def test_auto_on_cuda_sends_decoding_steps_to_sdpa(auto_as_on_cuda, block_masks):
    """A prompt of 7 tokens goes to flex with one block mask for the 4 layers; then each one-token step goes to
    SDPA and builds none. The logits equal the reference path's, with the rolling cache."""
    torch.manual_seed(0)
    reference = GPT(WINDOWED).double().eval()
    fast = with_backend(reference, "auto")
    seq = ids(2, 17)
    cache = fast.new_kv_cache()
    with torch.no_grad():
        steps = [fast(seq[:, :7], kv_cache=cache)]
        assert len(block_masks) == 1 and {m.last_backend for m in attention_layers(fast)} == {"flex"}
        for t in range(7, 17):
            steps.append(fast(seq[:, t:t + 1], kv_cache=cache))
            assert {m.last_backend for m in attention_layers(fast)} == {"sdpa"}
        torch.testing.assert_close(torch.cat(steps, dim=1), reference(seq), **F64)
    assert len(block_masks) == 1 and cache.held == 5
