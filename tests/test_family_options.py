"""The GPTConfig options of the 2024-25 families (Gemma 2/3, OLMo 2, Qwen2/3, Phi-3, Pythia), each against its
equation written out here, without transformers: Gemma's 1 + w RMSNorm, soft-capped attention, the sandwich,
output and parallel-residual blocks, QK-norm per head and per projection, per-layer windows and RoPE bases with
the KV cache, and the errors that name a bad option. test_hf_families.py compares whole models with transformers.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmarch.attention import MultiHeadAttention, set_attention_backend, softcapped_attention
from llmarch.kv_cache import KVCache
from llmarch.layers import OffsetRMSNorm, TransformerBlock
from llmarch.model import GPT, llama_config

TINY = dict(vocab_size=40, context_length=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=48)


def _gemma3_like(**overrides):
    """Sandwich norms with gain 1 + w, head_dim 12 != 32/4, per-head QK-norm, a window of 3 on layers 0, 1, 3
    with RoPE base 100, a full layer 2 with base 10,000 and linear scaling."""
    config = llama_config(**TINY, head_dim=12, norm="rmsnorm_offset", norm_placement="sandwich", qk_norm="head",
                          activation="gelu_tanh", scale_embeddings=True, attn_scale=0.2, sliding_window=3,
                          layer_types=("sliding", "sliding", "full", "sliding"), rope_local_base=100.0, rope_base=1e4,
                          rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_embeddings=True)
    return dataclasses.replace(config, **overrides)


def _model(config, seed=0):
    torch.manual_seed(seed)
    model = GPT(config).double().eval()
    with torch.no_grad():  # norm gains away from their initial values, so that each one matters
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _ids(length=20, seed=1):
    return torch.randint(0, 40, (2, length), generator=torch.Generator().manual_seed(seed))


def test_offset_rms_norm_is_x_over_its_rms_times_one_plus_w():
    norm = OffsetRMSNorm(6, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    torch.testing.assert_close(norm(x), expected, rtol=1e-13, atol=1e-13)
    assert torch.equal(OffsetRMSNorm(4).weight, torch.zeros(4))  # the identity gain at initialisation


def test_softcapped_attention_equals_a_loop_over_its_definition():
    """softmax_j(cap tanh(q_i . k_j * scale / cap)) over the keys j <= i, one query at a time."""
    torch.manual_seed(0)
    q, k, v = (3 * torch.randn(2, 3, 7, 5, dtype=torch.float64) for _ in range(3))
    cap, scale = 1.5, 0.7
    out, _ = softcapped_attention(q, k, v, cap, is_causal=True, scale=scale)
    expected = torch.empty_like(out)
    for i in range(7):
        dots = (q[..., i : i + 1, :] @ k[..., : i + 1, :].transpose(-1, -2))[..., 0, :]  # (B, H, i + 1)
        scores = cap * torch.tanh(dots * scale / cap)
        expected[..., i, :] = (torch.softmax(scores, dim=-1)[..., None, :] @ v[..., : i + 1, :])[..., 0, :]
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert (out - softcapped_attention(q, k, v, 100.0, is_causal=True, scale=scale)[0]).abs().max() > 1e-2


def _block(placement=None, parallel=False, **kw):
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, d_ff=24, norm="rmsnorm", norm_placement=placement, parallel_residual=parallel,
                             **kw).double().eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return block


@pytest.mark.parametrize("placement", ["sandwich", "output", "parallel"])
def test_block_norm_placements_follow_their_equations(placement):
    block = _block(None if placement == "parallel" else placement, parallel=placement == "parallel")
    x = torch.randn(2, 6, 16, dtype=torch.float64)

    def attn(h):
        return block.attn(h, is_causal=True)

    if placement == "sandwich":  # Gemma 2/3
        h = x + block.post_norm1(attn(block.norm1(x)))
        expected = h + block.post_norm2(block.ffn(block.norm2(h)))
    elif placement == "output":  # OLMo 2
        h = x + block.norm1(attn(x))
        expected = h + block.norm2(block.ffn(h))
    else:  # GPT-NeoX / Pythia
        expected = x + attn(block.norm1(x)) + block.ffn(block.norm2(x))
    torch.testing.assert_close(block(x, is_causal=True), expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("qk_norm", ["head", "projection"])
def test_qk_norm_normalises_each_head_or_the_whole_projection(qk_norm):
    """Per head (Qwen3, Gemma 3): every head's query has RMS 1 before the gain; per projection (OLMo 2): only the
    concatenation of all heads' queries does."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2, qk_norm=qk_norm, qk_norm_eps=0.0).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    q, k, _ = mha.project_qkv(x)  # (B, H, T, d_head); the gains are still ones
    per_head_rms = q.pow(2).mean(-1).sqrt()
    whole_rms = q.transpose(1, 2).reshape(2, 5, -1).pow(2).mean(-1).sqrt()
    assert mha.q_norm.weight.shape == ((4,) if qk_norm == "head" else (16,))
    if qk_norm == "head":
        torch.testing.assert_close(per_head_rms, torch.ones_like(per_head_rms))
    else:
        torch.testing.assert_close(whole_rms, torch.ones_like(whole_rms))
        assert (per_head_rms - 1).abs().max() > 0.05


