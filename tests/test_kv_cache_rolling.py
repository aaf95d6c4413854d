"""The rolling KV cache (Mistral's sliding window) and attention sinks (StreamingLLM): a model with the rolling
cache computes what the full-cache model computes under the window mask, token for token, far past the window,
while it holds at most ``window`` keys per layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmarch.decoding import generate
from llmarch.efficient import kv_cache_bytes
from llmarch.kv_cache import KVCache, LayerKVCache, RollingKVCache, window_sink_mask
from llmarch.model import GPT, GPTConfig, llama_config

W = 6  # the window of every model below
MISTRAL = llama_config("mistral-7b", vocab_size=50, context_length=256, d_model=32, n_layers=2, n_heads=4,
                       n_kv_heads=2, d_ff=48, sliding_window=W)
F64 = dict(rtol=1e-10, atol=1e-10)


def model(sinks=0, **overrides):
    torch.manual_seed(0)
    return GPT(dataclasses.replace(MISTRAL, attention_sinks=sinks, **overrides)).double().eval()


def ids(batch, length, seed=0):
    return torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


def brute_mask(n_q, n_k, window, sinks, past=0):
    """The mask by its definition, one pair at a time: the sinks and the last ``window - sinks`` tokens."""
    return torch.tensor([[j <= i and (j < sinks or i - j < window - sinks) for j in range(n_k)]
                         for i in range(past, past + n_q)])


@pytest.mark.parametrize("window,sinks", [(1, 0), (4, 0), (4, 1), (5, 4), (7, 3)])
def test_window_sink_mask_follows_its_definition(window, sinks):
    got = window_sink_mask(torch.arange(20), torch.arange(20), window, sinks)
    assert torch.equal(got, brute_mask(20, 20, window, sinks))
    assert got.sum(-1).max() == window  # no query sees more than the window
    keys = torch.tensor([0, 1, 9, 10, 11])  # a rolling cache's keys: two sinks, then the last three
    assert torch.equal(window_sink_mask(torch.tensor([11]), keys, window, sinks),
                       brute_mask(12, 12, window, sinks)[11:, keys])


@pytest.mark.parametrize("sinks", [0, 2])
def test_rolling_cache_decodes_four_windows_with_the_full_models_logits(sinks):
    """Prompt of 3 tokens, then one token at a time to 5 windows: every step's logits equal those of the
    full-cache model on the whole sequence (the window as a mask), and the cache holds min(N, W) keys."""
    m = model(sinks)
    seq = generate(m, ids(2, 3), 5 * W - 3, greedy=True, use_cache=False)
    with torch.no_grad():
        full = m(seq)
        cache = m.new_kv_cache()
        steps = [m(seq[:, :3], kv_cache=cache)]
        assert cache.held == 3
        for t in range(3, seq.shape[1]):
            steps.append(m(seq[:, t:t + 1], kv_cache=cache))
            assert (cache.length, cache.held) == (t + 1, min(t + 1, W))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **F64)
    held = cache.layers[0].positions.tolist()
    assert held == list(range(sinks)) + list(range(5 * W - (W - sinks), 5 * W))


@pytest.mark.parametrize("sinks", [0, 3])
def test_greedy_generation_with_the_rolling_cache_equals_the_full_recompute(sinks):
    """``generate`` uses the model's rolling cache; the tokens are those of recomputing the whole sequence with
    the window mask at every step, for 4 windows and more, and they differ from a model without the window."""
    m = model(sinks)
    prompt = ids(2, 4, seed=1)
    rolled = generate(m, prompt, 5 * W, greedy=True)
    assert torch.equal(rolled, generate(m, prompt, 5 * W, greedy=True, use_cache=False))
    unwindowed = model(sliding_window=None)
    assert not torch.equal(rolled, generate(unwindowed, prompt, 5 * W, greedy=True))


def test_a_prompt_longer_than_the_window_and_chunks_after_it():
    """A 3W-token prompt (its queries need keys the cache then drops), then chunks of 4 new tokens."""
    m = model(sinks=2)
    seq = ids(1, 6 * W, seed=2)
    with torch.no_grad():
        cache = m.new_kv_cache()
        parts = [m(seq[:, :3 * W], kv_cache=cache)]
        assert cache.held == W
        parts += [m(seq[:, t:t + 4], kv_cache=cache) for t in range(3 * W, 6 * W, 4)]
        torch.testing.assert_close(torch.cat(parts, dim=1), m(seq), **F64)


@pytest.mark.parametrize("sinks", [0, 2])
def test_cached_keys_keep_the_rotation_of_their_original_positions(sinks):
    """Past the window, the keys the rolling cache holds are exactly the full cache's keys at the same original
    positions: RoPE rotated each one at its position in the sequence, not at its slot in the cache."""
    m = model(sinks)
    seq = ids(2, 4 * W + 1, seed=3)
    rolling, full = m.new_kv_cache(), KVCache(len(m.blocks))
    with torch.no_grad():
        m(seq[:, :2], kv_cache=rolling)
        for t in range(2, seq.shape[1]):
            m(seq[:, t:t + 1], kv_cache=rolling)
        m(seq, kv_cache=full)
    for layer_rolling, layer_full in zip(rolling.layers, full.layers):
        positions = layer_rolling.positions
        assert positions.tolist() == list(range(sinks)) + list(range(4 * W + 1 - (W - sinks), 4 * W + 1))
        torch.testing.assert_close(layer_rolling.k, layer_full.k[:, :, positions], **F64)
        torch.testing.assert_close(layer_rolling.v, layer_full.v[:, :, positions], **F64)


def test_memory_is_the_window_not_the_sequence():
    """Keys held after N tokens: W per layer with the rolling cache, N with the full one; the bytes are
    ``kv_cache_bytes`` of W tokens. Prints the measured line."""
    m = model(sinks=2)
    n = 8 * W
    seq = ids(1, n, seed=4)
    rolling, full = m.new_kv_cache(), KVCache(len(m.blocks))
    with torch.no_grad():
        for t in range(n):
            m(seq[:, t:t + 1], kv_cache=rolling)
            m(seq[:, t:t + 1], kv_cache=full)
    c = m.config
    assert (rolling.held, full.held) == (W, n)
    assert all(layer.k.shape[-2] == layer.v.shape[-2] == W for layer in rolling.layers)
    assert rolling.nbytes() == kv_cache_bytes(c.n_layers, c.n_kv_heads, c.d_head, W, bytes_per_elem=8)
    assert full.nbytes() == kv_cache_bytes(c.n_layers, c.n_kv_heads, c.d_head, n, bytes_per_elem=8)
    print(f"after {n} tokens: rolling cache (window {W}, 2 sinks) holds {rolling.held} keys per layer, "
          f"{rolling.nbytes()} bytes; full cache {full.held} keys, {full.nbytes()} bytes")


def test_a_layer_cache_alone():
    """The cache by itself: what update returns, what it keeps, and the positions it reports."""
    cache = RollingKVCache(window=4, sinks=1)
    k = torch.arange(10.0).reshape(1, 1, 10, 1)
    assert cache.key_positions(3).tolist() == [0, 1, 2]
    out, _ = cache.update(k[:, :, :3], k[:, :, :3])
    assert out.flatten().tolist() == [0, 1, 2] and cache.positions.tolist() == [0, 1, 2]
    assert cache.key_positions(4).tolist() == [0, 1, 2, 3, 4, 5, 6]
    out, _ = cache.update(k[:, :, 3:7], k[:, :, 3:7])
    assert out.flatten().tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert cache.k.flatten().tolist() == [0, 4, 5, 6] and (cache.length, cache.held) == (7, 4)
    out, _ = cache.update(k[:, :, 7:8], k[:, :, 7:8])
    assert out.flatten().tolist() == [0, 4, 5, 6, 7] and cache.positions.tolist() == [0, 5, 6, 7]
    plain = LayerKVCache()
    plain.update(k, k)
    assert (plain.length, plain.held) == (10, 10) and plain.key_positions(2).tolist() == list(range(12))


def test_mismatches_are_refused():
    with pytest.raises(ValueError, match="0 <= sinks < window"):
        RollingKVCache(window=4, sinks=4)
    with pytest.raises(ValueError, match="needs a window"):
        KVCache(2, sinks=2)
    with pytest.raises(ValueError, match="attention_sinks=2 needs a sliding_window"):
        GPTConfig(vocab_size=10, attention_sinks=2)
    with pytest.raises(ValueError, match="attention_sinks=6 needs a sliding_window"):
        GPTConfig(vocab_size=10, sliding_window=6, attention_sinks=6)
    m = model(sinks=2)
    with pytest.raises(ValueError, match="use model.new_kv_cache"):
        m(ids(1, 3), kv_cache=KVCache(2, window=W))
    assert not isinstance(GPT(dataclasses.replace(MISTRAL, sliding_window=None)).new_kv_cache().layers[0],
                          RollingKVCache)


def test_rolling_cache_generation_equals_transformers_mistral():
    """Greedy generation of a transformers Mistral (window 5) for 5 windows, and ours with the rolling cache that
    holds 5 keys per layer: the same tokens, and our step logits equal transformers' on the whole sequence."""
    transformers = pytest.importorskip("transformers", reason="transformers is the test oracle")
    from test_hf_equivalence import _hf_in_float64  # transformers' float32 casts made float64

    from llmarch.model import load_hf_state_dict

    config = transformers.MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        sliding_window=5, rms_norm_eps=1e-5)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with _hf_in_float64(torch.float64):
        hf = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict()).double().eval()
    prompt = ids(1, 3, seed=5)
    with torch.no_grad(), _hf_in_float64(torch.float64):
        theirs = hf.generate(prompt, max_new_tokens=25, do_sample=False, min_new_tokens=25, pad_token_id=0)
        expected = hf(theirs).logits
    with torch.no_grad():
        cache = ours.new_kv_cache()
        steps = [ours(theirs[:, :3], kv_cache=cache)] + [ours(theirs[:, t:t + 1], kv_cache=cache)
                                                          for t in range(3, theirs.shape[1])]
        torch.testing.assert_close(torch.cat(steps, dim=1), expected, **F64)
    assert torch.equal(generate(ours, prompt, 25, greedy=True), theirs)
    assert cache.held == 5


