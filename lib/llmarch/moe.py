"""A sparse mixture-of-experts feed-forward layer (Shazeer et al., 2017; Mixtral, Jiang et al., 2024).

Book: From GPT-2 to Llama 3, "After Llama 3" (mixture of experts).

Each token is sent to ``top_k`` of ``n_experts`` SwiGLU feed-forward networks. A linear router scores the
experts, ``p = softmax(W_r x)``; the ``top_k`` largest probabilities are renormalised to sum to one, and the
output is their weighted sum of the chosen experts' outputs,

    ``MoE(x) = sum_{e in TopK(p)} (p_e / sum_{e' in TopK(p)} p_e') * FFN_e(x)``,

which is Mixtral's rule (taking the softmax over the ``top_k`` router logits gives the same weights). Exact
ties in the router's scores are broken by ``torch.topk``, in no guaranteed order. Shapes: ``x (..., d_model) -> (...,
d_model)``. The parameters grow with ``n_experts``, the compute per token with ``top_k`` only:
:func:`moe_parameter_counts` gives both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmarch._checks import check_tensor, shape_str
from llmarch.layers import SwiGLU

__all__ = ["MoEFeedForward", "moe_parameter_counts"]


class MoEFeedForward(nn.Module):
    """Top-k routed mixture of SwiGLU experts, as in a Mixtral layer (see the module docstring).

    Book: From GPT-2 to Llama 3, "After Llama 3".

    Submodules: ``router`` (``Linear(d_model, n_experts)``, no bias) and ``experts`` (``n_experts``
    :class:`llmarch.layers.SwiGLU` of hidden size ``d_ff``). ``forward`` returns ``(..., d_model)``;
    ``route`` returns the chosen experts and their weights, ``(N, top_k)`` each, for ``N`` tokens.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2, activation: str = "silu"):
        super().__init__()
        if n_experts < 1 or not 1 <= top_k <= n_experts:
            raise ValueError(f"need 1 <= top_k <= n_experts, got top_k={top_k}, n_experts={n_experts}")
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff, activation=activation) for _ in range(n_experts))

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens (N, d_model)`` -> ``(experts, weights)``, each ``(N, top_k)``: the indices of the chosen
        experts and their renormalised router probabilities (computed in float32 at least)."""
        logits = self.router(tokens)
        probs = F.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        top, experts = probs.topk(self.top_k, dim=-1)
        return experts, (top / top.sum(dim=-1, keepdim=True)).to(tokens.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, min_dim=1, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {shape_str(x.shape)} but the layer expects d_model={self.d_model} "
                             "features in the last dimension")
        tokens = x.reshape(-1, self.d_model)
        experts, weights = self.route(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(experts == e)  # the tokens that chose expert e, and in which slot
            if len(token_idx):
                out.index_add_(0, token_idx, weights[token_idx, slot, None] * expert(tokens[token_idx]))
        return out.reshape(x.shape)


def moe_parameter_counts(d_model: int, d_ff: int, n_experts: int, top_k: int) -> dict[str, int]:
    """Parameters of one :class:`MoEFeedForward` layer: ``total`` (stored: router ``d_model * n_experts``
    plus ``n_experts`` SwiGLUs of ``3 d_model d_ff``) and ``active`` (used by one token: the router and
    ``top_k`` experts). Forward FLOPs per token are about ``2 * active``.

    Book: From GPT-2 to Llama 3, "After Llama 3".

    >>> moe_parameter_counts(4096, 14336, 8, 2)  # one Mixtral 8x7B layer
    {'total': 1409318912, 'active': 352354304}
    """
    for name, value in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts), ("top_k", top_k)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} exceeds n_experts={n_experts}")
    expert, router = 3 * d_model * d_ff, d_model * n_experts
    return {"total": router + n_experts * expert, "active": router + top_k * expert}
