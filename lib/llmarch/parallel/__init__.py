"""Parallel training on ``torch.distributed`` (gloo on CPU, NCCL on GPU): data parallelism with bucketed
asynchronous all-reduce (:class:`DDP`), optimiser-state sharding (:class:`ShardedOptimizer`, ZeRO-1) and
fully sharded data parallelism (:class:`FSDP`, ZeRO-3); the pipeline schedules of GPipe and 1F1B
(:func:`pipeline_schedule`); the ring collectives simulated on arrays (:mod:`llmarch.parallel.ring`); :func:`run_distributed` runs a function on N local processes.

Book: Training at scale.
"""

from llmarch.parallel.ddp import DDP
from llmarch.parallel.fsdp import FSDP
from llmarch.parallel.pipeline import bubble_fraction, pipeline_schedule
from llmarch.parallel.ring import ring_all_gather, ring_all_reduce, ring_bytes_sent, ring_reduce_scatter
from llmarch.parallel.spawn import run_distributed
from llmarch.parallel.zero import ShardedOptimizer

__all__ = ["DDP", "ShardedOptimizer", "FSDP", "pipeline_schedule", "bubble_fraction", "run_distributed",
           "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce", "ring_bytes_sent"]
