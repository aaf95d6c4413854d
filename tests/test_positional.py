"""llmarch.positional against the official formulas (written out independently here), brute force and properties."""

import math

import numpy as np
import pytest
import torch

from llmarch.attention import MultiHeadAttention, scaled_dot_product_attention
from llmarch.model import GPT, GPTConfig
from llmarch.positional import (
    POS_ENCODINGS,
    ShawRelativePositions,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    apply_rope_complex,
    rope_matrix,
    shaw_relative_positions,
    sinusoidal_encoding,
    t5_relative_bucket,
)


def test_sinusoidal_matches_the_formula_entry_by_entry():
    d, base = 10, 10000.0
    pe = sinusoidal_encoding(7, d, base).double()
    for t in range(7):
        for i in range(d // 2):
            assert pe[t, 2 * i].item() == pytest.approx(math.sin(t / base ** (2 * i / d)), abs=1e-6)
            assert pe[t, 2 * i + 1].item() == pytest.approx(math.cos(t / base ** (2 * i / d)), abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(4, 7)


# --- RoPE -------------------------------------------------------------------------------------------------


def test_rope_score_depends_only_on_the_offset():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 16, generator=g, dtype=torch.float64), torch.randn(1, 16, generator=g, dtype=torch.float64)

    def score(m, n):
        return (apply_rope(q, torch.tensor([m])) @ apply_rope(k, torch.tensor([n])).T).item()

    for m, n in [(3, 1), (10, 2), (0, 7)]:
        for shift in (1, 5, 100, 1000):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-9, abs=1e-9)
    assert score(3, 1) != pytest.approx(score(4, 1))


def test_rope_complex_and_matrix_forms_agree():
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x), apply_rope_complex(x))
    rotated = apply_rope(x)
    for m in range(6):
        torch.testing.assert_close(rotated[:, m], x[:, m] @ rope_matrix(m, 8).T)
    torch.testing.assert_close(rope_matrix(3, 8).T, rope_matrix(-3, 8))
    torch.testing.assert_close(rope_matrix(2, 8) @ rope_matrix(5, 8), rope_matrix(7, 8))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))  # rotations keep lengths


def test_rope_keeps_float32_accurate_at_large_positions():
    x = torch.randn(4, 8)
    positions = torch.tensor([0, 10_000, 100_000, 1_000_000])
    exact = apply_rope(x.double(), positions)
    torch.testing.assert_close(apply_rope(x, positions), exact.float(), atol=1e-5, rtol=1e-5)


