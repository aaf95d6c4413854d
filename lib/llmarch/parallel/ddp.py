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
        self.ready = 0
        self.flat: torch.Tensor | None = None
        self.handle = None


class DDP(nn.Module):
    """Wrap ``module`` for data parallelism over the default process group.

    Book: Training at scale, "Data parallelism, ZeRO and FSDP".

    At wrap time rank 0's parameters and buffers are broadcast, so every rank starts equal. Trainable
    parameters (frozen ones are left alone) are packed in reverse registration order, roughly the order in
    which the backward pass produces their gradients, into buckets of at most ``bucket_size_mb`` MiB. When
    the last gradient of a bucket is accumulated (``register_post_accumulate_grad_hook``; a tied weight has
    one accumulator, so it fires once per backward), the bucket's gradients are flattened, divided by the
    world size and all-reduced with ``async_op=True`` while the backward goes on.
    :meth:`finish_gradient_synchronization` waits for them and writes the averages back into ``.grad``;
    call it after the backward and before the optimiser step. A parameter that received no gradient on a
    rank contributes zeros. ``.module`` is the wrapped model.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25):
        super().__init__()
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
        self.rank, self.world_size = require_process_group()
        self.module = module
        broadcast_module(module)
        self._sync = True
        self.buckets: list[_Bucket] = []
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
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(lambda param, bucket=bucket: self._grad_ready(bucket))

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

    def _grad_ready(self, bucket: _Bucket) -> None:
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            bucket.ready = 0  # the next backward (gradient accumulation) counts again
            if self._sync:
                self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        if bucket.handle is not None:  # a later backward in the same step supersedes this one
            bucket.handle.wait()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        bucket.flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world_size)
        bucket.handle = dist.all_reduce(bucket.flat, async_op=True)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce (launching those whose hooks did not all fire, e.g. for a
        parameter unused on this rank) and write the averaged gradients into ``.grad``."""
        for bucket in self.buckets:
            if bucket.handle is None:
                self._launch(bucket)
        for bucket in self.buckets:
            bucket.handle.wait()
            offset = 0
            for p in bucket.params:
                chunk = bucket.flat[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = chunk.clone()
                else:
                    p.grad.copy_(chunk)
                offset += p.numel()
            bucket.flat, bucket.handle = None, None
