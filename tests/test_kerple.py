"""KERPLE (Chi et al., 2022): the bias against the paper's formulas, ALiBi as a special case, the conditionally
positive definite property the method rests on, and the model against an explicit bias and its own cache."""

import math

import pytest
import torch

from llmarch.efficient import flex_attention_with
from llmarch.efficient.flex import causal_mask_mod, kerple_score_mod
from llmarch.kv_cache import KVCache
from llmarch.model import GPT, GPTConfig
from llmarch.positional import KerpleBias, alibi_bias, alibi_slopes, kerple_bias

F64 = {"dtype": torch.float64}


def brute_force_bias(variant, r1, r2, t_q, t_k, offset):
    """The paper's kernels, entry by entry: -r1 log(1 + r2 |m - n|) and -r1 |m - n|^r2."""
    out = torch.empty(len(r1), t_q, t_k, **F64)
    for h in range(len(r1)):
        for i in range(t_q):
            for j in range(t_k):
                n = abs(i + offset - j)
                a, b = float(r1[h]), float(r2[h])
                out[h, i, j] = -a * math.log(1 + b * n) if variant == "log" else -a * n ** b
    return out


@pytest.mark.parametrize("variant", ["log", "power"])
@pytest.mark.parametrize("t_q, t_k, offset", [(6, 6, None), (3, 9, None), (4, 7, 1)])
def test_bias_matches_the_papers_formulas(variant, t_q, t_k, offset):
    gen = torch.Generator().manual_seed(0)
    r1 = torch.rand(5, generator=gen, **F64) * 2 + 0.01
    r2 = torch.rand(5, generator=gen, **F64) * (2 if variant == "power" else 1) + 0.01
    expected = brute_force_bias(variant, r1, r2, t_q, t_k, t_k - t_q if offset is None else offset)
    torch.testing.assert_close(kerple_bias(5, t_q, t_k, variant, r1, r2, offset), expected, rtol=1e-12, atol=1e-12)


def test_power_variant_with_exponent_one_is_alibi():
    heads, t = 8, 12
    kerple = kerple_bias(heads, t, variant="power", r1=alibi_slopes(heads), r2=1.0)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    torch.testing.assert_close(kerple[:, causal], alibi_bias(heads, t).double()[:, causal], rtol=0, atol=1e-6)
    # with the queries the last t_q of t_k positions (cached decoding), too
    kerple_tail = kerple_bias(heads, 3, t, variant="power", r1=alibi_slopes(heads), r2=1.0)
    torch.testing.assert_close(kerple_tail[:, :, :-2], alibi_bias(heads, 3, t).double()[:, :, :-2], rtol=0, atol=1e-6)


def quadratic_forms(kernel, n_points=24, n_vectors=400, seed=0):
    """``c^T K c`` for random integer positions and random ``c`` with ``sum(c) = 0``."""
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 200, (n_points,), generator=gen).double()
    matrix = kernel((positions[:, None] - positions[None, :]).abs())
    c = torch.randn(n_vectors, n_points, generator=gen, **F64)
    c = c - c.mean(dim=1, keepdim=True)
    return torch.einsum("vi,ij,vj->v", c, matrix, c), matrix


@pytest.mark.parametrize("variant, r1, r2", [("log", 1.3, 0.7), ("log", 0.2, 5.0), ("power", 0.8, 0.5),
                                             ("power", 1.0, 1.0), ("power", 0.4, 2.0)])
def test_kernels_are_conditionally_positive_definite(variant, r1, r2):
    """The property the method rests on (Chi et al., 2022, Sec. 3): the bias is a CPD kernel, so
    ``sum_ij c_i c_j k(m_i, m_j) >= 0`` whenever ``sum_i c_i = 0``, and exp of it is positive definite."""
    def kernel(n):
        return -r1 * torch.log1p(r2 * n) if variant == "log" else -r1 * n ** r2

    forms, matrix = quadratic_forms(kernel)
    scale = matrix.abs().max().item()
    assert forms.min().item() >= -1e-9 * scale * len(matrix), forms.min()
    # Schoenberg: exp(t k) is positive definite for every t > 0, the form the softmax uses
    for t in (0.05, 1.0):
        assert torch.linalg.eigvalsh(torch.exp(t * matrix)).min().item() > -1e-9


def test_the_cpd_check_can_fail():
    """An exponent above 2 is not CPD: the same check finds a negative form, so the property test has teeth."""
    forms, _ = quadratic_forms(lambda n: -n ** 3.0)
    assert forms.min().item() < 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="variant"):
        kerple_bias(2, 4, variant="gauss")
    with pytest.raises(ValueError, match="0 < r2 <= 2"):
        kerple_bias(2, 4, variant="power", r2=2.5)
    with pytest.raises(ValueError, match="r1 > 0"):
        kerple_bias(2, 4, r1=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"r2 has shape \(3,\)"):
        kerple_bias(2, 4, r2=torch.ones(3))
    with pytest.raises(ValueError, match="kerple_variant"):
        GPTConfig(vocab_size=8, pos_encoding="kerple", kerple_variant="cosine")


