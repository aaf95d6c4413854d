"""llmarch's GPT against transformers' own models: GPT-2, Llama (GQA, bias, tying, every RoPE scaling rule) and
GPT-NeoX (partial rotary), built from configs with random weights (nothing is downloaded), loaded with
``llmarch.model.load_hf_state_dict`` / ``load_pretrained``, and compared logit by logit.

Tolerances: ``max |ours - theirs| <= tol * max |theirs|`` with ``tol = 1e-5`` in float32 and ``1e-10`` in float64.
transformers computes RMSNorm, the RoPE angles and the softmax in float32 even for a float64 model; for the
float64 comparison its code runs with ``torch.float32`` rebound to ``torch.float64``, ``Tensor.float()`` casting
to float64 (Gemma's norms) and float64 as the default dtype (``_hf_in_float64``), so the oracle is still
transformers' code, only without its float32 islands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the test oracle (pip install -e '.[test]')")

from llmarch.decoding import generate  # noqa: E402
from llmarch.layers import swiglu_hidden_size  # noqa: E402
from llmarch.model import (  # noqa: E402
    GPT, config_from_hf, count_parameters, gpt1_config, gpt2_config, llama_config, load_hf_state_dict,
    load_pretrained,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
VOCAB = 61


@contextlib.contextmanager
def _hf_in_float64(dtype):
    """Run transformers' code with its explicit float32 casts turned into float64 casts (float64 runs only)."""
    if dtype != torch.float64:
        yield
        return
    saved = torch.float32, torch.float, torch.get_default_dtype(), torch.Tensor.float
    torch.float32 = torch.float = torch.float64
    torch.Tensor.float = lambda self, *args, **kwargs: self.to(torch.float64)
    torch.set_default_dtype(torch.float64)  # e.g. dynamic NTK's base, computed from an integer tensor
    try:
        yield
    finally:
        torch.float32, torch.float = saved[:2]
        torch.set_default_dtype(saved[2])
        torch.Tensor.float = saved[3]


def _hf_model(config, dtype, seed=0):
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    with _hf_in_float64(dtype):
        model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # non-trivial norms, so a missing or misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
    return model.to(dtype).eval()


def _compare(hf, ids, dtype, ours=None):
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict()) if ours is None else ours
    assert next(ours.parameters()).dtype == dtype
    with torch.no_grad(), _hf_in_float64(dtype):
        theirs = hf(ids).logits
    with torch.no_grad():
        got = ours(ids)
    err = float((got - theirs).abs().max() / theirs.abs().max())
    assert err <= TOL[dtype], f"logits differ: max relative error {err:.2e} > {TOL[dtype]:.0e}"
    return ours


def _ids(batch=2, length=24, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _llama(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5)
    return transformers.LlamaConfig(**{**base, **kw})


def _gpt2(**kw):
    return transformers.GPT2Config(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, **kw)


DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpt2_matches_transformers(dtype):
    config = _gpt2( n_positions=48, n_embd=48, n_layer=2, n_head=4)
    _compare(_hf_model(config, dtype), _ids(length=48), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tied,attention_bias,mlp_bias", [(False, False, False), (True, False, False),
                                                           (False, True, False), (True, True, True)])
def test_llama_with_gqa_matches_transformers(dtype, tied, attention_bias, mlp_bias):
    config = _llama(tie_word_embeddings=tied, attention_bias=attention_bias, mlp_bias=mlp_bias)
    ours = _compare(_hf_model(config, dtype), _ids(length=32), dtype)
    assert ours.config.n_kv_heads == 2 and (ours.lm_head.weight is ours.tok_emb.weight) == tied


SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-no-truncate": {"rope_type": "yarn", "factor": 3.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_rope_scaling_beyond_the_context_matches_transformers(dtype, name):
    """Sequences of 96 tokens, three times max_position_embeddings; rope_theta 500 puts some wavelengths inside
    the 16-32 token original context, so every rule's piecewise cases are exercised."""
    config = _llama(rope_parameters={"rope_theta": 500.0, **SCALINGS[name]}, head_dim=16)
    ours = _compare(_hf_model(config, dtype), _ids(length=96), dtype)
    assert ours.config.rope_scaling["rope_type"] == SCALINGS[name]["rope_type"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_pct", [0.25, 0.5, 1.0])
def test_partial_rotary_matches_gpt_neox(dtype, rotary_pct):
    """GPT-NeoX with sequential residuals (use_parallel_residual=False) rotates the first rotary_pct of each head."""
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rotary_pct=rotary_pct, use_parallel_residual=False)
    ours = _compare(_hf_model(config, dtype), _ids(length=40), dtype)
    assert ours.config.rotary_fraction == rotary_pct


def test_both_rope_config_forms_give_the_same_model():
    new = _llama(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5}).to_dict()
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    old.update(rope_theta=5e5, rope_scaling={"type": "yarn", "factor": 4.0})
    assert config_from_hf(old) == config_from_hf(new)
    assert config_from_hf(new).rope_base == 5e5 and config_from_hf(new).rope_scaling["factor"] == 4.0


