"""Sparse mixture-of-experts feed-forward layers (Shazeer et al., 2017; Switch, Fedus et al., 2021; Mixtral,
Jiang et al., 2024; DeepSeek-V3, 2024), their routers, balancing terms and expert capacity.

Book: From GPT-2 to Llama 3, "After Llama 3" (mixture of experts).

Each token is sent to ``top_k`` of ``n_experts`` SwiGLU feed-forward networks, and the output is the weighted
sum of the chosen experts' outputs, ``MoE(x) = sum_{e in TopK} g_e(x) FFN_e(x)`` (plus, in DeepSeek's layers,
``n_shared_experts`` that every token passes through). Two routers (:class:`MoEConfig` ``router``):

- ``softmax_topk`` (Mixtral): ``p = softmax(W_r x)`` (in float32 at least, as transformers' Mixtral does), the
  ``top_k`` largest, renormalised to sum to one: ``g_e = p_e / sum_{e' in TopK(p)} p_e'``;
- ``sigmoid_bias`` (DeepSeek-V3): ``s = sigmoid(W_r x)`` (router in float32 at least); the experts are chosen by
  ``s + b`` where ``b`` is a per-expert bias used for the choice only (optionally only within the ``topk_group``
  best of ``n_group`` groups, a group scored by the sum of its two best ``s + b``); ``g_e = s_e / sum_TopK s``
  times ``routed_scaling_factor``. The bias is not trained by gradients: after each step,
  :func:`update_expert_bias` moves it towards balance (Wang et al., 2024, auxiliary-loss-free balancing).

Balancing terms (each layer keeps those of its last forward in ``layer.aux``; ``moe_aux_loss(model)`` sums
them with their coefficients): Switch's :func:`load_balancing_loss` ``E * sum_e f_e P_e`` and the router z-loss
(``llmarch.stability.z_loss`` of the router logits, ST-MoE). Expert capacity (Switch, GShard):
``capacity = ceil(capacity_factor * N * top_k / E)`` assignments per expert; the ones past it are dropped
(:func:`capacity_keep`), and the token keeps only its residual for that expert.

Exact ties in the router's scores are broken by ``torch.topk``, in no guaranteed order. Shapes: ``x (...,
d_model) -> (..., d_model)``. The parameters grow with ``n_experts``, the compute per token with ``top_k`` only:
:func:`moe_parameter_counts` gives both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.layers import SwiGLU
from llmarch.stability import z_loss

__all__ = ["ROUTERS", "MoEConfig", "MoEFeedForward", "route", "load_balancing_loss", "expert_load",
           "update_expert_bias", "expert_capacity", "capacity_keep", "moe_aux_loss", "update_expert_biases",
           "moe_parameter_counts"]

ROUTERS = ("softmax_topk", "sigmoid_bias")


@dataclass
class MoEConfig:
    """The mixture-of-experts feed-forward of a :class:`llmarch.model.GPTConfig` (``GPTConfig(moe=...)``).

    - ``n_experts``, ``top_k``: routed experts and how many each token uses; ``d_expert``: each expert's hidden
      size (``None``: the model's ``d_ff``); ``n_shared_experts``: DeepSeek's always-on experts, one SwiGLU of
      hidden size ``n_shared_experts * d_expert``.
    - ``router``: ``softmax_topk`` (Mixtral) or ``sigmoid_bias`` (DeepSeek-V3), see the module docstring;
      ``n_group``/``topk_group``: DeepSeek's group-limited choice; ``norm_topk_prob``: renormalise the chosen
      gates to sum to one; ``routed_scaling_factor`` multiplies them.
    - ``balance_coef`` (Switch's alpha; Mixtral trains with 0.02 as ``router_aux_loss_coef``) and ``z_coef``
      (ST-MoE: 1e-3): the weights of :func:`load_balancing_loss` and the router z-loss in ``moe_aux_loss``.
    - ``bias_update_rate``: DeepSeek's gamma in :func:`update_expert_bias` (``sigmoid_bias`` only).
    - ``capacity_factor``: ``None`` (no token is dropped) or the factor of :func:`expert_capacity`. The capacity
      counts the tokens of one forward, so cached decoding (one token a step) drops none: it equals a full
      forward only without dropping.
    - ``first_dense_layers``: the first layers keep a dense FFN (DeepSeek's ``first_k_dense_replace``).
    """

    n_experts: int
    top_k: int = 2
    d_expert: int | None = None
    n_shared_experts: int = 0
    router: str = "softmax_topk"
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    balance_coef: float = 0.01
    z_coef: float = 0.001
    bias_update_rate: float = 0.001
    capacity_factor: float | None = None
    first_dense_layers: int = 0

    def __post_init__(self):
        for name in ("n_experts", "top_k", "n_shared_experts", "n_group", "topk_group", "first_dense_layers"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise TypeError(f"MoEConfig.{name} must be an int, got {getattr(self, name)!r}")
        if self.d_expert is not None and (not isinstance(self.d_expert, int) or self.d_expert < 1):
            raise ValueError(f"MoEConfig.d_expert must be None or a positive int, got {self.d_expert!r}")
        for name in ("balance_coef", "z_coef", "bias_update_rate"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"MoEConfig.{name} must be >= 0 (a weight or a step size), got {getattr(self, name)}")
        if self.router not in ROUTERS:
            raise ValueError(f"MoEConfig.router must be one of {ROUTERS}, got {self.router!r}")
        if self.n_experts < 1 or not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"need 1 <= top_k <= n_experts, got top_k={self.top_k}, n_experts={self.n_experts}")
        if self.n_group < 1 or self.n_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"MoEConfig: n_experts={self.n_experts} must split into n_group={self.n_group} groups "
                             f"and 1 <= topk_group={self.topk_group} <= n_group")
        if self.n_group > 1 and self.n_experts // self.n_group < 2:
            raise ValueError("MoEConfig: a group is scored by its two best experts, so it needs at least 2")
        if self.n_group > 1 and self.router != "sigmoid_bias":
            raise ValueError("MoEConfig: group-limited routing (n_group > 1) is DeepSeek's: router='sigmoid_bias'")
        if self.n_shared_experts < 0 or self.first_dense_layers < 0:
            raise ValueError("MoEConfig: n_shared_experts and first_dense_layers must be >= 0")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"MoEConfig.capacity_factor must be None or positive, got {self.capacity_factor}")

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_dense_layers


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def route(logits: torch.Tensor, config: MoEConfig, bias: torch.Tensor | None = None):
    """Router logits ``(N, E)`` -> ``(experts, gates, probs)``: the chosen experts and their gates ``(N, top_k)``,
    and the router's distribution over all experts ``(N, E)`` (softmax, or the sigmoid scores normalised per
    token), which :func:`load_balancing_loss` takes. ``bias (E,)``: the selection bias of ``sigmoid_bias``."""
    logits = logits.to(_compute_dtype(logits))
    if config.router == "softmax_topk":
        probs = torch.softmax(logits, dim=-1)
        gates, experts = probs.topk(config.top_k, dim=-1)
        if config.norm_topk_prob:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return experts, gates * config.routed_scaling_factor, probs
    scores = torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias.to(scores.dtype)
    if config.n_group > 1:  # keep the topk_group groups whose two best experts score highest
        grouped = choice.view(-1, config.n_group, config.n_experts // config.n_group)
        best_groups = grouped.topk(2, dim=-1).values.sum(-1).topk(config.topk_group, dim=-1).indices
        allowed = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best_groups, True)
        choice = choice.masked_fill(~allowed.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
    experts = choice.topk(config.top_k, dim=-1).indices
    gates = scores.gather(1, experts)
    if config.norm_topk_prob:
        gates = gates / (gates.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, gates * config.routed_scaling_factor, scores / scores.sum(dim=-1, keepdim=True)


def expert_load(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """How many routing assignments each expert received: ``experts (N, k)`` long -> ``(n_experts,)`` float."""
    return torch.bincount(experts.reshape(-1), minlength=n_experts).to(torch.float32)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's auxiliary loss (Fedus et al., 2021, eq. 4), ``E * sum_e f_e P_e``: ``f_e`` is the
    fraction of the ``N * k`` routing assignments sent to expert ``e`` and ``P_e`` the mean router probability
    of ``e`` over the ``N`` tokens. ``probs (N, E)``, ``experts (N, k)`` -> ``()``. It is 1 for a perfectly
    balanced router and ``E`` when every token sends everything to one expert; only ``P`` carries a gradient.
    (transformers' Mixtral counts ``f`` per token, so that its value is ``k`` times this one.)"""
    check_tensor("probs", probs, dims=2, floating=True)
    check_tensor("experts", experts, dims=2)
    if experts.shape[0] != probs.shape[0]:
        raise ValueError(f"probs {shape_str(probs.shape)} and experts {shape_str(experts.shape)} need the same N")
    n_experts = probs.shape[-1]
    fraction = expert_load(experts, n_experts).to(probs) / experts.numel()
    return n_experts * (fraction * probs.mean(dim=0)).sum()


@torch.no_grad()
def update_expert_bias(bias: torch.Tensor, load: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek's auxiliary-loss-free balancing (Wang et al., 2024): ``b_e += rate * sign(mean(load) - load_e)``,
    in place (an overloaded expert becomes less likely to be chosen, an idle one more). ``bias``, ``load``:
    ``(E,)``. Returns ``bias``."""
    if bias.shape != load.shape or bias.dim() != 1:
        raise ValueError(f"bias {shape_str(bias.shape)} and load {shape_str(load.shape)} must both be (E,)")
    load = load.to(bias)
    return bias.add_(rate * torch.sign(load.mean() - load))


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Assignments an expert may take (Switch, GShard): ``ceil(capacity_factor * n_tokens * top_k / n_experts)``.

    >>> expert_capacity(n_tokens=1024, n_experts=8, top_k=2, capacity_factor=1.25)
    320
    """
    if min(n_tokens, n_experts, top_k) < 0 or not capacity_factor > 0:
        raise ValueError("expert_capacity needs non-negative sizes and a positive capacity_factor")
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


def capacity_keep(experts: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """Which assignments ``experts (N, k)`` an expert of ``capacity`` keeps: boolean ``(N, k)``. Queues fill as in
    GShard: every token's first choice (in token order) before any second choice, and so on."""
    check_tensor("experts", experts, dims=2)
    by_slot = experts.t().reshape(-1)  # (k * N,): slot-major, then token order
    queue = F.one_hot(by_slot, n_experts).cumsum(dim=0).gather(1, by_slot[:, None])[:, 0] - 1
    return (queue < capacity).reshape(experts.shape[1], experts.shape[0]).t()


class MoEFeedForward(nn.Module):
    """A routed mixture of SwiGLU experts with optional shared experts: a Mixtral or DeepSeek-V3 FFN layer.

    Book: From GPT-2 to Llama 3, "After Llama 3".

    ``MoEFeedForward(d_model, d_ff, n_experts, top_k)`` is Mixtral's layer; ``config`` (:class:`MoEConfig`)
    chooses everything else (its ``d_expert`` wins over ``d_ff``). Submodules: ``router``
    (``Linear(d_model, n_experts)``, no bias), ``experts`` (:class:`llmarch.layers.SwiGLU` each), ``shared``
    (one SwiGLU, or None); buffer ``expert_bias (E,)`` (``sigmoid_bias``). After each forward ``aux`` holds the
    layer's ``balance`` (:func:`load_balancing_loss`) and ``z`` (router z-loss) terms, with gradients, and its
    ``load (E,)`` and ``dropped`` (fraction of assignments past the capacity). ``route`` returns the chosen
    experts and their gates, ``(N, top_k)`` each, for ``N`` tokens ``(N, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, n_experts: int | None = None, top_k: int = 2,
                 activation: str = "silu", config: MoEConfig | None = None):
        super().__init__()
        config = MoEConfig(n_experts, top_k, d_ff) if config is None else config
        d_expert = config.d_expert or d_ff
        if d_expert is None:
            raise ValueError("MoEFeedForward needs d_ff or config.d_expert")
        self.d_model, self.config = d_model, config
        self.n_experts, self.top_k = config.n_experts, config.top_k
        self.router = nn.Linear(d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_expert, activation=activation) for _ in range(config.n_experts))
        self.shared = (SwiGLU(d_model, config.n_shared_experts * d_expert, activation=activation)
                       if config.n_shared_experts else None)
        if config.router == "sigmoid_bias":
            self.register_buffer("expert_bias", torch.zeros(config.n_experts))
        else:
            self.expert_bias = None
        self.aux: dict[str, torch.Tensor] = {}

    def router_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(N, d_model) -> (N, E)``. DeepSeek's router runs in float32 at least (input and weight cast), as
        transformers' does; Mixtral's in the input's dtype (its softmax in float32 at least, in :func:`route`)."""
        if self.config.router == "sigmoid_bias":
            dtype = _compute_dtype(tokens)
            return F.linear(tokens.to(dtype), self.router.weight.to(dtype))
        return self.router(tokens)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens (N, d_model)`` -> ``(experts, gates)``, each ``(N, top_k)``; gates in the tokens' dtype."""
        experts, gates, _ = route(self.router_logits(tokens), self.config, self.expert_bias)
        return experts, gates.to(tokens.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, min_dim=1, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {shape_str(x.shape)} but the layer expects d_model={self.d_model} "
                             "features in the last dimension")
        tokens = x.reshape(-1, self.d_model)
        logits = self.router_logits(tokens)
        experts, gates, probs = route(logits, self.config, self.expert_bias)
        keep = torch.ones_like(experts, dtype=torch.bool)
        if self.config.capacity_factor is not None:
            capacity = expert_capacity(len(tokens), self.n_experts, self.top_k, self.config.capacity_factor)
            keep = capacity_keep(experts, self.n_experts, capacity)
        self.aux = {"balance": load_balancing_loss(probs, experts), "z": z_loss(logits),
                    "load": expert_load(experts, self.n_experts).detach(),
                    "dropped": 1.0 - keep.float().mean().detach()}
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where((experts == e) & keep)  # the tokens that chose expert e, and in which slot
            if len(token_idx):
                expert_out = expert(tokens[token_idx]) * gates[token_idx, slot, None]
                out.index_add_(0, token_idx, expert_out.to(tokens.dtype))
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.reshape(x.shape)

    def update_bias(self) -> None:
        """:func:`update_expert_bias` with the load of the last forward (``sigmoid_bias`` routers; call after
        each optimiser step)."""
        if self.expert_bias is None:
            raise ValueError("update_bias needs router='sigmoid_bias': a softmax router has no selection bias")
        if "load" not in self.aux:
            raise ValueError("update_bias needs the load of a forward pass: run the layer first")
        update_expert_bias(self.expert_bias, self.aux["load"], self.config.bias_update_rate)


def moe_aux_loss(model: nn.Module) -> torch.Tensor:
    """``sum over MoE layers of balance_coef * balance + z_coef * z`` from each layer's last forward (0 without
    MoE layers): the term a training loop adds to the language-modelling loss."""
    total = torch.zeros(())
    for layer in model.modules():
        if isinstance(layer, MoEFeedForward) and layer.aux:
            c = layer.config
            term = c.balance_coef * layer.aux["balance"] + c.z_coef * layer.aux["z"]
            total = term + total.to(term)
    return total


def update_expert_biases(model: nn.Module) -> None:
    """:meth:`MoEFeedForward.update_bias` for every ``sigmoid_bias`` layer of ``model``: DeepSeek's balancing
    step, which a training loop calls after each optimiser step."""
    for layer in model.modules():
        if isinstance(layer, MoEFeedForward) and layer.expert_bias is not None:
            layer.update_bias()


def moe_parameter_counts(d_model: int, d_ff: int, n_experts: int, top_k: int,
                         n_shared_experts: int = 0) -> dict[str, int]:
    """Parameters of one :class:`MoEFeedForward` layer: ``total`` (stored: router ``d_model * n_experts``
    plus ``n_experts + n_shared_experts`` SwiGLUs of ``3 d_model d_ff``) and ``active`` (used by one token: the
    router, ``top_k`` routed and the shared experts). Forward FLOPs per token are about ``2 * active``.

    Book: From GPT-2 to Llama 3, "After Llama 3".

    >>> moe_parameter_counts(4096, 14336, 8, 2)  # one Mixtral 8x7B layer
    {'total': 1409318912, 'active': 352354304}
    """
    for name, value in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts), ("top_k", top_k)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} exceeds n_experts={n_experts}")
    if n_shared_experts < 0:
        raise ValueError(f"n_shared_experts must be >= 0, got {n_shared_experts}")
    expert, router = 3 * d_model * d_ff, d_model * n_experts
    return {"total": router + (n_experts + n_shared_experts) * expert,
            "active": router + (top_k + n_shared_experts) * expert}
