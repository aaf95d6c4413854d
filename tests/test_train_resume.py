"""Checkpoints and resumption of ``python -m llmarch.train``, off the happy path: fp16 with an injected
forward overflow on the last rank (step 1), a checkpoint every 2 steps, and a run resumed from step 2 that
must equal the uninterrupted one bit for bit (the losses of the last steps, the final weights and optimiser
states), for ``none`` in this process and ``ddp``, ``zero1`` (sharded Adam state) and ``fsdp`` (sharded
weights and state) on 2 gloo processes; the command line's ``--resume`` on top."""

import csv
import os
import subprocess
import sys
import time

import pytest
import torch

from llmarch.parallel import run_distributed
from llmarch.train.launch import parse_args, threads_per_process, train_gpt

COMMON = ["--steps", "4", "--warmup", "1", "--tokens", "20000", "--global-batch", "4", "--context", "16",
          "--d-model", "32", "--layers", "1", "--heads", "2", "--precision", "fp16", "--inject-overflow", "1",
          "--checkpoint-every", "2", "--device", "cpu"]  # bit for bit: the CPU's deterministic kernels
STRATEGIES = ("ddp", "zero1", "fsdp")


def _argv(strategy, out, *more):
    return [*COMMON, "--strategy", strategy, "--out", str(out), *more]


def _full_and_resumed(rank, world, root, strategies):
    """Each strategy twice: 4 steps uninterrupted, then again from the first run's step-2 checkpoint."""
    curves = {}
    for strategy in strategies:
        full = train_gpt(rank, world, parse_args(_argv(strategy, root / strategy / "full")))
        resumed = train_gpt(rank, world, parse_args(_argv(strategy, root / strategy / "resumed", "--resume",
                                                          str(root / strategy / "full" / "step-000002"))))
        curves[strategy] = full, resumed
    return curves


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    start = time.perf_counter()
    curves = run_distributed(_full_and_resumed, 2, root, STRATEGIES, threads=threads_per_process(2))
    curves[0].update(_full_and_resumed(0, 1, root, ["none"]))
    return root, curves, time.perf_counter() - start  # the wall time of both, start-up included


def _files(root, strategy):
    step = "step-000004"
    names = ["rank0.pt", "rank1.pt"] if strategy in ("zero1", "fsdp") else ["rank0.pt"]
    return [(torch.load(root / strategy / "full" / step / n, weights_only=True),
             torch.load(root / strategy / "resumed" / step / n, weights_only=True)) for n in names]


def _assert_equal(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}/{i}")
    else:
        assert a == b, where


@pytest.mark.parametrize("strategy", ["none", *STRATEGIES])
def test_a_resumed_fp16_run_with_an_overflow_equals_the_uninterrupted_one(runs, strategy):
    root, ranks, _ = runs
    for curves in ranks if strategy != "none" else ranks[:1]:
        full, resumed = curves[strategy]
        assert [row["skipped"] != "" for row in full] == [False, True, False, False]  # survived the overflow
        assert [row["loss"] for row in resumed] == [row["loss"] for row in full[2:]]  # bit for bit
    for full, resumed in _files(root, strategy):
        for part in ("model", "optimizer", "extra"):  # weights, Adam moments (ZeRO-1's and FSDP's shards)
            _assert_equal(full[part], resumed[part], part)
        assert full["extra"]["scaler"]["scale"] == 2.0**15  # backed off once, as torch's GradScaler does
        assert full["optimizer"]  # the optimiser state is in the file (ZeRO-1's used to be empty)


def test_step_times_leave_out_the_start_up(runs):
    """Each row's ``seconds`` times its step only (throughput and MFU divide by their sum): positive, and
    together less than the whole distributed run that also started processes and built models."""
    _, ranks, wall = runs
    for curves in ranks:
        for full, resumed in curves.values():
            assert all(row["seconds"] > 0 for row in full + resumed)
    assert sum(row["seconds"] for pair in ranks[0].values() for curve in pair for row in curve) < wall


def test_sharded_strategies_write_one_file_per_rank(runs):
    root, _, _ = runs
    for strategy in ("zero1", "fsdp"):
        shards = [torch.load(root / strategy / "full" / "step-000002" / f"rank{r}.pt", weights_only=True)
                  for r in range(2)]
        assert [s["optimizer"]["rank"] for s in shards if strategy == "zero1"] in ([0, 1], [])
        first = [v for k, v in shards[0]["model"].items() if k.endswith("weight_shard")]
        assert (strategy == "fsdp") == bool(first)  # FSDP's file holds this rank's weight shards


def test_the_command_line_resumes_with_nproc_2(runs, tmp_path):
    root, ranks, _ = runs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "llmarch.train", "--nproc", "2",
               *_argv("zero1", tmp_path, "--resume", str(root / "zero1" / "full" / "step-000002"))]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "losses.csv") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    assert losses == [row["loss"] for row in ranks[0]["zero1"][0][2:]]