@pytest.mark.parametrize("change,message", [
    ({"sliding_window": 4096}, "sliding_window"),
    ({"model_type": "bloom"}, "bloom"),
    ({"head_dim": 0}, "head_dim"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 2.0, "rope_theta": 1e4}}, "longrope"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "beta": 3}}, "beta"),
])
def test_unsupported_config_keys_are_named(change, message):
    config = {**_llama().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        config_from_hf(config)


def test_state_dict_that_does_not_fit_is_refused():
    hf = _hf_model(_llama(), torch.float32)
    state = hf.state_dict()
    state.pop("model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="up_proj"):
        load_hf_state_dict(state, hf.config.to_dict())
    with pytest.raises(ValueError, match="unexpected"):
        load_hf_state_dict({**hf.state_dict(), "model.extra.weight": torch.zeros(2)}, hf.config.to_dict())


def test_loaded_weights_are_copies():
    hf = _hf_model(_llama(), torch.float32)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    with torch.no_grad():
        hf.model.embed_tokens.weight.zero_()
    assert ours.tok_emb.weight.abs().sum() > 0


@pytest.mark.parametrize("config", [
    _gpt2( n_positions=32, n_embd=32, n_layer=2, n_head=2),
    _llama(rope_parameters={"rope_type": "llama3", "factor": 4.0, "rope_theta": 1e4, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
])
def test_load_pretrained_reads_a_saved_folder(tmp_path, config):
    hf = _hf_model(config, torch.float32)
    hf.save_pretrained(tmp_path)  # config.json + model.safetensors, as a hub checkpoint is laid out
    assert list(tmp_path.glob("*.safetensors"))
    _compare(hf, _ids(length=20), torch.float32, ours=load_pretrained(tmp_path))


def test_load_pretrained_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_llama().to_dict()))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("config", [
    _gpt2( n_positions=64, n_embd=32, n_layer=2, n_head=2),
    _llama(),
    _llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
    _llama(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}),
])
def test_greedy_generation_with_the_cache_matches_transformers(config):
    """Prompt 10 tokens, 40 new ones: past max_position_embeddings (32) for the RoPE models."""
    hf = _hf_model(config, torch.float64, seed=3)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    prompt = _ids(batch=2, length=10, seed=4)
    with _hf_in_float64(torch.float64):
        theirs = hf.generate(prompt, max_new_tokens=40, do_sample=False, num_beams=1, min_new_tokens=40,
                             pad_token_id=0, eos_token_id=None)
    got = generate(ours, prompt, max_new_tokens=40, greedy=True)
    assert torch.equal(got, theirs)


def test_gpt1_uses_the_tanh_gelu():
    """GPT-1's code: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    small = GPT(dataclasses.replace(gpt1_config(), vocab_size=11, n_layers=1, d_model=16, n_heads=2)).double()
    ffn = small.blocks[0].ffn
    x = 3 * torch.randn(50, 16, dtype=torch.float64)
    h = ffn.w1(x)
    expected = ffn.w2(0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))))
    assert torch.allclose(ffn(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("make,published", [
    # GPT-2 small: 124,439,808 (the count of transformers' GPT2LMHeadModel, tied head counted once)
    (lambda: gpt2_config(), 124_439_808),
    # Llama 2 7B: 6,738,415,616; Llama 3 8B: 8,030,261,248; Mistral 7B v0.1: 7,241,732,096 (model cards / hub counts)
    (lambda: llama_config("llama-2-7b"), 6_738_415_616),
    (lambda: llama_config("llama-3-8b"), 8_030_261_248),
    (lambda: llama_config("mistral-7b"), 7_241_732_096),
])
def test_presets_have_the_published_parameter_counts(make, published):
    with torch.device("meta"):  # no memory: the shapes are all a count needs
        model = GPT(make())
    assert count_parameters(model) == published


def test_swiglu_hidden_size_is_llamas():
    assert swiglu_hidden_size(4096) == 11008  # Llama 2 7B's intermediate_size
    assert swiglu_hidden_size(4096, multiple_of=1024, ffn_dim_multiplier=1.3) == 14336  # Llama 3 8B's


# Published config.json files (as the hub serves them), in the older form with rope_scaling and rope_theta.
GPT2_CONFIG_JSON = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
    "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}, "vocab_size": 50257,
}
LLAMA_2_7B_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000,
}
LLAMA_31_8B_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 128256,
}


@pytest.mark.parametrize("published,preset", [
    (GPT2_CONFIG_JSON, lambda: gpt2_config()),
    (LLAMA_2_7B_CONFIG_JSON, lambda: llama_config("llama-2-7b")),
    (LLAMA_31_8B_CONFIG_JSON, lambda: llama_config("llama-3.1-8b")),
])
def test_published_configs_read_as_the_presets(published, preset):
    assert config_from_hf(published) == preset()


# ----------------------------------------------------------------------------------------------------------
# After Llama 3: Mistral's sliding window and Qwen3's QK-norm
# ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_mistral_sliding_window_matches_transformers(dtype):
    """A window of 5 on 24-token inputs, so most queries lose keys; the same weights without the window differ."""
    config = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        sliding_window=5, rms_norm_eps=1e-5)
    ids = _ids(length=24)
    ours = _compare(_hf_model(config, dtype), ids, dtype)
    assert ours.config.sliding_window == 5
    full = GPT(dataclasses.replace(ours.config, sliding_window=None)).to(dtype)
    full.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert not torch.allclose(full(ids), ours(ids))
        torch.testing.assert_close(full(ids[:, :5]), ours(ids[:, :5]))  # no query is past the window yet


def test_sliding_window_with_a_kv_cache_equals_a_full_recompute():
    from llmarch.kv_cache import KVCache
    torch.manual_seed(0)
    model = GPT(llama_config("llama-3-8b", vocab_size=VOCAB, context_length=32, d_model=32, n_layers=2, n_heads=4,
                             n_kv_heads=2, d_ff=48, sliding_window=4)).double().eval()
    ids = _ids(batch=2, length=12)
    cache = KVCache(2)
    with torch.no_grad():
        steps = [model(ids[:, :5], kv_cache=cache)] + [model(ids[:, t: t + 1], kv_cache=cache) for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(ids), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qwen3_qk_norm_matches_transformers(dtype):
    config = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=32, rms_norm_eps=1e-5)
    ours = _compare(_hf_model(config, dtype), _ids(length=24), dtype)
    assert ours.config.qk_norm and ours.blocks[0].attn.q_norm.weight.shape == (16,)