def test_layer_types_window_only_the_sliding_layers_with_their_own_rope():
    model = _model(_gemma3_like())
    assert model.layer_types == ["sliding", "sliding", "full", "sliding"]
    local, full = model.blocks[0].attn.rotary, model.blocks[2].attn.rotary
    assert local is model.blocks[3].attn.rotary and local.base == 100.0 and local.scaling is None
    assert full.base == 10000.0 and full.scaling["factor"] == 2.0
    ids = _ids(length=12)
    with torch.no_grad():  # inside the window (3 tokens) every layer sees all keys: windows change nothing yet
        unwindowed = _model(_gemma3_like(sliding_window=64))  # the same layers and RoPEs, a window never reached
        torch.testing.assert_close(model(ids[:, :3]), unwindowed(ids[:, :3]), rtol=1e-12, atol=1e-12)
        assert (model(ids) - unwindowed(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_kv_cache_decoding_equals_a_full_recompute_with_per_layer_windows(backend):
    model = set_attention_backend(_model(_gemma3_like(attn_softcap=None)), backend)
    ids = _ids(length=16)
    cache = KVCache(4)
    with torch.no_grad():
        steps = [model(ids[:, :5], kv_cache=cache)] + [model(ids[:, t : t + 1], kv_cache=cache) for t in range(5, 16)]
        full = set_attention_backend(model, "reference")(ids)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)


def test_soft_caps_bound_the_logits_and_need_the_reference_backend():
    model = _model(_gemma3_like(attn_softcap=1.0, final_softcap=0.5))
    with torch.no_grad():
        assert model(_ids()).abs().max() < 0.5
    set_attention_backend(model, "sdpa")
    with pytest.raises(ValueError, match="soft-cap"):
        model(_ids())


@pytest.mark.parametrize("overrides,message", [
    ({"head_dim": 0}, "head_dim"),
    ({"d_model": 30, "head_dim": None}, "head_dim"),
    ({"qk_norm": "layer"}, "qk_norm"),
    ({"norm_placement": "middle"}, "norm_placement"),
    ({"norm_placement": "sandwich", "parallel_residual": True}, "parallel_residual"),
    ({"attn_softcap": -1.0}, "attn_softcap"),
    ({"final_softcap": 0.0}, "final_softcap"),
    ({"attn_scale": 0.0}, "attn_scale"),
    ({"layer_types": ("full", "sliding")}, "layer_types"),
    ({"layer_types": ("full", "local", "full", "full")}, "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"rope_local_base": -5.0}, "rope_local_base"),
    ({"pos_encoding": "alibi", "rope_scaling": None}, "rope_local_base"),
])
def test_family_option_errors_name_the_option(overrides, message):
    with pytest.raises(ValueError, match=message):
        _gemma3_like(**overrides)


def test_qk_norm_true_means_per_head():
    assert llama_config(**TINY, qk_norm=True).qk_norm == "head"
