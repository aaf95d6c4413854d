"""Trusted checks of ps10-parallel: fresh inputs for every hidden test cell, llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps10-parallel/ps10-parallel.ipynb``.
References: ``llmarch.parallel.ring`` (the ring collectives and their byte counts), the ZeRO table counted
element by element (which GPU keeps each element of each kind of model state), GPipe's rules simulated slot by
slot (the grid, whatever the backward's length) and ``llmarch.train.LossScaler`` driven by an optimiser whose
gradients overflow on the given steps (the loss-scale trace). The bubble of an arbitrary grid is computed here
from its definition.

Section 5 (tensor parallelism) is judged against a loop over the hidden units; section 6 (DDP and ZeRO-1 on
real processes: the notebook's read-only ``ddp_gradients`` and ``zero1_training`` fork 2 or 3 ranks joined by
gloo over a FileStore, on the loopback interface that the sandbox's network namespace keeps) against one process
training on the whole batch with ``torch.optim.SGD``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from autograder.checks import Case, Check, FailureClass
from llmarch.parallel.ring import ring_all_gather, ring_all_reduce, ring_bytes_sent, ring_reduce_scatter
from llmarch.train import LossScaler

NOTEBOOK = "ps10-parallel.ipynb"
TRUSTED_CALLABLES: dict = {}


# --- references ---------------------------------------------------------------------------------------------


def ref_zero_memory(n_params, world_size, stage, k=12):
    """Bytes per GPU, counted element by element: each kind of state (bytes per element, the first stage that
    partitions it) is kept whole by every GPU, or each element by the GPU whose chunk holds it."""
    n_params, world_size = int(n_params), int(world_size)
    owner = np.concatenate([np.full(len(chunk), rank) for rank, chunk in
                            enumerate(np.array_split(np.arange(n_params), world_size))]).astype(np.int64)
    kept = np.bincount(owner, minlength=world_size)
    total = np.zeros(world_size, dtype=np.int64)
    for per_element, partitioned_from in ((2, 3), (2, 2), (int(k), 1)):  # weights, gradients, optimiser states
        total += per_element * (kept if int(stage) >= partitioned_from else n_params)
    return total


def ref_gpipe_schedule(p, m, t_backward=1):
    """GPipe simulated slot by slot: in every slot, each stage that is free starts the next operation of its queue
    (F0 .. F(m-1), B0 .. B(m-1)) when the operation it needs has finished; a grid of micro-batch labels."""
    p, m, t_backward = int(p), int(m), int(t_backward)
    queues = [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]
    finished, free_from, filled = {}, [0] * p, []
    slot = 0
    while any(queues):
        for stage in range(p):
            if not queues[stage] or free_from[stage] > slot:
                continue
            kind, i = queues[stage][0]
            if kind == "F":
                needs = ("F", stage - 1, i) if stage > 0 else None
            else:
                needs = ("B", stage + 1, i) if stage < p - 1 else ("F", stage, i)
            if needs is None or finished.get(needs, math.inf) <= slot:
                length = 1 if kind == "F" else t_backward
                filled += [(stage, t, (i + 1) * (1 if kind == "F" else -1)) for t in range(slot, slot + length)]
                finished[kind, stage, i] = free_from[stage] = slot + length
                queues[stage].pop(0)
        slot += 1
    grid = np.zeros((p, max(finished.values())), dtype=np.int64)
    for stage, t, label in filled:
        grid[stage, t] = label
    return grid


def ref_pipeline_bubble(schedule):
    busy = np.asarray(schedule) != 0
    working = np.flatnonzero(busy.any(axis=0))
    if working.size == 0:
        return np.float64(0.0)
    span = busy[:, : working[-1] + 1]
    return np.float64(1.0 - span.sum() / span.size)


def ref_loss_scale_trace(overflows, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                         growth_interval=2000):
    scaler = LossScaler(float(init_scale), float(growth_factor), float(backoff_factor), int(growth_interval))
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scales, taken = [], []
    for overflow in np.asarray(overflows, dtype=bool):
        scales.append(scaler.get_scale())
        weight.grad = torch.full((1,), math.inf if overflow else 1.0)
        taken.append(scaler.step(optimizer))
        scaler.update()
    return np.array(scales, dtype=np.float64), np.array(taken, dtype=bool)


def ref_tp_partials(x, w1, w2, t):
    """(t, n, d): rank r's partial output, summed hidden unit by hidden unit over the columns it keeps."""
    partials = np.zeros((int(t), x.shape[0], w2.shape[1]))
    for rank, columns in enumerate(np.array_split(np.arange(w1.shape[1]), int(t))):
        for j in columns:
            partials[rank] += np.outer(np.maximum(x @ w1[:, j], 0.0), w2[j])
    return partials


