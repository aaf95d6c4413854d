"""Optimiser-state sharding (ZeRO stage 1): every rank keeps the whole model and its gradients, but the
optimiser states of only ``1/N`` of the parameters; after its step each rank broadcasts the parameters it
owns.

Book: Training at scale, "Data parallelism, ZeRO and FSDP".
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from llmarch.parallel.ddp import require_process_group

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 (Rajbhandari et al., 2020, §5.1): parameter ``p`` is owned by one rank, chosen greedily (each
    new parameter goes to the rank owning the fewest elements so far, so the shards are balanced); that
    rank alone keeps ``p``'s optimiser state and updates ``p``; then ``p`` is broadcast from its owner.

    Book: Training at scale, "Data parallelism, ZeRO and FSDP".

    ``ShardedOptimizer(params, optimizer_cls, **kwargs)`` builds ``optimizer_cls(local_params, **kwargs)``
    (e.g. :class:`llmarch.optim.AdamW`). ``param_groups`` hold every parameter (so clipping and schedules
    work as usual) and a change of a group's ``lr`` reaches the local optimiser at the next step. The
    gradients must be averaged first (e.g. by :class:`llmarch.parallel.DDP`). With Adam the states
    (``8P`` bytes in fp32, ``12P`` with fp32 master weights) are divided by the world size.
    """

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], **kwargs):
        self.rank, self.world_size = require_process_group()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner: dict[torch.Tensor, int] = {}
        self._load = [0] * self.world_size
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._local_groups: list[dict] = []
        super().__init__(params, kwargs)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if p not in self.owner:
                rank = min(range(self.world_size), key=lambda r: (self._load[r], r))
                self.owner[p] = rank
                self._load[rank] += p.numel()
        local = {**{k: v for k, v in group.items() if k != "params"},
                 "params": [p for p in group["params"] if self.owner[p] == self.rank]}
        self._local_groups.append(local)
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local], **self.kwargs)
        else:
            self.local_optimizer.add_param_group(local)

    @torch.no_grad()
    def step(self, closure=None):
        """Step the local shard, then broadcast every parameter from its owner."""
        for group, local_group in zip(self.param_groups, self.local_optimizer.param_groups):
            for key, value in group.items():
                if key != "params":
                    local_group[key] = value
        loss = self.local_optimizer.step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])
        return loss

    def local_state_bytes(self) -> int:
        """Bytes of optimiser state this rank holds."""
        return sum(t.numel() * t.element_size() for state in self.local_optimizer.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor))
