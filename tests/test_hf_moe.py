"""Mixtral and DeepSeek-V3 against transformers' own models (random weights from tiny configs, nothing
downloaded), loaded with ``llmarch.model.load_hf_state_dict``: logits to 1e-5 (float32) and 1e-10 (float64)
relative to their largest, and greedy generation equal to transformers', with and without llmarch's cache.

transformers computes the RMSNorms, RoPE angles, DeepSeek's router and Mixtral's router softmax in float32 even in
a float64 model (the latter with ``Tensor.float()``); for float64 runs its code runs with those casts turned
into float64 casts (``_hf_in_float64``), so the oracle is transformers' code without its float32 islands.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the test oracle (pip install -e '.[test]')")

from test_hf_equivalence import TOL, VOCAB, _hf_in_float64  # noqa: E402  (the shared float64 harness)

from llmarch.decoding import generate  # noqa: E402
from llmarch.mla import MultiHeadLatentAttention  # noqa: E402
from llmarch.model import config_from_hf, load_hf_state_dict  # noqa: E402
from llmarch.moe import MoEFeedForward  # noqa: E402

def _mixtral(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_local_experts=6, num_experts_per_tok=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, router_jitter_noise=0.0)
    return transformers.MixtralConfig(**{**base, **kw})


def _deepseek(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=16,
                q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6, routed_scaling_factor=2.5,
                max_position_embeddings=64, rms_norm_eps=1e-5)
    return transformers.DeepseekV3Config(**{**base, **kw})


def _hf_model(config, dtype, seed=0):
    """Random weights; norms and biases away from their initial values; routers spread (scores far from ties)
    and DeepSeek's selection bias random, so that a router that ignores it chooses other experts."""
    torch.manual_seed(seed)
    config._attn_implementation = config._experts_implementation = "eager"  # the loops of the modeling files
    with _hf_in_float64(dtype):
        model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
            elif name.endswith("gate.weight"):
                p.mul_(10)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    return model.to(dtype).eval()


def _ids(batch=2, length=20, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _relative_error(hf, ours, ids, dtype):
    with torch.no_grad(), _hf_in_float64(dtype):
        theirs = hf(ids).logits
    with torch.no_grad():
        got = ours(ids)
    return float((got - theirs).abs().max() / theirs.abs().max())


def _compare(hf, dtype, ids=None):
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    assert next(ours.parameters()).dtype == dtype
    err = _relative_error(hf, ours, _ids() if ids is None else ids, dtype)
    assert err <= TOL[dtype], f"logits differ: max relative error {err:.2e} > {TOL[dtype]:.0e}"
    return ours


DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [_mixtral(), _mixtral(num_experts_per_tok=1, sliding_window=6)],
                         ids=["top2", "top1-window6"])
def test_mixtral_matches_transformers(dtype, config):
    ours = _compare(_hf_model(config, dtype), dtype)
    assert all(isinstance(block.ffn, MoEFeedForward) for block in ours.blocks)
    assert ours.config.moe.router == "softmax_topk" and ours.config.moe.top_k == config.num_experts_per_tok


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [
    _deepseek(),
    _deepseek(q_lora_rank=None, rope_interleave=False, attention_bias=True, n_group=1, topk_group=1,
              norm_topk_prob=False, first_k_dense_replace=0, n_shared_experts=2),
], ids=["v3-shape", "full-rank-q-half-rope-bias-no-groups"])
def test_deepseek_v3_matches_transformers(dtype, config):
    ours = _compare(_hf_model(config, dtype), dtype)
    assert all(isinstance(block.attn, MultiHeadLatentAttention) for block in ours.blocks)
    dense = config.first_k_dense_replace
    assert [isinstance(b.ffn, MoEFeedForward) for b in ours.blocks] == [i >= dense for i in range(2)]


def test_deepseek_v3_with_yarn_matches_transformers():
    """YaRN with DeepSeek's mscale and mscale_all_dim: the RoPE factor and the softmax scale both change."""
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4, "original_max_position_embeddings": 16,
            "mscale": 0.9, "mscale_all_dim": 0.7, "beta_fast": 32, "beta_slow": 1}
    _compare(_hf_model(_deepseek(rope_parameters=rope), torch.float64), torch.float64, ids=_ids(length=40))


def test_the_selection_bias_and_the_groups_matter():
    """The comparisons above would pass with a router that ignores the bias or the groups only if these did not
    change the output: they do."""
    hf = _hf_model(_deepseek(), torch.float64)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    ids = _ids()
    with torch.no_grad():
        reference = ours(ids)
        ours.blocks[1].ffn.expert_bias.zero_()
        assert not torch.allclose(ours(ids), reference)
    ungrouped = load_hf_state_dict(hf.state_dict(), {**hf.config.to_dict(), "n_group": 1, "topk_group": 1})
    with torch.no_grad():
        assert not torch.allclose(ungrouped(ids), reference)


@pytest.mark.parametrize("config", [_mixtral(), _deepseek()], ids=["mixtral", "deepseek_v3"])
def test_greedy_generation_with_and_without_the_cache_matches_transformers(config):
    hf = _hf_model(config, torch.float64, seed=3)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    prompt = _ids(batch=2, length=8, seed=4)
    with _hf_in_float64(torch.float64):
        theirs = hf.generate(prompt, max_new_tokens=20, do_sample=False, num_beams=1, min_new_tokens=20,
                             pad_token_id=0, eos_token_id=None)
    assert torch.equal(generate(ours, prompt, max_new_tokens=20, greedy=True), theirs)
    assert torch.equal(generate(ours, prompt, max_new_tokens=20, greedy=True, use_cache=False), theirs)


@pytest.mark.parametrize("config", [_mixtral(), _deepseek()], ids=["mixtral", "deepseek_v3"])
def test_a_saved_folder_in_the_released_layout_loads_as_the_fused_state_dict(config, tmp_path):
    """``save_pretrained`` writes the released files' layout, one matrix per expert (Mixtral's
    ``block_sparse_moe.experts.e.w1/w2/w3``, DeepSeek's ``mlp.experts.e.gate_proj/up_proj/down_proj``)."""
    from safetensors.torch import load_file
    from llmarch.model import load_pretrained
    hf = _hf_model(config, torch.float64)
    hf.save_pretrained(tmp_path)
    saved = {name for path in tmp_path.glob("*.safetensors") for name in load_file(str(path))}
    assert any(".experts.0." in name for name in saved) and not any("gate_up_proj" in name for name in saved)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(tmp_path)(ids),
                                   load_hf_state_dict(hf.state_dict(), hf.config.to_dict())(ids), rtol=1e-12,
                                   atol=1e-14)  # other memory layouts: rounding only


def test_configs_llmarch_does_not_implement_are_refused():
    config = _deepseek().to_dict()
    with pytest.raises(ValueError, match="scoring_func"):
        config_from_hf({**config, "scoring_func": "softmax"})
    with pytest.raises(ValueError, match="quantization_config"):
        config_from_hf({**config, "quantization_config": {"quant_method": "fp8"}})
    assert config_from_hf(_mixtral().to_dict()).moe.balance_coef == pytest.approx(2 * 0.001)
