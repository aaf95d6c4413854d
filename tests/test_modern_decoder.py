"""The modern-decoder options of llmarch (RMSNorm, SwiGLU, RoPE layouts, partial rotary, RoPE scaling, GQA) by
their defining properties. Exactness against transformers' models is in tests/test_hf_equivalence.py."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from llmarch.kv_cache import KVCache
from llmarch.layers import SwiGLU, layer_norm, rms_norm, swiglu_hidden_size
from llmarch.model import GPT, GPTConfig, llama_config, load_tiny_gpt
from llmarch.positional import RotaryEmbedding, apply_rope, rope_frequencies


def test_rms_norm_is_layer_norm_of_a_zero_mean_input():
    """RMSNorm drops LayerNorm's centring: on inputs whose mean is already 0 the two coincide."""
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    x = x - x.mean(-1, keepdim=True)
    weight = torch.randn(16, dtype=torch.float64)
    assert torch.allclose(rms_norm(x, weight, eps=1e-5), layer_norm(x, weight, eps=1e-5), atol=1e-12)
    assert torch.allclose(torch.nn.RMSNorm(16, eps=1e-5).double()(x), rms_norm(x, eps=1e-5), atol=1e-12)


def test_swiglu_is_the_gated_formula():
    torch.manual_seed(0)
    ffn = SwiGLU(8, 12).double()
    x = torch.randn(4, 8, dtype=torch.float64)
    gate, up = x @ ffn.w1.weight.T, x @ ffn.w3.weight.T
    assert torch.allclose(ffn(x), (gate * torch.sigmoid(gate) * up) @ ffn.w2.weight.T, atol=1e-12)
    assert ffn.w1.bias is None and SwiGLU(8).w1.out_features == swiglu_hidden_size(8) == 256


def test_linear_scaling_is_position_interpolation():
    """Chen et al. (2023): dividing the frequencies by s is rotating at position m / s."""
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    positions = torch.arange(40, 50)
    inv_freq, factor = rope_frequencies(8, scaling={"rope_type": "linear", "factor": 4.0})
    assert factor == 1.0
    assert torch.allclose(apply_rope(x, positions, inv_freq=inv_freq), apply_rope(x, positions / 4.0), atol=1e-12)


def test_llama3_keeps_high_frequencies_and_divides_low_ones():
    d, base, s, original = 64, 10000.0, 8.0, 64
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    inv_freq, _ = rope_frequencies(d, base, {"rope_type": "llama3", "factor": s, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": original})
    wavelength = 2 * math.pi / theta
    short, long = wavelength < original / 4, wavelength > original
    assert short.any() and long.any() and (~short & ~long).any()  # all three regions occur
    assert torch.equal(inv_freq[short], theta[short]) and torch.allclose(inv_freq[long], theta[long] / s)
    middle = ~short & ~long
    assert ((inv_freq[middle] <= theta[middle]) & (inv_freq[middle] >= theta[middle] / s)).all()


def test_yarn_ramps_from_extrapolation_to_interpolation():
    theta = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    inv_freq, factor = rope_frequencies(32, scaling={"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 2048})
    assert inv_freq[0] == theta[0] and torch.isclose(inv_freq[-1], theta[-1] / 4)
    assert factor == pytest.approx(0.1 * math.log(4.0) + 1)


def test_dynamic_ntk_changes_nothing_inside_the_context():
    unscaled, _ = rope_frequencies(16)
    inside, _ = rope_frequencies(16, scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=100,
                                 max_position_embeddings=128)
    beyond, _ = rope_frequencies(16, scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=512,
                                 max_position_embeddings=128)
    assert torch.equal(inside, unscaled) and (beyond[1:] < unscaled[1:]).all() and beyond[0] == 1.0


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "yarn", "factor": 2.0}, {"rope_type": "llama3", "factor": 4.0}])
def test_partial_rotary_scores_depend_on_the_offset_only(interleaved, scaling):
    """The rotated part of <R(q)_m, R(k)_n> depends on m - n; the other features pass unchanged."""
    rope = RotaryEmbedding(16, interleaved=interleaved, rotary_dim=8, scaling=scaling, max_position_embeddings=16)
    q, k = torch.randn(2, 16, dtype=torch.float64).unbind(0)

    def score(m, n):
        return float(rope(q[None], torch.tensor([m]))[0, :8] @ rope(k[None], torch.tensor([n]))[0, :8])

    assert score(3, 1) == pytest.approx(score(40, 38), abs=1e-12)
    assert torch.equal(rope(q[None], torch.tensor([7]))[0, 8:], q[8:])


def _tiny_llama(**overrides):
    return llama_config(vocab_size=50, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                        **overrides)


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0},
                                     {"rope_type": "yarn", "factor": 2.0}, {"rope_type": "llama3", "factor": 4.0}])
def test_llama_cache_equals_recompute_past_the_context(scaling):
    torch.manual_seed(0)
    model = GPT(_tiny_llama(rope_scaling=scaling)).double().eval()
    ids = torch.randint(0, 50, (2, 48))
    full = model(ids)
    cache = KVCache(2)
    steps = [model(ids[:, :20], kv_cache=cache)] + [model(ids[:, t:t + 1], kv_cache=cache) for t in range(20, 48)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-10)


def test_llama_is_causal():
    torch.manual_seed(0)
    model = GPT(_tiny_llama()).double().eval()
    ids = torch.randint(0, 50, (1, 20))
    changed = ids.clone()
    changed[0, 12] = (ids[0, 12] + 1) % 50
    a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-12) and not torch.allclose(a[:, 12:], b[:, 12:])


@pytest.mark.parametrize("overrides,message", [
    ({"rotary_fraction": 0.1}, "rotary_fraction"),
    ({"n_kv_heads": 3}, "n_kv_heads"),
    ({"norm": "batchnorm"}, "norm"),
    ({"ffn": "geglu"}, "ffn"),
    ({"rope_layout": "neox"}, "rope_layout"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "alpha": 1}}, "alpha"),
    ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"pos_encoding": "learned"}, "rope_scaling"),
])
def test_config_errors_name_the_option(overrides, message):
    config = _tiny_llama(rope_scaling={"rope_type": "linear", "factor": 2.0}) if overrides == {"pos_encoding": "learned"} \
        else _tiny_llama()
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(config, **overrides)


def test_loading_the_tiny_model_does_not_import_the_trainer(tmp_path):
    code = "import sys, llmarch.model; llmarch.model.load_tiny_gpt(); assert 'llmarch.train' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(FileNotFoundError, match="python -m llmarch.train"):
        load_tiny_gpt(tmp_path / "missing.pt")


def test_public_import_paths_survive_the_package_split():
    from llmarch import efficient, kv_cache, tokenizers

    assert efficient.KVCache is kv_cache.KVCache
    for name in ("flash_attention", "triton_flash_attention", "attention", "sliding_window_mask", "PagedKVCache",
                 "kv_cache_bytes", "LinformerSelfAttention"):
        assert callable(getattr(efficient, name)), name
    for name in ("BPETokenizer", "WordPieceTokenizer", "UnigramTokenizer", "train_bpe_words"):
        assert callable(getattr(tokenizers, name)), name
    assert isinstance(GPTConfig(vocab_size=5), GPTConfig)
