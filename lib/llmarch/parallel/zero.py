"""Optimiser-state sharding (ZeRO stage 1): every rank keeps the whole model and its gradients, but the
optimiser states of only ``1/N`` of the parameters. The gradients are reduce-scattered (each rank receives the
average of its ``1/N``), each rank updates its shard, and the parameters are all-gathered: the bytes of DDP's
all-reduce, split in its two halves.

Book: Training at scale, "Data parallelism, ZeRO and FSDP".
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from llmarch.parallel.ddp import require_process_group

__all__ = ["ShardedOptimizer"]


class _FlatGroup:
    """One parameter group flattened: ``params`` laid end to end (zero padded to ``N * shard_size``); this
    rank owns elements ``[rank * shard_size, (rank + 1) * shard_size)`` as ``shard``, an fp32 Parameter."""

    def __init__(self, params: list[torch.Tensor], rank: int, world_size: int):
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            raise ValueError("the parameters of a group must share one dtype and one device")
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.shard_size = math.ceil(self.numel / world_size)
        self.padding = self.shard_size * world_size - self.numel
        flat = self.flatten([p.detach() for p in params])
        self.shard = nn.Parameter(flat[rank * self.shard_size:(rank + 1) * self.shard_size].clone())

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return F.pad(torch.cat([t.reshape(-1) for t in tensors]), (0, self.padding))

    def unflatten_into(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 (Rajbhandari et al., 2020, §5.1) around any optimiser: each parameter group is flattened into
    one vector cut into ``N`` equal shards (the last zero padded); rank ``r`` keeps a copy of shard ``r`` (in
    the parameters' dtype) and the optimiser state of that shard only.

    Book: Training at scale, "Data parallelism, ZeRO and FSDP".

    ``ShardedOptimizer(params, optimizer_cls, **kwargs)`` builds ``optimizer_cls`` over the shards (e.g.
    :class:`llmarch.optim.AdamW`: elementwise, so updating a shard is updating its elements). Use it on the
    *unwrapped* model (no :class:`llmarch.parallel.DDP`: it would all-reduce the gradients a second time):
    at construction rank 0's values of the given parameters are broadcast (frozen parameters and buffers
    must agree already: same seed, or :func:`llmarch.parallel.ddp.broadcast_module`). One step, as :func:`llmarch.train.train_step` runs it:

    1. :meth:`finish_gradient_synchronization`, after the backward: each group's gradients are
       reduce-scattered (``(N-1)/N`` of the group's bytes per rank) and divided by ``N``: the shard's
       ``.grad`` is the average over ranks;
    2. :meth:`clip_grad_norm` (the squared norms of the shards, all-reduced) and a loss scaler see the
       shards: ``param_groups`` hold them, so schedules set ``lr`` there as usual;
    3. :meth:`step` updates the shard and all-gathers each group's shards into the model's parameters
       (``(N-1)/N`` of the bytes again).

    So ZeRO-1 moves the bytes of DDP's all-reduce (plus at most ``N - 1`` padding elements per group), with
    Adam states of ``8P/N`` bytes per rank instead of ``8P``. :meth:`state_dict` is this rank's shard of the
    optimiser state (a checkpoint holds one file per rank; it loads into the same world size only).
    """

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], **kwargs):
        self.rank, self.world_size = require_process_group()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.flat_groups: list[_FlatGroup] = []
        self.local_optimizer: torch.optim.Optimizer | None = None
        super().__init__(params, kwargs)

    @torch.no_grad()
    def add_param_group(self, param_group: dict) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        for p in params:
            dist.broadcast(p.data, src=0)
        flat_group = _FlatGroup(params, self.rank, self.world_size)
        self.flat_groups.append(flat_group)
        super().add_param_group({**param_group, "params": [flat_group.shard]})
        local = {**self.param_groups[-1], "params": [flat_group.shard]}
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local], **self.kwargs)
        else:
            self.local_optimizer.add_param_group(local)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Reduce-scatter each group's gradients (missing ones count as zeros) into the shards' ``.grad``."""
        for group in self.flat_groups:
            flat = group.flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in group.params])
            shard_grad = torch.empty_like(group.shard)
            dist.reduce_scatter_single(shard_grad, flat.to(group.shard.dtype))
            group.shard.grad = shard_grad.div_(self.world_size)

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global-norm clipping of the averaged gradients (:func:`llmarch.train.clip_grad_norm`'s rule): the
        shards' squared norms are summed over ranks (padding holds zeros). Returns the norm before clipping."""
        shards = [g.shard for g in self.flat_groups if g.shard.grad is not None]
        squares = sum((s.grad.float().pow(2).sum() for s in shards), torch.zeros((), device=self._device()))
        dist.all_reduce(squares)
        total = squares.sqrt()
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for s in shards:
            s.grad.mul_(coefficient.to(s.grad.dtype))
        return total

    @torch.no_grad()
    def step(self, closure=None):
        """Update this rank's shards, then all-gather every group's shards into the model's parameters."""
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            for key, value in group.items():
                if key != "params":
                    local_group[key] = value
        loss = self.local_optimizer.step(closure)
        for group in self.flat_groups:
            flat = torch.empty(group.shard_size * self.world_size, dtype=group.shard.dtype, device=self._device())
            dist.all_gather_single(flat, group.shard.detach())
            group.unflatten_into(flat)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients and the shards'."""
        super().zero_grad(set_to_none)
        for group in self.flat_groups:
            for p in group.params:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    def _device(self) -> torch.device:
        return self.flat_groups[0].shard.device

    def state_dict(self) -> dict:
        """This rank's shard of the optimiser state (``local``: ``optimizer_cls``'s state dict of the shards)
        with ``rank`` and ``world_size``: save it in one file per rank."""
        return {"rank": self.rank, "world_size": self.world_size, "local": self.local_optimizer.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict` of the same rank of the same world size, and copy the shards from the
        model's parameters: load the model's state first (:func:`llmarch.train.load_checkpoint` does)."""
        if (state_dict.get("rank"), state_dict.get("world_size")) != (self.rank, self.world_size):
            raise ValueError(f"this is rank {self.rank} of {self.world_size}, the state is rank "
                             f"{state_dict.get('rank')} of {state_dict.get('world_size')}: ZeRO-1 resumes on "
                             "the same number of ranks")
        self.local_optimizer.load_state_dict(state_dict["local"])
        for group in self.flat_groups:
            flat = group.flatten([p.detach() for p in group.params])
            group.shard.copy_(flat[self.rank * group.shard_size:(self.rank + 1) * group.shard_size])
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            group.update({k: v for k, v in local_group.items() if k != "params"})

    def local_state_bytes(self) -> int:
        """Bytes of optimiser state this rank holds."""
        return sum(t.numel() * t.element_size() for state in self.local_optimizer.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor))
