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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_transformers_mixtral_block(dtype):
    """Float64: transformers' router softmax runs in float32 (``Tensor.float()``) even there; ``_hf_in_float64``
    turns that cast into a float64 one, so both compute the same thing in float64."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from test_hf_moe import _hf_in_float64
    layer = _layer().to(dtype)
    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=4,
                                        num_experts_per_tok=2, hidden_act="silu", router_jitter_noise=0.0)
    config._experts_implementation = "eager"
    block = MixtralSparseMoeBlock(config).to(dtype).eval()
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.weight)
        for e, expert in enumerate(layer.experts):
            block.experts.gate_up_proj[e].copy_(torch.cat([expert.w1.weight, expert.w3.weight]))
            block.experts.down_proj[e].copy_(expert.w2.weight)
    x = torch.randn(3, 7, 16, dtype=dtype)
    with torch.no_grad(), _hf_in_float64(dtype):
        theirs = block(x)
    tol = {torch.float32: 1e-6, torch.float64: 1e-13}[dtype]
    torch.testing.assert_close(layer(x), theirs, rtol=tol, atol=tol)


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


# ----------------------------------------------------------------------------------------------------------
# Routers, balancing terms, capacity (llmarch.moe.MoEConfig), each against a loop over its definition
# ----------------------------------------------------------------------------------------------------------

from llmarch.moe import (  # noqa: E402
    MoEConfig, capacity_keep, expert_capacity, load_balancing_loss, moe_aux_loss, update_expert_bias,
)
from llmarch.stability import z_loss  # noqa: E402

DEEPSEEK = dict(n_experts=8, top_k=2, d_expert=12, n_shared_experts=1, router="sigmoid_bias", n_group=4,
                topk_group=2, routed_scaling_factor=2.5)


def _config_layer(seed=0, **fields):
    torch.manual_seed(seed)
    layer = MoEFeedForward(16, config=MoEConfig(**fields)).double()
    with torch.no_grad():
        layer.router.weight.mul_(5)
        if layer.expert_bias is not None:
            layer.expert_bias.normal_(0, 0.3)
    return layer


def _deepseek_choice_by_loop(scores, bias, n_group, topk_group, top_k):
    """The experts DeepSeek-V3 chooses for one token, written out: groups by the sum of their two best biased
    scores, then the top_k biased scores among the experts of the best groups."""
    choice = [s + b for s, b in zip(scores.tolist(), bias.tolist())]
    size = len(choice) // n_group
    group_score = [sum(sorted(choice[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
    groups = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
    allowed = [e for g in groups for e in range(g * size, (g + 1) * size)]
    return sorted(allowed, key=lambda e: -choice[e])[:top_k]


def test_sigmoid_bias_router_with_groups_and_shared_expert_matches_a_loop():
    layer = _config_layer(**DEEPSEEK)
    x = torch.randn(20, 16, dtype=torch.float64)
    expected = torch.empty_like(x)
    for t in range(20):
        scores = torch.sigmoid(layer.router.weight @ x[t])
        chosen = _deepseek_choice_by_loop(scores, layer.expert_bias, 4, 2, 2)
        total = sum(scores[e] for e in chosen)
        expected[t] = sum(2.5 * scores[e] / total * layer.experts[e](x[t]) for e in chosen) + layer.shared(x[t])
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-12)


def test_the_bias_chooses_but_does_not_weigh():
    """A large bias on one expert makes every token choose it, with its gate still its sigmoid score."""
    layer = _config_layer(**{**DEEPSEEK, "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
                             "routed_scaling_factor": 1.0})
    with torch.no_grad():
        layer.expert_bias.zero_()[3] = 100.0
    x = torch.randn(10, 16, dtype=torch.float64)
    experts, gates = layer.route(x)
    assert (experts == 3).any(dim=1).all()
    scores = torch.sigmoid(x @ layer.router.weight.T)
    torch.testing.assert_close(gates, scores.gather(1, experts), rtol=1e-12, atol=0)


def test_load_balancing_loss_matches_a_loop_and_its_extremes():
    torch.manual_seed(0)
    n, e, k = 30, 6, 2
    probs = torch.softmax(torch.randn(n, e, dtype=torch.float64) * 2, dim=-1)
    experts = probs.topk(k, dim=-1).indices
    f = [sum(int(experts[t, j] == i) for t in range(n) for j in range(k)) / (n * k) for i in range(e)]
    p = [sum(float(probs[t, i]) for t in range(n)) / n for i in range(e)]
    assert float(load_balancing_loss(probs, experts)) == pytest.approx(e * sum(a * b for a, b in zip(f, p)), rel=1e-12)
    uniform = torch.full((e, e), 1 / e, dtype=torch.float64)
    assert float(load_balancing_loss(uniform, torch.arange(e)[:, None])) == pytest.approx(1.0)
    collapsed = torch.zeros(n, e, dtype=torch.float64)
    collapsed[:, 0] = 1
    assert float(load_balancing_loss(collapsed, torch.zeros(n, 1, dtype=torch.long))) == pytest.approx(e)


def test_load_balancing_loss_is_transformers_mixtral_loss_over_top_k():
    pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    torch.manual_seed(1)
    logits = torch.randn(40, 8)
    probs = torch.softmax(logits, dim=-1)
    ours = load_balancing_loss(probs, probs.topk(2, dim=-1).indices)
    theirs = load_balancing_loss_func((logits,), num_experts=8, top_k=2)
    assert float(theirs) == pytest.approx(2 * float(ours), rel=1e-6)


def test_layer_records_its_balance_and_z_terms_with_gradients():
    layer = _config_layer(n_experts=5, top_k=2, d_expert=12)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    layer(x)
    logits = x.reshape(-1, 16) @ layer.router.weight.T
    probs = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(layer.aux["balance"], load_balancing_loss(probs, probs.topk(2, -1).indices))
    z = sum(torch.logsumexp(row, 0) ** 2 for row in logits) / len(logits)
    torch.testing.assert_close(layer.aux["z"], z)
    torch.testing.assert_close(layer.aux["z"], z_loss(logits))
    assert layer.aux["load"].sum() == 21 * 2
    (layer.aux["balance"] + layer.aux["z"]).backward()
    assert layer.router.weight.grad.abs().sum() > 0


def test_expert_bias_update_matches_its_rule_and_balances_a_skewed_router():
    bias, load = torch.tensor([0.0, 0.1, -0.2, 0.0]), torch.tensor([10.0, 2.0, 4.0, 4.0])
    sign = {True: 1, False: -1}
    expected = [b + 0.01 * (sign[n < 5.0] if n != 5.0 else 0) for b, n in zip(bias.tolist(), load.tolist())]
    torch.testing.assert_close(update_expert_bias(bias.clone(), load, 0.01), torch.tensor(expected))
    layer = _config_layer(n_experts=8, top_k=2, d_expert=12, router="sigmoid_bias", bias_update_rate=0.02)
    with torch.no_grad():  # experts 0 and 1 score far from 1/2 for most tokens
        layer.expert_bias.zero_()
        layer.router.weight.div_(5)
        layer.router.weight[:2] += layer.router.weight[:2].sign()
    x = torch.randn(256, 16, dtype=torch.float64)

    def imbalance():
        layer(x)
        return float(layer.aux["load"].max() / layer.aux["load"].mean())

    before = imbalance()
    for _ in range(100):
        layer(x)
        layer.update_bias()
    assert imbalance() < 0.75 * before and before > 1.5


def test_capacity_drops_assignments_past_each_experts_queue():
    assert expert_capacity(10, 4, 2, 1.0) == 5 and expert_capacity(10, 4, 1, 1.25) == 4
    torch.manual_seed(0)
    experts = torch.randint(0, 3, (12, 2))
    keep = capacity_keep(experts, 3, capacity=4)
    queue, expected = [0, 0, 0], torch.zeros(12, 2, dtype=torch.bool)
    for slot in range(2):  # first choices of every token before any second choice
        for t in range(12):
            e = int(experts[t, slot])
            expected[t, slot] = queue[e] < 4
            queue[e] += 1
    assert torch.equal(keep, expected)


def test_a_layer_with_capacity_skips_the_dropped_assignments():
    layer = _config_layer(n_experts=4, top_k=2, d_expert=12, capacity_factor=0.5)
    x = torch.randn(16, 16, dtype=torch.float64)
    experts, gates = layer.route(x)
    keep = capacity_keep(experts, 4, expert_capacity(16, 4, 2, 0.5))
    assert not keep.all()
    expected = torch.stack([sum((gates[t, j] * layer.experts[int(experts[t, j])](x[t])
                                 for j in range(2) if keep[t, j]), torch.zeros(16, dtype=torch.float64))
                            for t in range(16)])
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-12)
    assert float(layer.aux["dropped"]) == pytest.approx(1 - keep.float().mean().item())
    roomy = MoEFeedForward(16, config=MoEConfig(n_experts=4, top_k=2, d_expert=12, capacity_factor=4.0)).double()
    roomy.load_state_dict(layer.state_dict())
    layer.config.capacity_factor = None
    torch.testing.assert_close(roomy(x), layer(x), rtol=0, atol=0)


def test_a_model_with_experts_sums_its_layers_aux_terms():
    from llmarch.model import GPT, llama_config
    torch.manual_seed(0)
    moe = MoEConfig(n_experts=4, top_k=2, d_expert=8, balance_coef=0.02, z_coef=0.003, first_dense_layers=1)
    model = GPT(llama_config("llama-3-8b", vocab_size=20, context_length=16, d_model=16, n_layers=3, n_heads=2,
                             n_kv_heads=1, d_ff=24, moe=moe)).double()
    assert [type(b.ffn).__name__ for b in model.blocks] == ["SwiGLU", "MoEFeedForward", "MoEFeedForward"]
    model(torch.randint(0, 20, (2, 9)))
    layers = [b.ffn for b in model.blocks[1:]]
    expected = sum(0.02 * m.aux["balance"] + 0.003 * m.aux["z"] for m in layers)
    torch.testing.assert_close(model.aux_loss(), expected)
    dense = GPT(llama_config("llama-3-8b", vocab_size=20, context_length=16, d_model=16, n_layers=1, n_heads=2,
                             n_kv_heads=1, d_ff=24))
    dense(torch.randint(0, 20, (1, 4)))
    assert float(dense.aux_loss()) == 0.0 == float(moe_aux_loss(dense))


def test_parameter_counts_with_shared_experts_match_the_module():
    layer = MoEFeedForward(16, config=MoEConfig(n_experts=6, top_k=2, d_expert=24, n_shared_experts=2))
    counts = moe_parameter_counts(16, 24, 6, 2, n_shared_experts=2)
    assert counts["total"] == count_parameters(layer)
    assert counts["active"] == 16 * 6 + 4 * 3 * 16 * 24


@pytest.mark.parametrize("fields, message", [
    (dict(n_experts=4, router="top1"), "router"),
    (dict(n_experts=6, n_group=4), "groups"),
    (dict(n_experts=8, n_group=2, topk_group=1), "sigmoid_bias"),
    (dict(n_experts=4, capacity_factor=0.0), "capacity_factor"),
    (dict(n_experts=4, d_expert=0), "d_expert"),
    (dict(n_experts=4, balance_coef=-1.0), "balance_coef"),
    (dict(n_experts=4, top_k=2.0), "top_k must be an int"),
    (dict(n_experts=4.5), "n_experts must be an int"),
])
def test_bad_configs_are_named(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        MoEConfig(**fields)


def test_a_model_whose_dense_layers_leave_no_expert_layer_is_refused():
    from llmarch.model import GPTConfig
    with pytest.raises(ValueError, match="first_dense_layers=5 leaves no mixture-of-experts layer"):
        GPTConfig(vocab_size=10, n_layers=2, moe=MoEConfig(n_experts=4, first_dense_layers=5))