def test_the_ps7_reference_keeps_what_the_library_cache_keeps():
    """ps7's graded step (its reference, written with ``window_sink_mask``) leaves the cache that
    ``RollingKVCache.update`` leaves, on every hidden case of 10 draws."""
    import numpy as np

    from autograder.assignments import ps7_modern

    for draw in range(10):
        for gid in ("test_rolling_cache", "test_rolling_cache_chunks"):
            for case in ps7_modern.CHECKS[gid].cases(np.random.default_rng(draw)):
                keys, values, positions, _, k_new, v_new, window = case.args
                _, kept_k, kept_v, kept_positions = ps7_modern.ref_rolling_cache_step(*case.args, **case.kwargs)
                cache = RollingKVCache(window, case.kwargs.get("sinks", 4))
                if len(positions):  # the case's cache, as the library holds it
                    cache.k, cache.v = torch.from_numpy(keys)[None], torch.from_numpy(values)[None]
                    cache.positions, cache.seen = torch.from_numpy(positions), int(positions[-1]) + 1
                cache.update(torch.from_numpy(k_new)[None], torch.from_numpy(v_new)[None])
                assert cache.positions.tolist() == kept_positions.tolist(), case.note
                assert torch.equal(cache.k[0], torch.from_numpy(kept_k)), case.note
                assert torch.equal(cache.v[0], torch.from_numpy(kept_v)), case.note


