"""Multi-head latent attention (llmarch.mla): a loop over its definition, the absorbed decoding path equal to the
uncompressed one, a cache of latents only, and the cache sizes of the book's table."""

import math

import pytest
import torch

from llmarch.kv_cache import KVCache, LayerKVCache
from llmarch.mla import MLAConfig, MultiHeadLatentAttention, cached_numbers_per_token, kv_cache_numbers_per_token
from llmarch.model import GPT, GPTConfig, llama_config
from llmarch.moe import MoEConfig
from llmarch.positional import rope_matrix

MLA = MLAConfig(kv_lora_rank=12, q_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)


def _layer(config=MLA, seed=0, **kw):
    torch.manual_seed(seed)
    layer = MultiHeadLatentAttention(24, 3, config, **kw).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    return layer


def _rms(v, g, eps):
    return g * v / torch.sqrt((v**2).mean() + eps)


def test_matches_a_loop_over_heads_and_tokens():
    """Interleaved RoPE written as rotation matrices, one head and one query at a time."""
    layer, c = _layer(), MLA
    x = torch.randn(1, 7, 24, dtype=torch.float64)
    out = torch.empty(7, 24, dtype=torch.float64)
    w_kvb = layer.kv_b_proj.weight.view(3, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
    latent, k_rope = [], []
    for s in range(7):
        a = layer.kv_a_proj.weight @ x[0, s]
        latent.append(_rms(a[:c.kv_lora_rank], layer.kv_a_norm.weight, 1e-6))
        k_rope.append(rope_matrix(s, c.qk_rope_head_dim) @ a[c.kv_lora_rank:])
    for t in range(7):
        q = layer.q_b_proj.weight @ _rms(layer.q_a_proj.weight @ x[0, t], layer.q_a_norm.weight, 1e-6)
        heads = []
        for h in range(3):
            q_h = q.view(3, -1)[h]
            q_n, q_r = q_h[:c.qk_nope_head_dim], rope_matrix(t, c.qk_rope_head_dim) @ q_h[c.qk_nope_head_dim:]
            w_uk, w_uv = w_kvb[h, :c.qk_nope_head_dim], w_kvb[h, c.qk_nope_head_dim:]
            scores = torch.stack([(q_n @ (w_uk @ latent[s]) + q_r @ k_rope[s]) / math.sqrt(10) for s in range(t + 1)])
            weights = torch.softmax(scores, 0)
            heads.append(sum(weights[s] * (w_uv @ latent[s]) for s in range(t + 1)))
        out[t] = layer.o_proj.weight @ torch.cat(heads)
    torch.testing.assert_close(layer(x, is_causal=True)[0], out, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", [MLA, MLAConfig(kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4,
                                                   qk_rope_head_dim=6, v_head_dim=7, rope_interleave=False)])
def test_absorbed_path_equals_the_uncompressed_one(config):
    layer = _layer(config, bias=True)
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    expanded = layer(x, is_causal=True)
    layer.absorb = True
    torch.testing.assert_close(layer(x, is_causal=True), expanded, rtol=1e-10, atol=1e-12)


def test_cached_absorbed_decoding_equals_the_full_forward_and_caches_latents_only():
    layer = _layer()
    x = torch.randn(2, 10, 24, dtype=torch.float64)
    full = layer(x, is_causal=True)
    cache = LayerKVCache()
    steps = [layer(x[:, :4], is_causal=True, kv_cache=cache)]
    layer.absorb = True
    steps += [layer(x[:, t:t + 1], is_causal=True, kv_cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    assert cache.k.shape == (2, 1, 10, 12) and cache.v.shape == (2, 1, 10, 4)


def _deepseek_tiny(**moe):
    return llama_config("llama-3-8b", vocab_size=40, context_length=64, d_model=24, n_layers=2, n_heads=3,
                        n_kv_heads=3, d_ff=32, mla=MLA,
                        moe=MoEConfig(n_experts=4, top_k=2, d_expert=8, router="sigmoid_bias", **moe))


def test_a_model_with_mla_decodes_with_its_latent_cache():
    torch.manual_seed(0)
    model = GPT(_deepseek_tiny(n_shared_experts=1)).double().eval()
    ids = torch.randint(0, 40, (2, 11))
    cache = KVCache(2)
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :5], kv_cache=cache)] + [model(ids[:, t:t + 1], kv_cache=cache) for t in range(5, 11)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    assert cached_numbers_per_token(cache) == kv_cache_numbers_per_token(model.config) == 12 + 4


def test_cache_numbers_per_token_of_the_book_table():
    """DeepSeek-V3 (kv_lora_rank 512, RoPE key 64) against Llama 3 8B (8 KV heads of 128), per token and layer,
    and a GQA model's cache measured after a forward."""
    v3 = GPTConfig(vocab_size=129280, d_model=7168, n_heads=128, n_layers=61, pos_encoding="rope",
                   mla=MLAConfig(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                 v_head_dim=128))
    assert kv_cache_numbers_per_token(v3) == 576
    assert kv_cache_numbers_per_token(llama_config("llama-3-8b")) == 2048
    assert kv_cache_numbers_per_token(llama_config("llama-2-7b")) == 2 * 32 * 128
    gqa = GPT(llama_config("llama-3-8b", vocab_size=40, context_length=16, d_model=32, n_layers=2, n_heads=4,
                           n_kv_heads=2, d_ff=32))
    cache = KVCache(2)
    gqa(torch.randint(0, 40, (3, 5)), kv_cache=cache)
    assert cached_numbers_per_token(cache) == kv_cache_numbers_per_token(gqa.config) == 2 * 2 * 8


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        MLAConfig(kv_lora_rank=8, qk_rope_head_dim=3)
    with pytest.raises(ValueError, match="pos_encoding='rope'"):
        GPTConfig(vocab_size=10, mla=MLA)
    with pytest.raises(ValueError, match="position bias"):
        _layer()(torch.randn(1, 3, 24, dtype=torch.float64), bias=torch.zeros(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="empty"):
        cached_numbers_per_token(KVCache(2))


def test_a_config_survives_a_round_trip_through_plain_dicts():
    """Checkpoints store ``dataclasses.asdict(config)``: the MoE and MLA parts come back as dicts."""
    import dataclasses
    config = _deepseek_tiny(n_shared_experts=1)
    again = GPTConfig(**dataclasses.asdict(config))
    assert again == config and isinstance(again.moe, MoEConfig) and isinstance(again.mla, MLAConfig)
