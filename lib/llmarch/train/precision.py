"""Mixed precision and activation memory: a dynamic loss scaler for fp16, activation checkpointing per
block, and the memory budget of a training run (parameters, gradients, optimiser states, activations).

Book: Training at scale, "Where the memory goes", "Mixed precision" and "Activation checkpointing".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["LossScaler", "checkpoint_blocks", "saved_tensor_bytes", "MemoryBudget", "memory_budget", "model_state_bytes"]


class LossScaler:
    """Dynamic loss scaling for fp16 (Micikevicius et al., 2018): the loss is multiplied by ``scale`` before
    the backward pass so that small gradients do not underflow fp16's smallest normal number
    ``2^-14 ~ 6.1e-5``; the gradients are divided by it before the step.

    Book: Training at scale, "Mixed precision".

    The state machine (the same as ``torch.amp.GradScaler``): a step whose gradients hold ``inf`` or ``nan``
    is skipped and ``scale <- scale * backoff_factor``; after ``growth_interval`` finite steps in a row,
    ``scale <- scale * growth_factor``. Use: ``scaler.scale(loss).backward(); scaler.unscale_(opt)``
    (optional, before clipping); ``scaler.step(opt); scaler.update()``: every step completes this cycle,
    the skipped ones too (``unscale_`` twice without ``update`` raises, as torch's does). Under
    ``torch.distributed`` the overflow flag is all-reduced, so every rank skips the same steps (FSDP's and
    ZeRO-1's shards overflow separately; a loss that is not finite on one rank counts on all).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                             f"growth_interval >= 1; got {init_scale}, {growth_factor}, {backoff_factor}, "
                             f"{growth_interval}")
        self.scale_value = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.growth_tracker = 0
        self._found_inf: bool | None = None  # None: gradients not unscaled yet in this step

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (in float32, whatever the loss dtype)."""
        return loss.float() * self.scale_value

    def unscale_(self, optimizer: torch.optim.Optimizer, found_inf: bool = False) -> None:
        """Divide every gradient by ``scale`` in place and record whether any is not finite. ``found_inf``
        adds the caller's own overflow (e.g. a loss that is not finite): under ``torch.distributed`` the flag
        is all-reduced (max) with the gradients', so an overflow on one rank is one on every rank."""
        if self._found_inf is not None:
            raise RuntimeError("unscale_() was already called since the last update()")
        inverse = 1.0 / self.scale_value
        params = [p for group in optimizer.param_groups for p in group["params"]]
        found = torch.tensor(float(found_inf), device=params[0].device if params else None)  # the grads' device
        for grad in [p.grad for p in params if p.grad is not None]:
            found = torch.maximum(found, (~torch.isfinite(grad)).any().float())
            grad.mul_(inverse)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        self._found_inf = bool(found.item())

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer.step()`` unless the gradients overflowed; returns whether the step was taken."""
        if self._found_inf is None:
            self.unscale_(optimizer)
        if self._found_inf:
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps."""
        if self._found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) first")
        if self._found_inf:
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.growth_tracker = 0
        self._found_inf = None

    def state_dict(self) -> dict:
        return {"scale": self.scale_value, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        self.scale_value, self.growth_tracker = float(state["scale"]), int(state["growth_tracker"])


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """Activation checkpointing per Transformer block: each module of ``model.blocks`` keeps only its input
    during the forward pass and recomputes its activations in the backward (one extra forward per block).
    Gradients are unchanged; parameter names and state dicts too. Returns ``model``.

    Book: Training at scale, "Activation checkpointing".
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no ModuleList `blocks` to checkpoint")
    for block in blocks:
        if not getattr(block, "_checkpointed", False):
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
            block._checkpointed = True
    return model


def saved_tensor_bytes(fn, *args, exclude: tuple = ()) -> tuple[object, int]:
    """Run ``fn(*args)`` and count the bytes of the tensors autograd saves for the backward pass, each
    storage once (a tensor saved by two operations, or its views, counts once) and leaving out the
    storages of ``exclude`` (the parameters, which are not activations). Returns ``(output, bytes)``.

    Book: Training at scale, "Where the memory goes".
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = fn(*args)
    return output, sum(seen.values())


@dataclass
class MemoryBudget:
    """Bytes per rank: ``params``, ``grads``, ``optimizer`` (states, and fp32 master weights in mixed
    precision), ``activations`` (saved for the backward), ``activations_per_layer``; ``total`` sums the
    first four."""

    params: int
    grads: int
    optimizer: int
    activations: int
    activations_per_layer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations


_ZERO_STAGE = {"none": 0, "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}


def model_state_bytes(n_params: int, world_size: int = 1, stage: int = 0, weight_bytes: int = 2,
                      grad_bytes: int = 2, state_bytes: int = 12) -> tuple[float, float, float]:
    """Bytes per rank of the weights, gradients and optimiser states of ``n_params`` parameters under ZeRO
    ``stage`` over ``world_size`` ranks (Rajbhandari et al., 2020, §5): stage 0 (DDP) divides nothing, 1 the
    optimiser states, 2 also the gradients, 3 also the weights. Defaults: mixed-precision Adam, ``2 + 2 + 12``
    bytes (``K = 12``: fp32 master weights, m and v).

    Book: Training at scale, "Data parallelism, ZeRO and FSDP".

    >>> [sum(model_state_bytes(7.5e9, 64, stage)) / 1e9 for stage in (0, 3)]
    [120.0, 1.875]
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    weights = weight_bytes * n_params / (world_size if stage >= 3 else 1)
    grads = grad_bytes * n_params / (world_size if stage >= 2 else 1)
    states = state_bytes * n_params / (world_size if stage >= 1 else 1)
    return weights, grads, states


def memory_budget(config, batch: int, seq: int, precision: str = "fp32", parallelism: str = "none",
                  world_size: int = 1, checkpointing: bool = False, mask_bytes: int = 1) -> MemoryBudget:
    """Training memory of a GPT (``config``: a ``GPTConfig`` with the MLP feed-forward) per rank, in bytes.

    Book: Training at scale, "Where the memory goes".

    Model states, Rajbhandari et al. (2020, §3.1) with ``P`` parameters and Adam: fp32 training holds
    ``4P`` (weights) + ``4P`` (gradients) + ``8P`` (m, v); mixed precision (``bf16``/``fp16``) holds
    ``2P + 2P + 12P`` (16-bit weights and gradients; fp32 master weights, m, v), 16 bytes per parameter
    either way. ``parallelism`` over ``world_size`` ranks: ``none``/``ddp`` divide nothing, ``zero1``
    divides the optimiser states, ``zero2`` also the gradients, ``zero3``/``fsdp`` everything.

    Activations, Korthikanti et al. (2022, §4.1) generalised to ``d_ff`` and to dropout off: per layer, with
    ``s = seq``, ``b = batch``, ``h = d_model``, ``a = n_heads``, ``f = d_ff`` and ``e`` bytes per element (2 in
    mixed precision, 4 in fp32), the saved tensors are the two norms' inputs ``2e sbh``, the QKV input
    ``e sbh``, Q and K ``2e sbh``, V ``e sbh``, the softmax output ``e as^2b``, the output projection's input
    ``e sbh``, the FFN input ``e sbh``, the GELU input and output ``2e sbf``; with dropout, also its masks
    (``mask_bytes`` each: ``as^2b + 2sbh``) and the dropped-out attention weights ``e as^2b``. With
    ``e = 2``, ``f = 4h`` and dropout this is the paper's ``sbh (34 + 5as/h)``. Checkpointing keeps one
    block input ``e sbh`` per layer plus one layer's activations during its recomputation. Small terms are
    left out (the norms' mean and 1/std per position, the causal mask, embeddings and the output layer).
    ``mask_bytes``: 1 for boolean dropout masks (CUDA's fused dropout); torch's CPU dropout keeps its mask
    in the activation dtype, so pass ``e`` there.
    """
    from llmarch.model import GPT, count_parameters  # lazy: the model is only needed for its count

    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be 'fp32', 'bf16' or 'fp16', got {precision!r}")
    if parallelism not in _ZERO_STAGE:
        raise ValueError(f"parallelism must be one of {tuple(_ZERO_STAGE)}, got {parallelism!r}")
    if getattr(config, "ffn", "mlp") != "mlp":
        raise ValueError(f"memory_budget counts the MLP feed-forward only, got ffn={config.ffn!r}")
    if world_size < 1 or batch < 1 or seq < 1:
        raise ValueError(f"need batch, seq, world_size >= 1, got {batch}, {seq}, {world_size}")
    with torch.device("meta"):
        n_params = count_parameters(GPT(config))
    mixed = precision != "fp32"
    per_param = (2, 2, 12) if mixed else (4, 4, 8)
    weights, grads, states = model_state_bytes(n_params, world_size, _ZERO_STAGE[parallelism], *per_param)
    e = 2 if mixed else 4
    s, b, h, a, f = seq, batch, config.d_model, config.n_heads, config.ffn_hidden
    per_layer = e * (8 * s * b * h + a * s * s * b + 2 * s * b * f)
    if config.dropout > 0:
        per_layer += mask_bytes * (a * s * s * b + 2 * s * b * h) + e * a * s * s * b
    activations = config.n_layers * (e * s * b * h) + per_layer if checkpointing else config.n_layers * per_layer
    return MemoryBudget(
        params=int(weights),
        grads=int(grads),
        optimizer=int(states),
        activations=activations,
        activations_per_layer=per_layer,
    )
