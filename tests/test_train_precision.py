"""Mixed precision and memory (llmarch.train.precision): the loss scaler against torch.amp.GradScaler,
checkpointed blocks against plain ones, memory_budget against the bytes autograd saves and the ZeRO
paper's worked example."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.optim import AdamW
from llmarch.train import LossScaler, checkpoint_blocks, memory_budget, saved_tensor_bytes, train_step


def test_loss_scaler_follows_torch_grad_scaler_through_overflows_and_growth():
    torch.manual_seed(0)
    w_ours = torch.randn(6, requires_grad=True)
    w_ref = w_ours.detach().clone().requires_grad_()
    opt_ours, opt_ref = torch.optim.SGD([w_ours], lr=0.1), torch.optim.SGD([w_ref], lr=0.1)
    ours = LossScaler(init_scale=2.0**10, growth_interval=3)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    overflow_steps = {1, 2, 7}
    scales = []
    for step in range(12):
        for w, opt, scaler in ((w_ours, opt_ours, ours), (w_ref, opt_ref, ref)):
            loss = (w**2).sum() * (math.inf if step in overflow_steps else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert ours.get_scale() == ref.get_scale()
        torch.testing.assert_close(w_ours, w_ref, rtol=0, atol=0)
        scales.append(ours.get_scale())
    # backs off on each overflow, grows after 3 clean steps in a row
    assert scales[:4] == [2.0**10, 2.0**9, 2.0**8, 2.0**8] and scales[5] == 2.0**9 and scales[7] == 2.0**8


def test_fp16_gradients_underflow_without_loss_scaling():
    """A real underflow: a gradient of 1e-8 is 0 in fp16 (smallest subnormal ~6e-8), 2^16 * 1e-8 is not."""
    w = torch.ones(4, dtype=torch.float16, requires_grad=True)
    (w.sum() * 1e-8).backward()
    assert torch.all(w.grad == 0)
    w.grad = None
    scaler = LossScaler()
    scaler.scale(w.sum() * 1e-8).backward()
    assert torch.all(w.grad > 0)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_keeps_fp32_master_weights_and_learns(precision):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=8, d_model=16, n_layers=1, n_heads=2))
    opt = AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 11, (4, 8))
    scaler = LossScaler() if precision == "fp16" else None
    losses = [train_step(model, opt, [(x, x)], precision=precision, scaler=scaler).loss for _ in range(10)]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < 0.7 * losses[0]  # copying the input is easy: the loss must fall
    with pytest.raises(ValueError, match="needs a loss scaler"):
        train_step(model, opt, [(x, x)], precision="fp16")


def test_checkpointed_blocks_give_the_same_gradients():
    x = torch.randint(0, 11, (3, 8))
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=11, context_length=8, d_model=16, n_layers=2, n_heads=2, dropout=0.1))
        if checkpointed:
            checkpoint_blocks(model)
        torch.manual_seed(1)  # the same dropout masks: checkpoint replays the RNG state in the recomputation
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)


class ReferenceBlock(nn.Module):
    """A GPT-2 block from torch primitives (fused QKV, explicit softmax), the block Korthikanti et al. count."""

    def __init__(self, h, a, p):
        super().__init__()
        self.a, self.p = a, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = (z.view(b, t, self.a, h // self.a).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(h, -1))
        scores = (q @ k.transpose(-2, -1)) * (h // self.a) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = F.dropout(scores.masked_fill(causal, -math.inf).softmax(-1), self.p, self.training)
        x = x + F.dropout(self.proj((att @ v).transpose(1, 2).reshape(b, t, h)), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, self.training)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_memory_budget_activations_match_the_tensors_autograd_saves(precision, dropout):
    b, s, h, a = 3, 16, 32, 4
    dtype, e = (torch.float32, 4) if precision == "fp32" else (torch.bfloat16, 2)
    block = ReferenceBlock(h, a, dropout).to(dtype)
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    _, measured = saved_tensor_bytes(block, x, exclude=tuple(block.parameters()))
    config = GPTConfig(vocab_size=10, context_length=s, d_model=h, n_layers=1, n_heads=a, dropout=dropout)
    # torch's CPU dropout stores its mask in the activation dtype (e bytes), not as bool
    budget = memory_budget(config, b, s, precision, mask_bytes=e)
    small_terms = 2 * 2 * b * s * 4 + s * s  # the norms' mean and 1/std, the causal mask
    assert budget.activations_per_layer <= measured <= budget.activations_per_layer + small_terms


def test_memory_budget_reproduces_the_zero_papers_worked_example():
    """Rajbhandari et al. (2020), Figure 1: 7.5B parameters, Adam in mixed precision, N_d = 64 GPUs:
    120 GB per GPU for DDP, 31.4 GB with P_os, 16.6 GB with P_os+g, 1.9 GB with P_os+g+p."""
    config = GPTConfig(vocab_size=50_000, context_length=2048, d_model=4096, n_layers=35, n_heads=32,
                       tie_embeddings=False)
    with torch.device("meta"):
        n_params = count_parameters(GPT(config))
    assert 7.4e9 < n_params < 7.6e9
    expected = {"ddp": 120, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}
    for strategy, gigabytes in expected.items():
        budget = memory_budget(config, 1, 2048, "bf16", strategy, world_size=64)
        per_param = (budget.params + budget.grads + budget.optimizer) / n_params
        assert per_param == pytest.approx(gigabytes / 7.5, abs=0.05 / 7.5), strategy  # figures to 0.1 GB
    fp32 = memory_budget(config, 1, 2048, "fp32")
    assert fp32.params == 4 * n_params and fp32.optimizer == 8 * n_params
    with pytest.raises(ValueError, match="parallelism must be one of"):
        memory_budget(config, 1, 8, "bf16", "zero4")


def test_saved_tensor_bytes_counts_a_shared_storage_once():
    x = torch.randn(100, requires_grad=True)
    _, n = saved_tensor_bytes(lambda t: (t * t).sum(), x)  # mul saves x twice (as both factors)
    assert n == 400


@pytest.mark.cuda
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_memory_budget_activations_match_cuda_allocations(dropout):
    """On a GPU: the bytes allocated by the forward pass of a bf16 block (what stays alive for the backward)
    against the formula with CUDA's 1-byte dropout masks; the caching allocator rounds each block up to
    512 bytes, hence 2% plus the small terms."""
    b, s, h, a = 4, 512, 256, 4
    block = ReferenceBlock(h, a, dropout).to("cuda", torch.bfloat16)
    x = torch.randn(b, s, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = block(x)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size() + x.numel() * 2  # + input
    config = GPTConfig(vocab_size=10, context_length=s, d_model=h, n_layers=1, n_heads=a, dropout=dropout)
    expected = memory_budget(config, b, s, "bf16").activations_per_layer
    small_terms = 2 * 2 * b * s * 4 + s * s
    assert expected * 0.98 <= kept <= expected * 1.02 + small_terms, (kept, expected)


@pytest.mark.cuda
def test_bf16_autocast_training_runs_on_cuda():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=8, d_model=16, n_layers=1, n_heads=2)).cuda()
    opt = AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 11, (4, 8), device="cuda")
    losses = [train_step(model, opt, [(x, x)], precision="bf16").loss for _ in range(10)]
    assert all(p.dtype == torch.float32 for p in model.parameters()) and losses[-1] < 0.7 * losses[0]
