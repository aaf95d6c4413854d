"""The open model families of 2024-25 against transformers' own models: Qwen2, Qwen3 with its real ``head_dim``,
Gemma 2, Gemma 3, OLMo 2, Phi-3 and Pythia (GPT-NeoX's parallel residual), each built from a small config with
random weights (nothing is downloaded), loaded with ``llmarch.model.load_hf_state_dict`` and compared logit by
logit (``1e-5`` in float32, ``1e-10`` in float64, relative to the largest logit; see test_hf_equivalence.py), and
by greedy generation: llmarch with and without its KV cache and transformers' ``generate`` give the same tokens.

Windows are small (4 to 6 tokens) against 24-token inputs and 28-token generations, so sliding layers lose keys.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the test oracle (pip install -e '.[test]')")

from test_hf_equivalence import DTYPES, VOCAB, _compare, _hf_in_float64, _hf_model, _ids  # noqa: E402

from llmarch.decoding import generate  # noqa: E402
from llmarch.model import GPT, config_from_hf, count_parameters, load_hf_state_dict  # noqa: E402

SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)


def qwen2(**kw):
    return transformers.Qwen2Config(**{**SMALL, "num_hidden_layers": 4, "use_sliding_window": True,
                                       "sliding_window": 5, "max_window_layers": 2, **kw})


def qwen3_head_dim_32(**kw):
    return transformers.Qwen3Config(**{**SMALL, "head_dim": 32, **kw})  # 4 heads of 32 from a hidden size of 64


def gemma(**kw):
    return transformers.GemmaConfig(**{**SMALL, "head_dim": 24, "pad_token_id": 0, "eos_token_id": 1,
                                       "bos_token_id": 2, **kw})


def gemma2(**kw):
    return transformers.Gemma2Config(**{**SMALL, "num_hidden_layers": 3, "head_dim": 24, "sliding_window": 4,
                                        "query_pre_attn_scalar": 20, "attn_logit_softcapping": 2.0,
                                        "final_logit_softcapping": 3.0, "pad_token_id": 0, "eos_token_id": 1,
                                        "bos_token_id": 2, **kw})


def gemma3(**kw):
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0}}
    return transformers.Gemma3TextConfig(**{**SMALL, "num_hidden_layers": 6, "head_dim": 16, "sliding_window": 6,
                                            "query_pre_attn_scalar": 24, "rope_parameters": rope,
                                            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, **kw})


def olmo2(**kw):
    return transformers.Olmo2Config(**{**SMALL, "pad_token_id": 0, "eos_token_id": 1, **kw})


def phi3(**kw):
    return transformers.Phi3Config(**{**SMALL, "sliding_window": 6, "pad_token_id": 0, "bos_token_id": 1,
                                      "eos_token_id": 2,
                                      "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                          "partial_rotary_factor": 0.5}, **kw})


def pythia(**kw):
    return transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=64, **kw)


def _hf_gemma2(dtype, seed=0):
    """Gemma 2 with q and k weights 10 times larger, so that most scores pass the soft cap of 2."""
    hf = _hf_model(gemma2(), dtype, seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10)
    return hf


FAMILIES = {"qwen2": qwen2, "qwen3-head-dim": qwen3_head_dim_32, "gemma": gemma, "gemma2": gemma2, "gemma3": gemma3,
            "olmo2": olmo2, "phi3": phi3, "pythia": pythia}


def _hf_family(family, dtype, seed=0):
    return _hf_gemma2(dtype, seed) if family == "gemma2" else _hf_model(FAMILIES[family](), dtype, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qwen2_biases_and_windowed_layers_match_transformers(dtype):
    """q, k, v with biases, o_proj without; layers 2 and 3 slide (max_window_layers=2), 0 and 1 do not."""
    ours = _compare(_hf_model(qwen2(), dtype), _ids(length=24), dtype)
    attn = ours.blocks[0].attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None and ours.blocks[0].ffn.w1.bias is None
    assert ours.layer_types == ["full", "full", "sliding", "sliding"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_qwen3_with_head_dim_above_d_model_over_heads_matches_transformers(dtype):
    """Qwen3-0.6B's shape in small: 4 heads of 32 features from a hidden size of 64 (q_proj 64 -> 128)."""
    ours = _compare(_hf_model(qwen3_head_dim_32(), dtype), _ids(length=24), dtype)
    assert ours.config.d_head == 32 and ours.blocks[0].attn.q_proj.weight.shape == (128, 64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_matches_transformers(dtype):
    """Gemma (1): GeGLU, RMSNorm with gain 1 + w, embeddings times sqrt(64), head_dim 24 != 64/4, tied output."""
    ours = _compare(_hf_model(gemma(), dtype), _ids(length=24), dtype)
    assert ours.config.norm == "rmsnorm_offset" and ours.lm_head.weight is ours.tok_emb.weight


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma2_matches_transformers(dtype):
    """Soft-capped scores (cap 2) and logits (cap 3), alternating sliding (window 4) and full layers, four norms a
    layer with gain 1 + w, GeGLU, embeddings times sqrt(64), scores scaled by 20^-1/2, head_dim 24 != 64/4."""
    ours = _compare(_hf_gemma2(dtype), _ids(length=24), dtype)
    assert ours.layer_types == ["sliding", "full", "sliding"] and ours.config.attn_softcap == 2.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma3_matches_transformers(dtype):
    """Per-head QK-norm, five sliding layers (window 6, RoPE base 100) per full one (base 5000, linear x4)."""
    ours = _compare(_hf_model(gemma3(), dtype), _ids(length=24), dtype)
    assert ours.layer_types == ["sliding"] * 5 + ["full"]
    assert ours.blocks[0].attn.rotary.base == 100.0 and ours.blocks[5].attn.rotary.scaling["factor"] == 4.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_olmo2_matches_transformers(dtype):
    """Norms on the sub-layer outputs only, QK-norm over the whole q (64) and k (32) projections."""
    ours = _compare(_hf_model(olmo2(), dtype), _ids(length=24), dtype)
    assert ours.blocks[0].attn.q_norm.weight.shape == (64,) and ours.blocks[0].attn.k_norm.weight.shape == (32,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_phi3_matches_transformers(dtype):
    """Fused qkv_proj and gate_up_proj, split on loading; half of each head rotated; a window of 6 on every layer."""
    ours = _compare(_hf_model(phi3(), dtype), _ids(length=24), dtype)
    assert ours.config.rotary_fraction == 0.5 and ours.config.sliding_window == 6


@pytest.mark.parametrize("dtype", DTYPES)
def test_pythia_parallel_residual_matches_transformers(dtype):
    """GPT-NeoX's default, use_parallel_residual=True: x + attn(ln1(x)) + mlp(ln2(x))."""
    ours = _compare(_hf_model(pythia(), dtype), _ids(length=24), dtype)
    assert ours.config.parallel_residual


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generation_matches_transformers_with_and_without_the_cache(family):
    """Prompt 8 tokens, 20 new ones, in float64: past every window (at most 6 tokens)."""
    hf = _hf_family(family, torch.float64, seed=3)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    prompt = _ids(batch=2, length=8, seed=4)
    with _hf_in_float64(torch.float64):
        theirs = hf.generate(prompt, max_new_tokens=20, do_sample=False, num_beams=1, min_new_tokens=20,
                             pad_token_id=0, eos_token_id=None)
    cached = generate(ours, prompt, max_new_tokens=20, greedy=True)
    assert torch.equal(cached, generate(ours, prompt, max_new_tokens=20, greedy=True, use_cache=False))
    assert torch.equal(cached, theirs)


@pytest.mark.parametrize("family,field,value", [
    ("gemma2", "attn_softcap", None), ("gemma2", "final_softcap", None), ("gemma2", "norm_placement", "pre"),
    ("gemma2", "layer_types", None), ("gemma2", "scale_embeddings", False), ("gemma2", "attn_scale", None),
    ("gemma", "norm", "rmsnorm"), ("gemma3", "rope_local_base", None), ("gemma3", "qk_norm", "projection"),
    ("olmo2", "qk_norm", "head"),
    ("olmo2", "norm_placement", "sandwich"), ("pythia", "parallel_residual", False),
])
def test_each_family_feature_changes_the_logits(family, field, value):
    """The same weights without one feature give other logits, so each comparison above tests that feature."""
    hf = _hf_family(family, torch.float64)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    changed = GPT(dataclasses.replace(ours.config, **{field: value})).double().eval()
    shapes = {name: t.shape for name, t in changed.state_dict().items()}
    # the same tensors where the shapes agree; norms that one placement lacks keep their initial values
    changed.load_state_dict({name: t for name, t in ours.state_dict().items() if shapes.get(name) == t.shape},
                            strict=False)
    ids = _ids(length=24)
    with torch.no_grad():
        assert (changed(ids) - ours(ids)).abs().max() > 1e-3 * ours(ids).abs().max()


@pytest.mark.parametrize("config,message", [
    (phi3(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                           "long_factor": [1.0] * 8, "original_max_position_embeddings": 32}), "longrope"),
    (gemma2(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ({**qwen2().to_dict(), "layer_types": ["full_attention", "chunked_attention"] * 2}, "chunked_attention"),
])
def test_what_a_family_does_not_implement_is_named(config, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf(config)


def test_published_gemma3_config_reads_its_two_ropes_and_pattern():
    """Gemma 3 4B's config.json fields (older form: rope_theta + rope_scaling for the global layers,
    rope_local_base_freq for the local ones, sliding_window_pattern 6)."""
    published = {
        "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
        "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 256, "sliding_window": 1024, "sliding_window_pattern": 6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "attn_logit_softcapping": None, "final_logit_softcapping": None, "cache_implementation": "hybrid",
    }
    c = config_from_hf(published)
    assert c.d_head == 256 and c.rope_base == 1e6 and c.rope_local_base == 1e4 and c.rope_scaling["factor"] == 8.0
    assert c.layer_types == tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(34))
    assert c.tie_embeddings and c.attn_scale == 256 ** -0.5


@pytest.mark.parametrize("config", [
    qwen2(), qwen2(max_window_layers=0), qwen2(use_sliding_window=False),
    qwen3_head_dim_32(num_hidden_layers=5, use_sliding_window=True, sliding_window=3, max_window_layers=3),
    gemma2(num_hidden_layers=5), gemma3(num_hidden_layers=13), gemma3(num_hidden_layers=4, sliding_window_pattern=2),
    phi3(), phi3(sliding_window=None),
])
def test_layer_windows_follow_transformers_with_and_without_layer_types(config):
    """transformers' per-layer list, and the family's rule when a config.json predates the list. In transformers a
    layer slides iff its type is sliding_attention (Mistral, Phi-3: every layer) and sliding_window is set."""
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    expected = ["sliding" if t == "sliding_attention" and config.sliding_window is not None else "full" for t in types]
    with_list = config.to_dict()
    without_list = {k: v for k, v in with_list.items() if k != "layer_types"}
    for form in (with_list, without_list):
        c = config_from_hf(form)
        assert [c.layer_type(i) for i in range(c.n_layers)] == expected


# Published config.json fields (older form, as the hub serves them); the oracle is transformers' own model built
# from the same dict on the meta device, tied weights counted once.
PUBLISHED = {
    "Qwen2.5-0.5B": {
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
        "max_window_layers": 24, "sliding_window": 32768, "use_sliding_window": False, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu", "attention_dropout": 0.0},
    "Qwen3-0.6B": {
        "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "max_window_layers": 28, "sliding_window": None, "use_sliding_window": False,
        "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False},
    "gemma-2-2b": {
        "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "cache_implementation": "hybrid"},
    "Phi-3-mini-4k": {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "sliding_window": 2047, "rope_theta": 10000.0, "rope_scaling": None,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False, "embd_pdrop": 0.0,
        "resid_pdrop": 0.0},
    "OLMo-2-1B": {
        "model_type": "olmo2", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 100352, "max_position_embeddings": 4096,
        "rope_theta": 500000, "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_build_models_of_transformers_size(name):
    published = PUBLISHED[name]
    with torch.device("meta"):
        ours = GPT(config_from_hf(published))
        config = transformers.AutoConfig.for_model(**published)
        theirs = transformers.AutoModelForCausalLM.from_config(config)
    assert count_parameters(ours) == sum(p.numel() for p in theirs.parameters())
    if name == "gemma-2-2b":
        assert count_parameters(ours) == 2_614_341_888  # the model card's count


def test_a_setting_spelled_twice_is_read_once_and_must_agree():
    """transformers 5 writes Phi-4-mini's ``partial_rotary_factor`` both at the top of config.json and inside
    ``rope_parameters``: the model loads with half of each head rotated, and two different values are refused."""
    config = transformers.Phi3Config(**{**SMALL, "partial_rotary_factor": 0.5}).to_dict()
    assert config.get("partial_rotary_factor") == 0.5
    assert config_from_hf(config).rotary_fraction == 0.5
    config["rope_parameters"] = {**config["rope_parameters"], "partial_rotary_factor": 0.25}
    with pytest.raises(ValueError, match="partial_rotary_factor two different values"):
        config_from_hf(config)
