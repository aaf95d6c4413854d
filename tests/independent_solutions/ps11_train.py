"""An independent solution of ps11-train: written from the release notebook's text alone."""
ANSWERS = {
    "RMSNorm": '''class RMSNorm(nn.Module):
    """x (..., d) -> weight * x / sqrt(mean(x**2, last axis) + eps)."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        mean_square = (x * x).sum(dim=-1, keepdim=True) / x.shape[-1]
        return self.weight * (x / torch.sqrt(mean_square + self.eps))
''',
    "SwiGLU": '''class SwiGLU(nn.Module):
    """x (..., d_model) -> w2(silu(w1 x) * w3 x), shape (..., d_model)."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        gate = self.w1(x)
        return self.w2(gate * torch.sigmoid(gate) * self.w3(x))
''',
    "RotaryEmbedding": '''class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE: x (..., T, d_head), positions (T,) long -> x rotated by positions * theta_i."""

    def __init__(self, d_head, base=10000.0):
        super().__init__()
        self.d_head, self.base = d_head, float(base)

    def forward(self, x, positions):
        half = self.d_head // 2
        exponents = torch.arange(half, dtype=torch.float64, device=x.device) * (2.0 / self.d_head)
        theta = 1.0 / torch.pow(torch.tensor(self.base, dtype=torch.float64, device=x.device), exponents)
        angles = torch.outer(positions.to(device=x.device, dtype=torch.float64), theta)  # (T, d/2)
        cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
        first, second = x[..., :half], x[..., half:]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
''',
    "Attention": '''class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE: x (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, d_model, n_heads, n_kv_heads, rope_base=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(n_heads * self.d_head, d_model, bias=False)
        self.rope = RotaryEmbedding(self.d_head, rope_base)

    def forward(self, x, cache=None):
        batch, new, _ = x.shape
        past = 0 if cache is None else cache.length
        positions = torch.arange(past, past + new, device=x.device)
        heads = lambda t, h: t.view(batch, new, h, self.d_head).transpose(1, 2)
        q = self.rope(heads(self.q_proj(x), self.n_heads), positions)
        k = self.rope(heads(self.k_proj(x), self.n_kv_heads), positions)
        v = heads(self.v_proj(x), self.n_kv_heads)
        if cache is not None:
            if cache.k is not None:
                k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
            cache.k, cache.v = k, v
        # group the query heads by the key/value head they share: (B, H_kv, g, T, d_head)
        group = self.n_heads // self.n_kv_heads
        q = q.reshape(batch, self.n_kv_heads, group, new, self.d_head)
        scores = torch.einsum("bjgtd,bjsd->bjgts", q, k) / math.sqrt(self.d_head)
        query_pos = torch.arange(past, past + new, device=x.device)[:, None]
        key_pos = torch.arange(k.shape[2], device=x.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = torch.einsum("bjgts,bjsd->bjgtd", weights, v).reshape(batch, self.n_heads, new, self.d_head)
        return self.o_proj(out.transpose(1, 2).reshape(batch, new, self.n_heads * self.d_head))
''',
    "Llama": '''class Block(nn.Module):
    """Pre-norm Llama block: x (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, rope_base=10000.0, eps=1e-5):
        super().__init__()
        self.norm1 = RMSNorm(d_model, eps)
        self.attn = Attention(d_model, n_heads, n_kv_heads, rope_base)
        self.norm2 = RMSNorm(d_model, eps)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x, cache=None):
        h = x + self.attn(self.norm1(x), cache)
        return h + self.ffn(self.norm2(h))


class Llama(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, rope_base=10000.0, eps=1e-5):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            [Block(d_model, n_heads, n_kv_heads, d_ff, rope_base, eps) for _ in range(n_layers)])
        self.norm_f = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, caches=None):
        h = self.tok_emb(idx)
        for i, block in enumerate(self.blocks):
            h = block(h, None if caches is None else caches[i])
        return self.lm_head(self.norm_f(h))
''',
    "AdamW": '''class AdamW(torch.optim.Optimizer):
    """AdamW with decoupled weight decay, as torch.optim.AdamW (amsgrad=False, maximize=False)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, state = p.grad, self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t, m, v = state["step"], state["m"], state["v"]
                p.mul_(1.0 - lr * group["weight_decay"])
                m.mul_(beta1).add_((1.0 - beta1) * g)
                v.mul_(beta2).add_((1.0 - beta2) * g * g)
                m_hat = m / (1.0 - beta1 ** t)
                v_hat = v / (1.0 - beta2 ** t)
                p.sub_(lr * m_hat / (v_hat.sqrt() + group["eps"]))
        return loss
''',
    "lr_schedule": '''def lr_schedule(step, max_lr, min_lr, warmup_steps, cosine_steps):
    """Linear warm-up from 0 to max_lr over warmup_steps, cosine to min_lr at cosine_steps, then min_lr."""
    if step < warmup_steps:
        return float(max_lr * step / warmup_steps)
    if step > cosine_steps:
        return float(min_lr)
    span = cosine_steps - warmup_steps
    progress = (step - warmup_steps) / span if span > 0 else 0.0
    return float(min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress)))
''',
    "clip_grad_norm": '''def clip_grad_norm(parameters, max_norm):
    """Scale all gradients in place so that their global L2 norm is at most max_norm; return the norm before."""
    if torch.is_tensor(parameters):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        total = total + (g.detach().double() ** 2).sum().cpu()
    norm = total.sqrt()
    if norm > max_norm:
        factor = max_norm / (float(norm) + 1e-6)
        for g in grads:
            g.mul_(factor)
    return norm.to(grads[0].dtype)
''',
    "train_steps": '''def train_steps(model, optimizer, get_batch, start_step, end_step, hp):
    """Run the steps start_step .. end_step - 1 (schedule, loss, clipping, update); return the losses."""
    losses = []
    for step in range(start_step, end_step):
        lr = lr_schedule(step, hp["max_lr"], hp["min_lr"], hp["warmup_steps"], hp["cosine_steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(step)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(list(model.parameters()), hp["clip"])
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses
''',
    "save_checkpoint": '''def save_checkpoint(path, model, optimizer, step):
    """Write the model's and optimizer's state and the next step to `path`."""
    torch.save({"next_step": int(step), "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def load_checkpoint(path, model, optimizer):
    """Load a checkpoint written by save_checkpoint into model and optimizer; return the step to run next."""
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["next_step"])
''',
    "model": '''torch.manual_seed(0)
tokens = torch.as_tensor(CORPUS["train"].astype(np.int64))
SEQ, BATCH, STEPS = 64, 16, 300
# windows of SEQ + 1 tokens that start right after a full stop (token 0), as the held-out sentences do
starts = torch.nonzero(tokens[:-(SEQ + 2)] == 0).squeeze(1) + 1


def get_batch(step):
    """The batch of a step depends only on the step: x (BATCH, SEQ) and y, x shifted by one."""
    gen = torch.Generator().manual_seed(1000 + step)
    rows = starts[torch.randint(len(starts), (BATCH,), generator=gen)]
    window = tokens[rows[:, None] + torch.arange(SEQ + 1)]
    return window[:, :-1], window[:, 1:]


model = Llama(len(CORPUS["vocab"]), d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=172)  # the stated shape
optimizer = AdamW(model.parameters(), weight_decay=0.01)
hp = dict(max_lr=1e-2, min_lr=1e-3, warmup_steps=30, cosine_steps=STEPS, clip=1.0)
losses = train_steps(model, optimizer, get_batch, 0, STEPS, hp)
print(f"mean training loss of the last 20 steps: {np.mean(losses[-20:]):.4f}")
''',
}