def test_a_model_with_full_layers_keeps_every_key():
    """Gemma's pattern (sliding and full layers alternating): the full layers need every key, so the model's cache
    keeps them all, its sliding layers mask the rest, and cached decoding equals the full recompute past the
    window; a rolling cache is refused by name."""
    m = model(layer_types=("sliding", "full"))
    prompt = ids(2, 4, seed=2)
    cached = generate(m, prompt, 4 * W, greedy=True)
    assert torch.equal(cached, generate(m, prompt, 4 * W, greedy=True, use_cache=False))
    assert m.new_kv_cache().window is None
    with pytest.raises(ValueError, match="full-attention layers"):
        m(prompt, kv_cache=KVCache(2, window=W))


@pytest.mark.parametrize("pos_encoding", ["alibi", "t5", "kerple"])
def test_bias_encodings_with_sinks_keep_every_key(pos_encoding):
    """ALiBi, T5 and KERPLE add a bias that takes the held keys as consecutive positions, which a rolling cache's
    sinks are not: the model's cache keeps every key, cached decoding equals the recompute past the window, and a
    rolling cache is refused by name (without sinks the held keys are consecutive, and the cache rolls)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, context_length=64, d_model=32, n_layers=2, n_heads=4, pos_encoding=pos_encoding,
                       sliding_window=3, attention_sinks=1)
    m = GPT(config).double().eval()
    prompt = ids(2, 2, seed=5)
    assert m.new_kv_cache().window is None
    assert torch.equal(generate(m, prompt, 5 * 3, greedy=True), generate(m, prompt, 5 * 3, greedy=True, use_cache=False))
    with pytest.raises(ValueError, match="consecutive positions"):
        m(prompt, kv_cache=KVCache(2, window=3, sinks=1))
    no_sinks = GPT(dataclasses.replace(config, attention_sinks=0)).double().eval()
    assert no_sinks.new_kv_cache().window == 3
    assert torch.equal(generate(no_sinks, prompt, 5 * 3, greedy=True),
                       generate(no_sinks, prompt, 5 * 3, greedy=True, use_cache=False))