def test_rotate_half_layout_matches_the_llama_formula():
    # GPT-NeoX/Llama: x * cos + rotate_half(x) * sin, with cos/sin repeated over both halves.
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    d = 12
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(5, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    expected = x * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()
    torch.testing.assert_close(apply_rope(x, interleaved=False), expected)
    # the two layouts are the same rotation up to a permutation of the features
    perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()
    torch.testing.assert_close(apply_rope(x, interleaved=False)[..., perm], apply_rope(x[..., perm]))


def test_rope_in_attention_rotates_q_and_k_only_and_is_shift_invariant():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, pos_encoding="rope").double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    q, k, v = mha.project_qkv(x)
    heads = scaled_dot_product_attention(apply_rope(q), apply_rope(k), v, is_causal=True)
    expected = mha.o_proj(heads.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(mha(x, is_causal=True), expected)
    torch.testing.assert_close(mha(x, is_causal=True, positions=torch.arange(5) + 37), expected)



def test_rope_in_attention_with_per_row_positions_equals_each_row_alone():
    """(B, T) positions rotate each batch row by its own positions: the same as attending row by row with (T,)
    positions. B equals the number of heads here, the shape at which (B, T) used to broadcast over the heads."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, pos_encoding="rope").double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 9, 10, 11, 20]])
    rows = [mha(x[b : b + 1], is_causal=True, positions=positions[b]) for b in range(2)]
    torch.testing.assert_close(mha(x, is_causal=True, positions=positions), torch.cat(rows))
    assert not torch.allclose(rows[1], mha(x[1:2], is_causal=True))  # the positions did matter
    with pytest.raises(ValueError, match=r"positions has shape \(2, 2, 5\): expected \(5,\) .* or \(2, 5\)"):
        mha(x, positions=torch.zeros(2, 2, 5, dtype=torch.long))

# --- T5 ---------------------------------------------------------------------------------------------------


def official_t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Transcribed from the formula of the official T5 code (mesh TensorFlow / HF), for one integer."""
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += int(n < 0) * num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (16, 64), (64, 256), (6, 10)])
def test_t5_buckets_match_the_official_formula(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-300, 301)
    ours = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    expected = [official_t5_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    assert ours.tolist() == expected


def test_t5_bucket_table_worked_by_hand():
    # Causal, 8 buckets, max distance 16: distances 0..3 are exact; then 4 + floor(log(r/4) / log(16/4) * 4),
    # e.g. r = 6: log(1.5)/log(4)*4 = 1.17 -> 5; r = 12: log(3)/log(4)*4 = 3.17 -> 7; clamped at 7 from r = 12.
    r = torch.arange(17)
    expected = [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 7]
    assert t5_relative_bucket(-r, bidirectional=False, num_buckets=8, max_distance=16).tolist() == expected
    # keys after the query all share bucket 0 in the causal form; the bidirectional form gives them their own half
    assert t5_relative_bucket(r, bidirectional=False, num_buckets=8, max_distance=16).tolist() == [0] * 17
    assert t5_relative_bucket(torch.tensor([-1, 0, 1, 2]), True, 8, 16).tolist() == [1, 0, 5, 6]


def material_t5_bucket(n, B, D):
    """The lecture notes' formula (appendix B.2), with B/2 read as integer division."""
    half = B // 2
    if n < half:
        return n
    if n < D:
        return half + math.floor(math.log(n / half) / math.log(D / half) * half)
    return B - 1


def test_material_t5_example_follows_its_own_formula_not_the_official_one():
    # The appendix's worked example, B = 5 and D = 6, bucket of distance t - i for t, i = 0..9.
    material_rows = [[0] * 10, [1] + [0] * 9, [2, 1] + [0] * 8, [2, 2, 1] + [0] * 7, [3, 2, 2, 1] + [0] * 6,
                     [3, 3, 2, 2, 1] + [0] * 5, [4, 3, 3, 2, 2, 1] + [0] * 4, [4, 4, 3, 3, 2, 2, 1, 0, 0, 0],
                     [4, 4, 4, 3, 3, 2, 2, 1, 0, 0], [4, 4, 4, 4, 3, 3, 2, 2, 1, 0]]
    for t in range(10):
        assert [material_t5_bucket(max(t - i, 0), 5, 6) for i in range(10)] == material_rows[t]
    # The official code scales the logarithmic part by B - B//2 = 3, not B//2 = 2: distance 3 lands in bucket 3.
    official = t5_relative_bucket(-torch.arange(10), bidirectional=False, num_buckets=5, max_distance=6).tolist()
    assert official == [0, 1, 2, 3, 3, 4, 4, 4, 4, 4]
    # for an even number of buckets the two agree
    for n in range(300):
        assert material_t5_bucket(n, 32, 128) == t5_relative_bucket(torch.tensor([-n]), False, 32, 128).item()


def test_t5_bias_module_uses_key_minus_query():
    bias = T5RelativeBias(n_heads=3, num_buckets=8, max_distance=16)
    out = bias(5, 5)
    assert out.shape == (3, 5, 5)
    for i in range(5):
        for j in range(5):
            bucket = official_t5_bucket(j - i, False, 8, 16)
            torch.testing.assert_close(out[:, i, j], bias.embedding.weight[bucket])


# --- ALiBi ------------------------------------------------------------------------------------------------


def official_alibi_slopes(n):
    """The official ALiBi code's get_slopes (Press et al.), written out."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest) + official_alibi_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", list(range(1, 65)))
def test_alibi_slopes_match_the_official_code(n):
    np.testing.assert_allclose(alibi_slopes(n).numpy(), official_alibi_slopes(n), rtol=1e-12)


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    np.testing.assert_allclose(alibi_slopes(8).numpy(), [2.0**-k for k in range(1, 9)])


def test_alibi_slopes_for_sixteen_heads_step_by_a_square_root_of_two():
    np.testing.assert_allclose(alibi_slopes(16).numpy(), [2.0 ** (-k / 2) for k in range(1, 17)])
    # 12 heads (not a power of two): the 8-head slopes, then slopes 1, 3, 5, 7 of the 16-head sequence
    np.testing.assert_allclose(alibi_slopes(12).numpy(),
                               [2.0**-k for k in range(1, 9)] + [2.0 ** (-k / 2) for k in (1, 3, 5, 7)])


def test_alibi_bias_gives_the_same_attention_as_the_official_form():
    # official: scores + slope * j (a per-row constant away from -slope * (i - j)); the softmax cannot tell
    n, t = 4, 6
    scores = torch.randn(n, t, t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    ours = torch.softmax((scores + alibi_bias(n, t)).masked_fill(~causal, -math.inf), -1)
    official = scores + alibi_slopes(n).float()[:, None, None] * torch.arange(t)[None, None, :]
    torch.testing.assert_close(ours, torch.softmax(official.masked_fill(~causal, -math.inf), -1))
    assert alibi_bias(n, t)[0, 5, 2].item() == pytest.approx(-alibi_slopes(n)[0].item() * 3)


# --- Shaw et al. ------------------------------------------------------------------------------------------


def test_shaw_indices_are_clipped_relative_distances():
    idx = shaw_relative_positions(5, 5, max_distance=2)
    for i in range(5):
        for j in range(5):
            assert idx[i, j] == max(-2, min(j - i, 2)) + 2


def test_shaw_attention_matches_a_loop():
    torch.manual_seed(0)
    shaw = ShawRelativePositions(d_head=4, max_distance=2).double()
    q, k, v = (torch.randn(1, 1, 5, 4, dtype=torch.float64) for _ in range(3))
    out = shaw(q, k, v, is_causal=True)
    for i in range(5):
        e = torch.stack([q[0, 0, i] @ (k[0, 0, j] + shaw.key.weight[max(-2, min(j - i, 2)) + 2]) / 2.0
                         for j in range(i + 1)])
        a = torch.softmax(e, 0)
        z = sum(a[j] * (v[0, 0, j] + shaw.value.weight[max(-2, min(j - i, 2)) + 2]) for j in range(i + 1))
        torch.testing.assert_close(out[0, 0, i], z)


# --- GPT with every encoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_gpt_runs_and_stays_causal_with_every_encoding(pos_encoding):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, context_length=8, d_model=16, n_layers=2, n_heads=2,
                          pos_encoding=pos_encoding)).eval()
    idx = torch.randint(0, 13, (2, 8))
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 13
    before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=0, atol=0)
    if pos_encoding != "learned":  # every other encoding accepts sequences longer than the training context
        assert model(torch.randint(0, 13, (1, 20))).shape == (1, 20, 13)


def test_without_positions_a_one_layer_model_cannot_see_word_order():
    # One causal layer: the last position attends to every token as a set, so with NoPE its logits do not
    # change when the earlier tokens are permuted; every positional encoding makes them change.
    idx = torch.tensor([[1, 2, 3, 4, 5, 6]])
    shuffled = torch.tensor([[4, 1, 5, 3, 2, 6]])
    for pos_encoding in POS_ENCODINGS:
        torch.manual_seed(1)
        model = GPT(GPTConfig(vocab_size=7, context_length=8, d_model=16, n_layers=1, n_heads=2,
                              pos_encoding=pos_encoding)).double().eval()
        if pos_encoding == "t5":  # T5 biases start near zero: give them some size
            torch.nn.init.normal_(model.blocks[0].attn.relative_bias.embedding.weight)
        last, last_shuffled = model(idx)[0, -1], model(shuffled)[0, -1]
        if pos_encoding == "none":
            torch.testing.assert_close(last_shuffled, last)
        else:
            assert not torch.allclose(last_shuffled, last, atol=1e-6), pos_encoding


def test_unknown_encoding_is_rejected():
    with pytest.raises(ValueError, match="pos_encoding must be one of"):
        GPTConfig(vocab_size=5, pos_encoding="rotary")
    with pytest.raises(ValueError, match="pos_encoding must be one of"):
        MultiHeadAttention(8, 2, pos_encoding="xpos")
