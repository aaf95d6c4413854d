"""Distributed data parallelism: every rank holds the whole model and a slice of the batch; gradients are
averaged by all-reduce in buckets, launched asynchronously from backward hooks so that communication
overlaps the rest of the backward pass.

Book: Training at scale, "Data parallelism, ZeRO and FSDP".
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDP", "broadcast_module", "require_process_group"]


def require_process_group() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; a clear error when there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("no torch.distributed process group: call torch.distributed.init_process_group "
                           "(backend 'gloo' on CPU, 'nccl' on GPU) first, or launch with torchrun")
    return dist.get_rank(), dist.get_world_size()


@torch.no_grad()
def broadcast_module(module: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (in place)."""
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


class _Bucket:
    """Parameters whose gradients are all-reduced together, as one flat tensor."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.ready: set[int] = set()  # indices of the params whose gradient this backward has produced
        self.flat: torch.Tensor | None = None
        self.handle = None


class DDP(nn.Module):
    """Wrap ``module`` for data parallelism over the default process group.

    Book: Training at scale, "Data parallelism, ZeRO and FSDP".

    At wrap time rank 0's parameters and buffers are broadcast, so every rank starts equal. Trainable
    parameters (frozen ones are left alone) are packed in reverse registration order, roughly the order in
    which the backward pass produces their gradients, into buckets of at most ``bucket_size_mb`` MiB. When
    a gradient is accumulated (``register_post_accumulate_grad_hook``; a tied weight has one accumulator,
    so it fires once per backward) its parameter is marked ready. Buckets are all-reduced in the same fixed
    order on every rank, as torch's DDP does: bucket ``i`` is launched (flattened, divided by the world
    size, ``all_reduce(async_op=True)`` while the backward goes on) once it and every bucket before it are
    ready, so the ranks' collectives always pair up. :meth:`finish_gradient_synchronization` waits for them
    and writes the averages back into ``.grad``; call it after the backward and before the optimiser step.

    A parameter that gets no gradient in a backward (unused by the forward) keeps its bucket, and the
    buckets after it, from launching. With ``find_unused_parameters=False`` (torch's default)
    :meth:`finish_gradient_synchronization` then raises a ``RuntimeError`` naming it (when only some ranks
    skip it, the others wait in their all-reduce until the launcher stops them, as with torch). With
    ``find_unused_parameters=True`` the remaining buckets are launched there, in order, the missing
    gradients counting as zeros; a parameter unused on every rank (one more all-reduce, of a flag per
    parameter) keeps its ``.grad`` untouched, as torch's does. ``.module`` is the wrapped model.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25, find_unused_parameters: bool = False):
        super().__init__()
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
        self.rank, self.world_size = require_process_group()
        self.module, self.find_unused_parameters = module, find_unused_parameters
        broadcast_module(module)
        self._sync = True
        self.buckets: list[_Bucket] = []
        self._next_bucket = 0  # buckets before it have been launched in this backward
        self._used: set[int] = set()  # ids of the parameters that got a gradient since the last synchronisation
        limit, current, size = bucket_size_mb * 2**20, [], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > limit:
                self.buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(_Bucket(current))
        for bucket in self.buckets:
            for index, p in enumerate(bucket.params):
                p.register_post_accumulate_grad_hook(
                    lambda param, bucket=bucket, index=index: self._grad_ready(bucket, index))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) inside the block: for all micro-batches but the
        last in gradient accumulation."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def _grad_ready(self, bucket: _Bucket, index: int) -> None:
        self._used.add(id(bucket.params[index]))
        if not self._sync:
            return
        if index in bucket.ready:
            raise RuntimeError("DDP: a second backward before finish_gradient_synchronization(); accumulate "
                               "the earlier micro-batches inside no_sync()")
        bucket.ready.add(index)
        while self._next_bucket < len(self.buckets):  # launch in the fixed order only
            following = self.buckets[self._next_bucket]
            if len(following.ready) < len(following.params):
                break
            self._launch(following)
            self._next_bucket += 1

    def _launch(self, bucket: _Bucket) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        bucket.flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world_size)
        bucket.handle = dist.all_reduce(bucket.flat, async_op=True)

    def _unused_names(self) -> list[str]:
        names = {id(p): name for name, p in self.module.named_parameters()}
        return [names[id(p)] for bucket in self.buckets for p in bucket.params if id(p) not in self._used]

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Launch, in order, the buckets still waiting for a gradient (``find_unused_parameters=True``;
        otherwise raise), wait for every all-reduce and write the averaged gradients into ``.grad``."""
        try:
            if self._next_bucket < len(self.buckets) and not self.find_unused_parameters:
                raise RuntimeError(
                    "DDP: these parameters received no gradient in this backward, so their buckets were never "
                    f"all-reduced: {self._unused_names()}. Use them in the forward, freeze them "
                    "(requires_grad_(False)), or wrap with DDP(..., find_unused_parameters=True)")
            for bucket in self.buckets[self._next_bucket:]:
                self._launch(bucket)
            used_somewhere = self._used_on_any_rank() if self.find_unused_parameters else None
            for bucket in self.buckets:
                bucket.handle.wait()
                offset = 0
                for p in bucket.params:
                    chunk = bucket.flat[offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
                    if used_somewhere is not None and id(p) not in used_somewhere:
                        continue  # unused on every rank: .grad left as it was
                    if p.grad is None:
                        p.grad = chunk.clone()
                    else:
                        p.grad.copy_(chunk)
        finally:
            self._reset()

    def _used_on_any_rank(self) -> set[int]:
        params = [p for bucket in self.buckets for p in bucket.params]
        used = torch.tensor([float(id(p) in self._used) for p in params], device=params[0].device)
        dist.all_reduce(used, op=dist.ReduceOp.MAX)
        return {id(p) for p, flag in zip(params, used.tolist()) if flag}

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.flat, bucket.handle = None, None
        self._next_bucket, self._used = 0, set()