@pytest.mark.parametrize("variant", ["log", "power"])
def test_learned_parameters_stay_positive_and_get_finite_gradients(variant):
    torch.manual_seed(0)
    module = KerpleBias(4, variant)
    with torch.no_grad():
        module.raw_r1.fill_(-30.0)
        module.raw_r2.fill_(-30.0 if variant == "log" else 30.0)
    assert (module.r1 > 0).all() and (module.r2 > 0).all()
    if variant == "power":
        assert (module.r2 <= 2).all()
    module = KerpleBias(4, variant)
    module(5, 5).sum().backward()  # distance 0 is on the diagonal: n ** r2 must not give a nan gradient there
    for p in (module.raw_r1, module.raw_r2):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", ["log", "power"])
def test_model_equals_the_same_attention_with_an_explicit_bias(variant):
    """A GPT block with ``pos_encoding="kerple"`` against softmax(q k^T / sqrt(d) + bias) computed by hand."""
    torch.manual_seed(1)
    config = GPTConfig(vocab_size=20, context_length=16, d_model=24, n_layers=1, n_heads=3,
                       pos_encoding="kerple", kerple_variant=variant)
    model = GPT(config).double().eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 7, 24, **F64)
    b, t, h, d = 2, 7, 3, 8
    q = attn.q_proj(x).view(b, t, h, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, h, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, h, d).transpose(1, 2)
    bias = kerple_bias(h, t, variant=variant, r1=attn.relative_bias.r1, r2=attn.relative_bias.r2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    expected = attn.o_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, h * d))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, is_causal=True), expected.detach(), rtol=1e-10, atol=1e-12)


def test_model_gradients_reach_the_kernel_parameters():
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=20, context_length=16, d_model=16, n_layers=2, n_heads=2,
                          pos_encoding="kerple"))
    idx = torch.randint(0, 20, (2, 9))
    torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    grads = [p.grad for n, p in model.named_parameters() if "relative_bias" in n]
    assert len(grads) == 4 and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_cache_equals_no_cache(variant):
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=20, context_length=32, d_model=16, n_layers=2, n_heads=2,
                          pos_encoding="kerple", kerple_variant=variant)).double().eval()
    idx = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(2)
        steps = [model(idx[:, :5], kv_cache=cache)] + [model(idx[:, t : t + 1], kv_cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)


def test_beyond_the_training_length_the_model_runs():
    """No table limits the length: a model built for 16 positions scores 64 (what the book's experiment uses)."""
    model = GPT(GPTConfig(vocab_size=20, context_length=16, d_model=16, n_layers=1, n_heads=2,
                          pos_encoding="kerple"))
    assert torch.isfinite(model(torch.randint(0, 20, (1, 64)))).all()


@pytest.mark.parametrize("variant", ["log", "power"])
@pytest.mark.parametrize("t_q, t_k", [(8, 8), (3, 8)])
def test_flex_score_mod_matches_the_bias(variant, t_q, t_k):
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, t, 8, **F64) for t in (t_q, t_k, t_k))
    r1, r2 = torch.tensor([0.5, 1.0, 1.5], **F64), torch.tensor([0.3, 0.9, 1.7], **F64)
    offset = t_k - t_q
    out = flex_attention_with(q, k, v, mask_mod=causal_mask_mod(offset),
                              score_mod=kerple_score_mod(r1, r2, variant, offset))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + kerple_bias(3, t_q, t_k, variant, r1, r2)
    scores = scores.masked_fill(~torch.ones(t_q, t_k, dtype=torch.bool).tril(offset), -math.inf)
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant,r1_high,r2_high", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_initial_parameters_follow_the_authors_ranges(variant, r1_high, r2_high):
    """The authors' code (chijames/KERPLE, megatron/mpu/layers.py) draws the log kernel's coefficient and the power
    kernel's exponent from U(0, 2) and the other parameter from U(0, 1): -p log(1 + a n) and -a n^p."""
    torch.manual_seed(0)
    module = KerpleBias(4000, variant)
    for r, high in ((module.r1.detach(), r1_high), (module.r2.detach(), r2_high)):
        assert 0.01 - 1e-6 <= r.min() and r.max() <= high + 1e-6 and r.max() > 0.95 * high
        assert abs(float(r.mean()) - high / 2) < 0.05 * high  # uniform, not piled at one end
