"""Fully sharded data parallelism (ZeRO stage 3, FSDP): every matrix is split across the ranks; a layer's
full weight exists only while that layer runs forward or backward.

Book: Training at scale, "Data parallelism, ZeRO and FSDP".
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from llmarch.parallel.ddp import broadcast_module, require_process_group

__all__ = ["FSDP"]


class _ShardedWeight:
    """One sharded matrix: the fp32 master shard (a Parameter of ``numel / N`` elements, zero padded), the
    flat buffer into which the full weight is all-gathered in the compute dtype, and the dtype in which its
    gradient is reduce-scattered."""

    def __init__(self, weight: nn.Parameter, rank: int, world_size: int, compute_dtype: torch.dtype,
                 reduce_dtype: torch.dtype):
        self.shape = weight.shape
        self.numel = weight.numel()
        per_rank = math.ceil(self.numel / world_size)
        flat = F.pad(weight.detach().reshape(-1), (0, per_rank * world_size - self.numel))
        self.shard = nn.Parameter(flat[rank * per_rank:(rank + 1) * per_rank].clone(),
                                  requires_grad=weight.requires_grad)
        self.world_size, self.compute_dtype, self.reduce_dtype = world_size, compute_dtype, reduce_dtype
        self.full = torch.empty(per_rank * world_size, dtype=compute_dtype, device=weight.device)
        self.free()

    def gather(self) -> None:
        """All-gather the shards into ``full`` (allocating its storage)."""
        storage = self.full.untyped_storage()
        if storage.size() == 0:
            storage.resize_(self.full.numel() * self.full.element_size())
        # through .data: the views autograd saved share full's version counter, and refilling the same
        # storage with the same values must not count as an in-place change
        dist.all_gather_single(self.full.data, self.shard.detach().to(self.compute_dtype))

    def free(self) -> None:
        """Release the full weight's memory; tensors viewing it (saved for the backward) stay valid
        objects and see the data again after the next :meth:`gather`."""
        self.full.untyped_storage().resize_(0)

    def gathered_bytes(self) -> int:
        return self.full.untyped_storage().nbytes()


class _GatheredWeight(torch.autograd.Function):
    """Forward: the full weight ``(out, in)`` as a view of the gathered buffer. Backward: the gradient is
    reduce-scattered in the reduce dtype (summed over ranks, each keeping its shard), divided by the world
    size, returned to the fp32 shard, and the gathered buffer is freed."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, sharded: _ShardedWeight) -> torch.Tensor:
        ctx.sharded = sharded
        return sharded.full[:sharded.numel].view(sharded.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sharded = ctx.sharded
        flat = F.pad(grad.reshape(-1).to(sharded.reduce_dtype), (0, sharded.full.numel() - sharded.numel))
        shard_grad = torch.empty_like(sharded.shard, dtype=sharded.reduce_dtype)
        dist.reduce_scatter_single(shard_grad, flat)
        sharded.free()
        return shard_grad.to(sharded.shard.dtype).div_(sharded.world_size), None


class FSDP(nn.Module):
    """Wrap ``module`` for fully sharded data parallelism over the default process group.

    Book: Training at scale, "Data parallelism, ZeRO and FSDP".

    Every submodule that owns a 2-D parameter ``weight`` (Linear, Embedding, whatever its class) has it
    replaced by ``weight_shard``: ``1/N`` of the flattened matrix, in float32 (the master copy the
    optimiser updates). Before the submodule's forward the shards are all-gathered (in ``compute_dtype``
    when given, so half the bytes travel), and the full matrix is freed right after; a hook on the
    submodule's output gathers it again for the backward, whose weight gradient is reduce-scattered to the
    shards and the matrix freed again. A weight shared by two submodules (tied embeddings) is sharded once.
    Other parameters (biases, norms) are replicated and their gradients all-reduced in
    :meth:`finish_gradient_synchronization`. With ``compute_dtype`` the forward runs under autocast.
    ``reduce_dtype`` is the dtype of the weight gradients' reduce-scatter: by default the compute dtype
    (half the bytes in bf16/fp16), ``torch.float32`` to sum them without 16-bit rounding (torch's
    ``MixedPrecisionPolicy(reduce_dtype=...)``). ``.module`` is the wrapped model;
    :meth:`gather_full_params` returns its full fp32 state. A checkpoint of an FSDP run is one file per
    rank: ``.module.state_dict()`` holds this rank's ``weight_shard`` entries, the optimiser its state.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None):
        super().__init__()
        self.rank, self.world_size = require_process_group()
        for name, dtype in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"{name} must be None, float32, bfloat16 or float16, got {dtype}")
        broadcast_module(module)
        self.module, self.compute_dtype = module, compute_dtype
        self.state_names = list(module.state_dict())  # tied weights under each name, persistent buffers
        self.sharded: dict[str, _ShardedWeight] = {}  # module path -> its sharded weight
        by_param: dict[int, _ShardedWeight] = {}
        for path, sub in module.named_modules():
            weight = sub._parameters.get("weight")
            if weight is None or weight.dim() != 2:
                continue
            if id(weight) not in by_param:
                by_param[id(weight)] = _ShardedWeight(weight, self.rank, self.world_size,
                                                      compute_dtype or weight.dtype,
                                                      reduce_dtype or compute_dtype or weight.dtype)
            sharded = self.sharded[path] = by_param[id(weight)]
            del sub._parameters["weight"]
            sub.register_parameter("weight_shard", sharded.shard)
            sub.register_forward_pre_hook(lambda m, args, s=sharded: self._before_forward(m, s))
            sub.register_forward_hook(lambda m, args, out, s=sharded: self._after_forward(m, s, out))
        self.replicated = [p for p in module.parameters()
                           if p.requires_grad and all(p is not s.shard for s in by_param.values())]

    @staticmethod
    def _before_forward(sub: nn.Module, sharded: _ShardedWeight) -> None:
        sharded.gather()
        sub.weight = _GatheredWeight.apply(sharded.shard, sharded)

    @staticmethod
    def _after_forward(sub: nn.Module, sharded: _ShardedWeight, output) -> None:
        del sub.weight
        sharded.free()
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: sharded.gather())

    def forward(self, *args, **kwargs):
        device = next(self.module.parameters()).device.type
        low = self.compute_dtype not in (None, torch.float32)
        with torch.autocast(device, dtype=self.compute_dtype) if low else nullcontext():
            return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients (the shards' were reduce-scattered in the backward)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world_size)
        dist.all_reduce(flat)
        offset = 0
        for p in self.replicated:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global-norm clipping over sharded and replicated gradients: the shards' squared norms are summed
        over ranks (padding holds zeros), the replicated ones counted once. Returns the norm before clipping;
        a norm that is not finite is applied as :func:`llmarch.train.clip_grad_norm` (torch's rule) does."""
        shards = {id(s.shard): s.shard for s in self.sharded.values()}.values()
        zero = torch.zeros((), device=next(self.module.parameters()).device)
        sharded_sq = sum((s.grad.float().pow(2).sum() for s in shards if s.grad is not None), zero)
        dist.all_reduce(sharded_sq)
        replicated_sq = sum((p.grad.float().pow(2).sum() for p in self.replicated if p.grad is not None), zero)
        total = (sharded_sq + replicated_sq).sqrt()
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in [*shards, *self.replicated]:
            if p.grad is not None:
                p.grad.mul_(coefficient.to(p.grad.dtype))
        return total

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """The wrapped model's full state dict as it was before sharding (the same keys: tied weights under
        each name, persistent buffers), the matrices gathered in float32, identical on every rank:
        ``unsharded.load_state_dict(fsdp.gather_full_params())`` or a checkpoint."""
        gathered: dict[int, torch.Tensor] = {}
        for sharded in self.sharded.values():
            if id(sharded) not in gathered:
                full = sharded.shard.new_empty(sharded.shard.numel() * self.world_size)  # on the shard's device
                dist.all_gather_single(full, sharded.shard.detach())
                gathered[id(sharded)] = full[:sharded.numel].view(sharded.shape).clone()
        result = {}
        for name in self.state_names:
            path, _, leaf = name.rpartition(".")
            if leaf == "weight" and path in self.sharded:
                result[name] = gathered[id(self.sharded[path])]
            else:
                owner = self.module.get_submodule(path)
                result[name] = getattr(owner, leaf).detach().clone()
        return result

    def rank_bytes(self) -> dict[str, int]:
        """Bytes of parameters this rank keeps between layers: ``shards`` (its fp32 pieces of the matrices),
        ``replicated`` (the other parameters) and ``gathered`` (full matrices currently allocated; 0
        outside a layer's forward and backward)."""
        unique = {id(s): s for s in self.sharded.values()}.values()
        return {
            "shards": sum(s.shard.numel() * s.shard.element_size() for s in unique),
            "replicated": sum(p.numel() * p.element_size() for p in self.replicated),
            "gathered": sum(s.gathered_bytes() for s in unique),
        }
