"""The mixture-of-experts layer against transformers' Mixtral block, a brute-force loop and a dense equivalent."""

import pytest
import torch
import torch.nn.functional as F

from llmarch.model import count_parameters
from llmarch.moe import MoEFeedForward, moe_parameter_counts


def _layer(n_experts=4, top_k=2, d_model=16, d_ff=24, seed=0):
    torch.manual_seed(seed)
    layer = MoEFeedForward(d_model, d_ff, n_experts, top_k).double()
    with torch.no_grad():  # spread the router so that the top-k choice is never a near tie
        layer.router.weight.mul_(5)
    return layer


def test_matches_transformers_mixtral_block():
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    layer = _layer()
    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=4,
                                        num_experts_per_tok=2, hidden_act="silu", router_jitter_noise=0.0)
    block = MixtralSparseMoeBlock(config).double().eval()
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.weight)
        for e, expert in enumerate(layer.experts):
            block.experts.gate_up_proj[e].copy_(torch.cat([expert.w1.weight, expert.w3.weight]))
            block.experts.down_proj[e].copy_(expert.w2.weight)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        # transformers' router computes its softmax in float32 even for float64 inputs
        torch.testing.assert_close(layer(x), block(x), rtol=1e-6, atol=1e-6)


def test_matches_a_loop_over_tokens():
    layer = _layer(n_experts=5, top_k=2)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    expected = torch.empty_like(x)
    for b in range(2):
        for t in range(6):
            probs = torch.softmax(layer.router.weight @ x[b, t], dim=0)
            chosen = sorted(range(5), key=lambda e: -probs[e].item())[:2]
            total = sum(probs[e] for e in chosen)
            expected[b, t] = sum(probs[e] / total * layer.experts[e](x[b, t]) for e in chosen)
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-12)


def test_all_experts_with_equal_gates_is_the_mean_of_dense_ffns():
    layer = _layer(n_experts=3, top_k=3)
    with torch.no_grad():
        layer.router.weight.zero_()  # equal router scores: every gate is 1/3
    x = torch.randn(4, 5, 16, dtype=torch.float64)
    dense = sum(expert.w2(F.silu(expert.w1(x)) * expert.w3(x)) for expert in layer.experts) / 3
    torch.testing.assert_close(layer(x), dense, rtol=1e-10, atol=1e-12)


def test_top_1_is_the_chosen_expert_alone_with_weight_1():
    layer = _layer(n_experts=4, top_k=1)
    x = torch.randn(10, 16, dtype=torch.float64)
    chosen = (x @ layer.router.weight.T).argmax(-1)
    expected = torch.stack([layer.experts[int(e)](row) for e, row in zip(chosen, x)])
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        layer.router.weight.zero_()
    experts, weights = layer.route(x)
    assert experts.shape == (10, 1) and torch.all(weights == 1)


def test_parameter_counts_match_the_module():
    layer = MoEFeedForward(16, 24, n_experts=6, top_k=2)
    counts = moe_parameter_counts(16, 24, 6, 2)
    assert counts["total"] == count_parameters(layer) == 16 * 6 + 6 * 3 * 16 * 24
    assert counts["active"] == 16 * 6 + 2 * 3 * 16 * 24


def test_bad_input_is_named():
    layer = MoEFeedForward(16, 24, 4, 2)
    with pytest.raises(ValueError, match="d_model=16"):
        layer(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="top_k"):
        MoEFeedForward(16, 24, 2, 3)
    with pytest.raises(ValueError, match="top_k"):
        moe_parameter_counts(16, 24, 2, 3)