def _mlp(w1, b1, w2, b2):
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (w1, b1, w2, b2)]


def _mse(params, x, y):
    w1, b1, w2, b2 = params
    return ((torch.relu(torch.tensor(x) @ w1 + b1) @ w2 + b2 - torch.tensor(y)) ** 2).mean()


def ddp_buckets(sizes, bucket_numel):
    """The buckets of parameters of these element counts, by DDP's rule as the notebook states it: reverse order,
    a bucket grows while it stays within bucket_numel. Returns each parameter's bucket number."""
    owner, bucket, filled = np.zeros(len(sizes), dtype=np.int64), -1, bucket_numel + 1
    for index in range(len(sizes) - 1, -1, -1):
        if filled + sizes[index] > bucket_numel:
            bucket, filled = bucket + 1, 0
        owner[index], filled = bucket, filled + sizes[index]
    return owner


def ref_ddp_gradients(w1, b1, w2, b2, x, y, world_size, bucket_numel):
    """One process on the whole batch: its gradients and the buckets, the same on every rank."""
    params = _mlp(w1, b1, w2, b2)
    _mse(params, x, y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
    owner = ddp_buckets([p.numel() for p in params], int(bucket_numel))
    return np.tile(grads, (int(world_size), 1)), np.tile(owner, (int(world_size), 1))


def ref_zero1_training(w1, b1, w2, b2, x, y, world_size, lr, beta, steps):
    """One process, torch.optim.SGD with momentum on the whole batch: the parameters (the same on every rank) and
    each rank's shard of the momentum, zero padded to world_size shards."""
    params = _mlp(w1, b1, w2, b2)
    optimizer = torch.optim.SGD(params, lr=float(lr), momentum=float(beta))
    for _ in range(int(steps)):
        optimizer.zero_grad()
        _mse(params, x, y).backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    # torch keeps no buffer for momentum 0, where m = beta m + g is the last gradient
    momentum = torch.cat([optimizer.state[p].get("momentum_buffer", p.grad).reshape(-1) for p in params]).numpy()
    shard = -(-flat.size // int(world_size))
    padded = np.concatenate([momentum, np.zeros(shard * int(world_size) - flat.size)])
    return np.tile(flat, (int(world_size), 1)), padded.reshape(int(world_size), shard)


# --- fresh inputs -------------------------------------------------------------------------------------------

# Every `cases` function starts with deterministic edge cases (the same for every seed), built so that each known
# wrong variant of tests/test_wrong_variants_ps10.py fails them every time; random cases come in addition.


def _buffers(rng, world, n):
    return rng.normal(size=(world, n)).round(3)


def _reduce_scatter(rng):
    return [Case((np.array([[1.0, 2.0], [10.0, 20.0]]),), note="two ranks, two elements"),
            Case((np.arange(12.0).reshape(3, 4),), note="three ranks, four elements: chunks of unequal size"),
            Case((_buffers(rng, 4, 9),), note="four ranks, nine elements"),
            Case((_buffers(rng, int(rng.integers(3, 7)), int(rng.integers(1, 20))),),
                 note="random ranks and length, perhaps fewer elements than ranks"),
            Case((_buffers(rng, int(rng.integers(2, 9)), int(rng.integers(8, 40))),), note="random ranks and length")]


def _all_gather(rng):
    return [Case((np.array([[0.0, 7.0], [5.0, 0.0]]),), note="two ranks: which chunk each rank owns"),
            Case((np.array([[-1.0, -1.0, 1.0, -1.0], [-1.0, -1.0, -1.0, 2.0], [3.0, 3.0, -1.0, -1.0]]),),
                 note="three ranks, chunks of unequal size, the other entries -1"),
            Case((_buffers(rng, 5, 11),), note="five ranks, eleven elements"),
            Case((_buffers(rng, int(rng.integers(3, 8)), int(rng.integers(3, 30))),), note="random ranks and length")]


def _all_reduce(rng):
    return [Case((_buffers(rng, 3, 7),), note="three ranks, seven elements"),
            Case((_buffers(rng, 4, 4),), note="four ranks, four elements"),
            Case((_buffers(rng, 1, 5),), note="a single rank"),
            Case((_buffers(rng, int(rng.integers(3, 9)), int(rng.integers(1, 30))),), note="random ranks and length")]


def _ring_bytes(rng):
    world = int(rng.integers(2, 65))
    return [Case((1000, 4, "reduce_scatter"), note="a reduce-scatter of 1000 bytes on 4 ranks"),
            Case((1000, 4, "all_gather"), note="an all-gather of 1000 bytes on 4 ranks"),
            Case((1000, 4, "all_reduce"), note="an all-reduce of 1000 bytes on 4 ranks"),
            Case((2**20, 1, "all_reduce"), note="a single rank"),
            Case((float(rng.integers(1, 10**6)) * world, world, str(rng.choice(["all_reduce", "all_gather"]))),
                 note="a random size and rank count")]


def _zero_memory(rng):
    n, world = int(rng.integers(10**3, 10**6)), int(rng.choice([2, 8, 16, 64, 512]))
    return [Case((960_000, 64, stage), note=f"960,000 parameters on 64 GPUs, stage {stage}") for stage in range(4)] + [
        Case((10**6, 8, 1), {"k": 8}, note="stage 1, k = 8"), Case((10**6, 1, 3), note="stage 3 on a single GPU"),
        Case((10**6, 16, 2), {"k": 4}, note="stage 2, k = 4"),
        *[Case((1003, 8, stage), note=f"1003 parameters on 8 GPUs, stage {stage}") for stage in range(1, 4)],
        Case((n, world, int(rng.integers(0, 4))), {"k": int(rng.choice([8, 12, 16]))},
             note="a random size, GPU count, stage and k")]


def _gpipe_schedule(rng):
    return [Case((2, 2), note="2 stages, 2 micro-batches"), Case((1, 3), note="1 stage, 3 micro-batches"),
            Case((4, 8), note="4 stages, 8 micro-batches"), Case((3, 1), note="3 stages, 1 micro-batch"),
            Case((3, 4), {"t_backward": 2}, note="3 stages, 4 micro-batches, backwards of 2 slots"),
            Case((2, 1), {"t_backward": 3}, note="2 stages, 1 micro-batch, backwards of 3 slots"),
            Case((int(rng.integers(2, 7)), int(rng.integers(1, 12))), {"t_backward": int(rng.integers(1, 4))},
                 note="random stages, micro-batches and backward length")]


def _pipeline_bubble(rng):
    p, m = int(rng.integers(2, 6)), int(rng.integers(1, 9))
    grid = ref_gpipe_schedule(p, m)
    messy = np.where(rng.random((p, 2 * (m + p - 1))) < 0.4, 0, grid)
    return [Case((np.array([[1, 2, 0, 0, -1, -2], [0, 1, 2, -1, -2, 0]]),), note="two stages, two micro-batches"),
            Case((np.array([[1, -1, 0, 0], [0, 1, -1, 0]]),), note="idle slots after the last operation"),
            Case((np.array([[0, 1, -1], [0, 0, 0]]),), note="an idle first slot and a stage that never works"),
            Case((np.zeros((3, 5), dtype=np.int64),), note="an empty grid: no stage ever works"),
            Case((np.array([[0, 0, 0, 0], [1, 2, -2, -1]]),), note="the first stage idle throughout"),
            Case((grid,), note="the GPipe grid of random stages and micro-batches"),
            Case((np.concatenate([messy, np.zeros((p, 3), dtype=np.int64)], axis=1),),
                 note="a grid with random holes and idle slots at the end")]


def _overflows(rng, n, p):
    return rng.random(n) < p


def _loss_scaler_backoff(rng):
    """No growth within these sequences (growth_interval far above their length)."""
    return [Case((np.array([False, True, True, False, True]),), note="overflows among good steps, the defaults"),
            Case((np.array([True, False]),), {"init_scale": 8.0, "backoff_factor": 0.25},
                 note="an overflow on the first step, backoff_factor 0.25"),
            Case((np.array([True, True, True]),), {"init_scale": 2.0**10}, note="three overflows in a row"),
            Case((np.array([True, True, False, True, True]),), {"init_scale": 2.0},
                 note="overflows that take the scale below 1"),
            Case((np.array([False, True, True]),), {"init_scale": 2.0**30}, note="an initial scale of 2**30"),
            Case((_overflows(rng, int(rng.integers(5, 30)), 0.4),),
                 {"init_scale": float(2 ** int(rng.integers(4, 20))), "backoff_factor": float(rng.choice([0.5, 0.25]))},
                 note="random overflows, a random initial scale and backoff")]


def _loss_scaler_growth(rng):
    return [Case((np.zeros(7, dtype=bool),), {"init_scale": 1.0, "growth_interval": 3},
                 note="no overflow, growth_interval 3"),
            Case((np.array([False, False, True, False, False, False, False]),),
                 {"init_scale": 4.0, "growth_interval": 3}, note="an overflow just before the scale would grow"),
            Case((np.zeros(4, dtype=bool),), {"init_scale": 1.0, "growth_factor": 3.0, "growth_interval": 2},
                 note="growth_factor 3"),
            Case((np.zeros(3, dtype=bool),), {"growth_interval": 1}, note="growth_interval 1, the default scale"),
            Case((np.array([True, True, False, False, True, False, False]),), {"init_scale": 1.0, "growth_interval": 2},
                 note="overflows below a scale of 1, then growth"),
            Case((np.zeros(5, dtype=bool),), {"init_scale": 2.0**23, "growth_interval": 1},
                 note="growth from 2**23, past 2**24"),
            Case((_overflows(rng, int(rng.integers(10, 40)), 0.2),),
                 {"init_scale": float(2 ** int(rng.integers(0, 16))), "growth_interval": int(rng.integers(1, 6))},
                 note="random overflows, a random initial scale and growth_interval")]


def _tp_partials(rng):
    def case(n, d, h, t, note):
        return Case((rng.normal(size=(n, d)), rng.normal(size=(d, h)), rng.normal(size=(h, d)), t), note=note)
    return [case(3, 4, 6, 2, "h = 6 on 2 ranks"), case(4, 3, 7, 3, "h = 7 on 3 ranks (h not a multiple of t)"),
            case(2, 5, 5, 1, "a single rank"), case(3, 2, 2, 4, "4 ranks, h = 2 (more ranks than hidden units)"),
            case(int(rng.integers(1, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 13)), int(rng.integers(2, 6)),
                 "random sizes and ranks")]


def _mlp_case(rng, d, h, o, world_size, rows_per_rank):
    n = world_size * rows_per_rank
    return (rng.normal(size=(d, h)), rng.normal(size=h), rng.normal(size=(h, o)), rng.normal(size=o),
            rng.normal(size=(n, d)), rng.normal(size=(n, o)), world_size)


def _random_mlp(rng):
    return _mlp_case(rng, int(rng.integers(2, 6)), int(rng.integers(3, 12)), int(rng.integers(1, 4)),
                     int(rng.integers(2, 4)), int(rng.integers(1, 4)))


def _ddp_average(rng):
    """Parameters of 24, 8, 16 and 2 elements (d = 3, h = 8, o = 2) unless random."""
    mlp = _random_mlp(rng)
    n_params = sum(a.size for a in mlp[:4])
    return [Case(_mlp_case(rng, 3, 8, 2, 2, 3) + (20,),
                 note="2 ranks, parameters of 24, 8, 16 and 2 elements, bucket_numel 20"),
            Case(_mlp_case(rng, 3, 8, 2, 3, 2) + (16,), note="3 ranks, bucket_numel 16, below the largest parameter"),
            Case(_mlp_case(rng, 2, 4, 2, 2, 2) + (12,),
                 note="2 ranks, parameters of 8, 4, 8 and 2 elements, bucket_numel 12"),
            Case(_mlp_case(rng, 3, 8, 2, 2, 2) + (1000,), note="2 ranks, bucket_numel above the parameter count"),
            Case(mlp + (int(rng.integers(1, n_params + 1)),), note="random sizes, ranks and bucket_numel")]


def _zero1(rng):
    """50 parameters (d = 3, h = 8, o = 2) unless random."""
    return [Case(_mlp_case(rng, 3, 8, 2, 2, 3) + (0.1, 0.9, 3), note="2 ranks, 3 steps"),
            Case(_mlp_case(rng, 3, 8, 2, 3, 2) + (0.05, 0.5, 2),
                 note="3 ranks, 50 parameters (not a multiple of 3), 2 steps"),
            Case(_mlp_case(rng, 2, 5, 3, 2, 2) + (0.1, 0.0, 1), note="2 ranks, one step, no momentum"),
            Case(_random_mlp(rng) + (float(rng.uniform(0.01, 0.2)), float(rng.uniform(0.3, 0.95)),
                                     int(rng.integers(2, 5))), note="random sizes, ranks, lr, beta and steps")]


KEEP_BUFFERS = "the text asks for a new array and the input unchanged"

CHECKS = {
    "test_reduce_scatter": Check("ring_reduce_scatter", _reduce_scatter, ring_reduce_scatter, rtol=1e-9, atol=1e-9,
                                 keeps_inputs=KEEP_BUFFERS),
    "test_all_gather": Check("ring_all_gather", _all_gather, ring_all_gather, rtol=1e-9, atol=1e-9,
                             keeps_inputs=KEEP_BUFFERS),
    "test_all_reduce": Check("ring_all_reduce", _all_reduce, ring_all_reduce, rtol=1e-9, atol=1e-9,
                             depends_on=("ring_reduce_scatter", "ring_all_gather")),
    "test_ring_bytes": Check("ring_bytes_sent", _ring_bytes, lambda n, w, op: np.float64(ring_bytes_sent(n, w, op))),
    "test_zero_memory": Check("zero_memory", _zero_memory, ref_zero_memory),
    "test_gpipe_schedule": Check("gpipe_schedule", _gpipe_schedule, ref_gpipe_schedule),
    "test_pipeline_bubble": Check("pipeline_bubble", _pipeline_bubble, ref_pipeline_bubble),
    "test_loss_scaler_backoff": Check("loss_scale_trace", _loss_scaler_backoff, ref_loss_scale_trace),
    "test_loss_scaler_growth": Check("loss_scale_trace", _loss_scaler_growth, ref_loss_scale_trace),
    "test_tp_partials": Check("tp_mlp_partials", _tp_partials, ref_tp_partials),
    "test_ddp_average": Check("ddp_gradients", _ddp_average, ref_ddp_gradients, returns=("gradients", "buckets")),
    "test_zero1": Check("zero1_training", _zero1, ref_zero1_training, returns=("parameters", "momentum shards")),
}


def _world(case):
    return case.args[0].shape[0]


def _uneven(case):
    return case.args[0].shape[1] % case.args[0].shape[0] != 0


def _parameter_sizes(case):
    return [a.size for a in case.args[:4]]


def _bucket_sizes(case):
    owner = ddp_buckets(_parameter_sizes(case), case.args[7])
    return [sum(size for size, b in zip(_parameter_sizes(case), owner) if b == bucket) for bucket in set(owner)]


def _bucket_count(case):
    return len(_bucket_sizes(case))


def _scales(case):
    return ref_loss_scale_trace(*case.args, **case.kwargs)[0]


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).
FAILURE_CLASSES = [
    FailureClass("reduce-scatter: chunks of unequal size (n not a multiple of N)", "test_reduce_scatter", _uneven),
    FailureClass("reduce-scatter: four ranks or more (the order of the chunks shows)", "test_reduce_scatter",
                 lambda case: _world(case) >= 4),
    FailureClass("reduce-scatter: float64 buffers that an in-place update would change", "test_reduce_scatter",
                 lambda case: case.args[0].dtype == np.float64),
    FailureClass("all-gather: chunks of unequal size", "test_all_gather", _uneven),
    FailureClass("all-gather: entries outside the owned chunks that must be overwritten", "test_all_gather",
                 lambda case: _world(case) >= 3 and np.unique(case.args[0]).size > 1),
    FailureClass("all-gather: float64 buffers that an in-place update would change", "test_all_gather",
                 lambda case: case.args[0].dtype == np.float64),
    FailureClass("all-reduce: chunks of unequal size", "test_all_reduce", _uneven),
    FailureClass("all-reduce: a single rank", "test_all_reduce", lambda case: _world(case) == 1),
    FailureClass("ring bytes: an all-reduce on several ranks (twice one pass)", "test_ring_bytes",
                 lambda case: case.args[2] == "all_reduce" and case.args[1] > 1),
    FailureClass("ring bytes: a reduce-scatter", "test_ring_bytes", lambda case: case.args[2] == "reduce_scatter"),
    FailureClass("ring bytes: an all-gather", "test_ring_bytes", lambda case: case.args[2] == "all_gather"),
    FailureClass("ring bytes: a single rank sends nothing", "test_ring_bytes", lambda case: case.args[1] == 1),
    *[FailureClass(f"ZeRO: stage {stage} on several GPUs", "test_zero_memory",
                   lambda case, stage=stage: case.args[2] == stage and case.args[1] > 1) for stage in range(4)],
    FailureClass("ZeRO: optimiser state k other than 12", "test_zero_memory",
                 lambda case: case.kwargs.get("k", 12) != 12 and case.args[2] >= 1),
    FailureClass("ZeRO: a single GPU", "test_zero_memory", lambda case: case.args[1] == 1),
    *[FailureClass(f"ZeRO: stage {stage}, parameters that do not split evenly", "test_zero_memory",
                   lambda case, stage=stage: case.args[2] == stage and case.args[0] % case.args[1] != 0)
      for stage in range(1, 4)],
    FailureClass("GPipe: several stages and micro-batches", "test_gpipe_schedule",
                 lambda case: case.args[0] > 1 and case.args[1] > 1),
    FailureClass("GPipe: more micro-batches than stages", "test_gpipe_schedule",
                 lambda case: case.args[1] > case.args[0]),
    FailureClass("GPipe: a single stage", "test_gpipe_schedule", lambda case: case.args[0] == 1),
    FailureClass("GPipe: a single micro-batch", "test_gpipe_schedule", lambda case: case.args[1] == 1),
    FailureClass("GPipe: backwards longer than a slot, several stages and micro-batches", "test_gpipe_schedule",
                 lambda case: case.kwargs.get("t_backward", 1) > 1 and min(case.args) > 1),
    FailureClass("GPipe: backwards longer than a slot, one micro-batch", "test_gpipe_schedule",
                 lambda case: case.kwargs.get("t_backward", 1) > 1 and case.args[1] == 1),
    FailureClass("bubble: idle columns after the last operation", "test_pipeline_bubble",
                 lambda case: case.args[0].any() and not case.args[0][:, -1].any()),
    FailureClass("bubble: an idle first slot of a working grid", "test_pipeline_bubble",
                 lambda case: case.args[0].any() and not case.args[0][:, 0].any()),
    FailureClass("bubble: a stage idle throughout, other stages working", "test_pipeline_bubble",
                 lambda case: case.args[0].any() and not case.args[0].any(axis=1).all()),
    FailureClass("bubble: an empty grid", "test_pipeline_bubble", lambda case: not case.args[0].any()),
    FailureClass("backoff: an overflow on the first step", "test_loss_scaler_backoff", lambda case: case.args[0][0]),
    FailureClass("backoff: overflows in a row", "test_loss_scaler_backoff",
                 lambda case: (case.args[0][1:] & case.args[0][:-1]).any()),
    FailureClass("backoff: backoff_factor other than 0.5", "test_loss_scaler_backoff",
                 lambda case: case.kwargs.get("backoff_factor", 0.5) != 0.5 and case.args[0].any()),
    FailureClass("backoff: a scale below 1 (no floor in the text)", "test_loss_scaler_backoff",
                 lambda case: _scales(case).min() < 1),
    FailureClass("backoff: a scale above 2**24 (no ceiling in the text)", "test_loss_scaler_backoff",
                 lambda case: _scales(case).max() > 2**24),
    FailureClass("growth: several growths in a row", "test_loss_scaler_growth",
                 lambda case: np.sum(np.diff(_scales(case)) > 0) >= 2),
    FailureClass("growth: an overflow restarts the clean count", "test_loss_scaler_growth",
                 lambda case: case.args[0].any() and np.diff(_scales(case)).max(initial=0) > 0),
    FailureClass("growth: growth_factor other than 2", "test_loss_scaler_growth",
                 lambda case: case.kwargs.get("growth_factor", 2.0) != 2.0),
    FailureClass("growth: growth_interval 1", "test_loss_scaler_growth",
                 lambda case: case.kwargs.get("growth_interval", 2000) == 1),
    FailureClass("growth: a scale below 1 (no floor in the text)", "test_loss_scaler_growth",
                 lambda case: _scales(case).min() < 1),
    FailureClass("growth: a scale above 2**24 (no ceiling in the text)", "test_loss_scaler_growth",
                 lambda case: _scales(case).max() > 2**24),
    FailureClass("tensor parallel: h not a multiple of t (shards of unequal size)", "test_tp_partials",
                 lambda case: case.args[3] > 1 and case.args[1].shape[1] % case.args[3] != 0),
    FailureClass("tensor parallel: a single rank", "test_tp_partials", lambda case: case.args[3] == 1),
    FailureClass("tensor parallel: more ranks than hidden units (empty shards)", "test_tp_partials",
                 lambda case: case.args[3] > case.args[1].shape[1]),
    FailureClass("tensor parallel: an even split on several ranks", "test_tp_partials",
                 lambda case: case.args[3] > 1 and case.args[1].shape[1] % case.args[3] == 0),
    *[FailureClass(f"DDP: {world} processes, several buckets", "test_ddp_average",
                   lambda case, world=world: case.args[6] == world and _bucket_count(case) > 1) for world in (2, 3)],
    FailureClass("DDP: buckets of unequal sizes, so that they must be reduced in the same order everywhere",
                 "test_ddp_average", lambda case: len(set(_bucket_sizes(case))) > 1),
    FailureClass("DDP: a bucket of several parameters", "test_ddp_average",
                 lambda case: _bucket_count(case) < len(_parameter_sizes(case))),
    FailureClass("DDP: a parameter larger than bucket_numel", "test_ddp_average",
                 lambda case: max(_parameter_sizes(case)) > case.args[7]),
    FailureClass("DDP: one bucket for everything", "test_ddp_average", lambda case: _bucket_count(case) == 1),
    *[FailureClass(f"ZeRO-1: {world} processes, several steps with momentum", "test_zero1",
                   lambda case, world=world: case.args[6] == world and case.args[9] > 1 and case.args[8] > 0)
      for world in (2, 3)],
    FailureClass("ZeRO-1: parameters that do not split evenly (padding)", "test_zero1",
                 lambda case: sum(_parameter_sizes(case)) % case.args[6] != 0),
    FailureClass("ZeRO-1: one step without momentum (plain averaged SGD)", "test_zero1",
                 lambda case: case.args[9] == 1 and case.args[8] == 0),
]
