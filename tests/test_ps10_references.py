"""The references of ps10's checks against independent ones: the slot-by-slot GPipe simulation against
``llmarch.parallel.pipeline_schedule``, the element-by-element ZeRO count against ``llmarch.train.model_state_bytes``,
the tensor-parallel partials against the unsplit MLP, and the one-process DDP and ZeRO-1 references against
gradients taken shard by shard."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autograder.assignments import ps10_parallel as ps10
from llmarch.parallel import pipeline_schedule
from llmarch.train import model_state_bytes


@pytest.mark.parametrize("t_backward", [1, 2, 3])
def test_the_gpipe_simulation_is_llmarchs_schedule(t_backward):
    for p in range(1, 6):
        for m in range(1, 7):
            schedule = pipeline_schedule(p, m, "gpipe", t_forward=1.0, t_backward=float(t_backward))
            expected = np.zeros((p, int(schedule.makespan)), dtype=np.int64)
            for stage, ops in enumerate(schedule.timeline):
                for start, end, label in ops:
                    expected[stage, int(start):int(end)] = (int(label[1:]) + 1) * (1 if label[0] == "F" else -1)
            assert np.array_equal(ps10.ref_gpipe_schedule(p, m, t_backward), expected), (p, m, t_backward)


def test_the_zero_count_is_the_papers_table_and_sums_to_the_states():
    for stage in range(4):
        for k in (8, 12):
            even = ps10.ref_zero_memory(64_000, 64, stage, k)
            assert np.all(even == sum(model_state_bytes(64_000.0, 64, stage, 2, 2, float(k))))
    uneven = ps10.ref_zero_memory(1003, 8, 3)
    assert uneven.sum() == 16 * 1003 and uneven.max() - uneven.min() == 16  # 126 or 125 elements each


def test_the_tensor_parallel_partials_sum_to_the_unsplit_mlp():
    rng = np.random.default_rng(0)
    for h, t in [(6, 2), (7, 3), (5, 1), (2, 4), (11, 5)]:
        x, w1, w2 = rng.normal(size=(3, 4)), rng.normal(size=(4, h)), rng.normal(size=(h, 4))
        partials = ps10.ref_tp_partials(x, w1, w2, t)
        assert partials.shape == (t, 3, 4)
        np.testing.assert_allclose(partials.sum(axis=0), np.maximum(x @ w1, 0.0) @ w2, rtol=1e-12, atol=1e-12)
        assert (np.abs(partials).sum(axis=(1, 2)) > 0).sum() == min(h, t)  # a rank without columns adds zeros


def test_ddp_buckets_of_the_worked_example():
    assert ps10.ddp_buckets([24, 8, 16, 2], 20).tolist() == [2, 1, 0, 0]
    assert ps10.ddp_buckets([24, 8, 16, 2], 1000).tolist() == [0, 0, 0, 0]
    assert ps10.ddp_buckets([24, 8, 16, 2], 1).tolist() == [3, 2, 1, 0]


def _shard_gradients(case_args, world_size):
    """Each rank's gradients on its rows of the batch, taken apart: (world_size, P)."""
    w1, b1, w2, b2, x, y = case_args
    rows = np.array_split(np.arange(len(x)), world_size)
    grads = []
    for mine in rows:
        params = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
        out = torch.relu(torch.tensor(x[mine]) @ params[0] + params[1]) @ params[2] + params[3]
        ((out - torch.tensor(y[mine])) ** 2).mean().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]).numpy())
    return np.stack(grads)


def test_the_one_process_references_are_the_average_of_the_ranks():
    for case in ps10._ddp_average(np.random.default_rng(1)):
        world_size = case.args[6]
        grads, owners = ps10.ref_ddp_gradients(*case.args)
        np.testing.assert_allclose(grads, np.tile(_shard_gradients(case.args[:6], world_size).mean(axis=0),
                                                  (world_size, 1)), rtol=1e-12, atol=1e-14)
    for case in ps10._zero1(np.random.default_rng(1)):
        w1, b1, w2, b2, x, y, world_size, lr, beta, steps = case.args
        if steps == 1:  # one step from zero momentum: w - lr * g, and the momentum is g
            params, shards = ps10.ref_zero1_training(*case.args)
            average = _shard_gradients(case.args[:6], world_size).mean(axis=0)
            start = np.concatenate([a.reshape(-1) for a in (w1, b1, w2, b2)])
            np.testing.assert_allclose(params[0], start - lr * average, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(shards.reshape(-1)[:average.size], average, rtol=1e-12, atol=1e-14)
