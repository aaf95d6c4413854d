"""The measurements of the chapter "Training at scale": a worked run with DDP and FSDP on 2 CPU processes
against one process, the cost of gloo's collectives for 2 and 4 processes, gloo's all-reduce from 1 KiB to
64 MiB for the alpha-beta model, and this machine's matmul throughput for the MFU of the run.

Book: Training at scale. Regenerate with ``make experiments`` (a few CPU-minutes on a 2-core machine).
Loss curves are deterministic; timings depend on the machine and its load.

Writes, under ``book/data/``:

- ``training_at_scale_curves.csv``: strategy, processes, step, lr, loss (the mean over ranks), grad_norm;
- ``training_at_scale_collectives.csv``: op (all_reduce, reduce_scatter, all_gather), world_size, bytes
  (of the full tensor), seconds (the fastest of the repetitions: the machine is shared, and the fastest
  run is the one least disturbed);
- ``training_at_scale_alpha_beta.csv``: machine, date, world_size (2), bytes, repeat, seconds: every timed
  all-reduce (``ALPHA_BETA_REPS`` per size after one warm-up), for the fit of ``alpha`` and ``beta`` in the book;
- ``training_at_scale.json``: the run's configuration, parameters, time of the steps (rank 0's, without process
  start-up) and tokens per second of each strategy, the measured float32 matmul rate of one core, the machine
  and the date.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist

from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.parallel import run_distributed
from llmarch.train.launch import parse_args, train_gpt

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# The material's recipe (B, T, C) = (64, 512, 768), Adam with a cosine schedule, teacher forcing, scaled
# down by 4 in B, 8 in T and 12 in C to fit two CPU cores.
RUN = ["--steps", "150", "--warmup", "15", "--global-batch", "16", "--context", "64", "--d-model", "64",
       "--layers", "2", "--heads", "4", "--max-lr", "3e-3", "--min-lr", "3e-4", "--tokens", "300000"]
SIZES = [2**k for k in (16, 18, 20, 22)]  # float32 elements: 256 KiB .. 16 MiB
REPS = 10
ALPHA_BETA_SIZES = [2**k for k in range(10, 27, 2)]  # bytes: 1 KiB, 4 KiB, .., 64 MiB
ALPHA_BETA_REPS = 20


def machine() -> str:
    """The CPU model, its core count and the torch version, for the CSV rows."""
    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__} gloo"


def measure_collectives(rank: int, world_size: int) -> list[dict]:
    """Fastest time of each collective on tensors of ``SIZES`` elements (whole-tensor bytes)."""
    rows = []
    for n in SIZES:
        full = torch.ones(n)
        shard = torch.empty(n // world_size)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
               "all_gather": lambda: dist.all_gather_single(full, shard)}
        for name, op in ops.items():
            op()  # warm-up: connections and buffers
            times = []
            for _ in range(REPS):
                dist.barrier()
                start = time.perf_counter()
                op()
                times.append(time.perf_counter() - start)
            rows.append({"op": name, "world_size": world_size, "bytes": 4 * n, "seconds": min(times)})
    return rows


def measure_all_reduce(rank: int, world_size: int) -> list[dict]:
    """Every timed all-reduce of ``ALPHA_BETA_SIZES`` bytes (float32), ``ALPHA_BETA_REPS`` per size."""
    rows = []
    for n_bytes in ALPHA_BETA_SIZES:
        tensor = torch.ones(n_bytes // 4)
        dist.all_reduce(tensor)  # warm-up: connections and buffers
        for repeat in range(ALPHA_BETA_REPS):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            rows.append({"world_size": world_size, "bytes": n_bytes, "repeat": repeat,
                         "seconds": time.perf_counter() - start})
    return rows


def matmul_flops_per_second(n: int = 512, reps: int = 10) -> float:
    """float32 FLOP/s of an ``n x n`` matmul on one thread (2 n^3 FLOPs each), the best of ``reps``."""
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "runs", "collectives", "alpha_beta"), default="all")
    part = parser.parse_args().part
    DATA_DIR.mkdir(exist_ok=True)
    if part in ("all", "runs"):
        write_runs()
    if part in ("all", "collectives"):
        write_collectives()
    if part in ("all", "alpha_beta"):
        write_alpha_beta()
    print(f"wrote {DATA_DIR}/training_at_scale*")


def write_runs() -> None:
    """The worked run three times; ``training_at_scale_curves.csv`` and ``training_at_scale.json``."""
    summary = {"run": RUN, "runs": {}}
    curves = []
    for strategy, nproc in [("none", 1), ("ddp", 2), ("fsdp", 2)]:
        args = parse_args([*RUN, "--strategy", strategy])
        if strategy == "none":
            torch.set_num_threads(1)
            curve = train_gpt(0, 1, args)
        else:
            curve = run_distributed(train_gpt, nproc, args)[0]
        seconds = sum(row["seconds"] for row in curve)  # the steps only: no process start-up or set-up
        tokens = args.steps * args.global_batch * args.context
        summary["runs"][strategy] = {"processes": nproc, "seconds": seconds, "tokens_per_second": tokens / seconds}
        curves += [{"strategy": strategy, "processes": nproc, **row} for row in curve]
        print(f"{strategy}: final loss {curve[-1]['loss']:.4f} in {seconds:.1f} s")
    config = parse_args(RUN)
    model = GPT(GPTConfig(vocab_size=36, context_length=config.context, d_model=config.d_model,
                          n_layers=config.layers, n_heads=config.heads))
    summary["parameters"] = count_parameters(model)
    summary["matmul_flops_per_second_one_core"] = matmul_flops_per_second()
    summary["machine"], summary["date"] = machine(), datetime.date.today().isoformat()
    _write_csv("training_at_scale_curves.csv", curves)
    (DATA_DIR / "training_at_scale.json").write_text(json.dumps(summary, indent=2) + "\n")


def write_collectives() -> None:
    """``training_at_scale_collectives.csv``: rank 0's timings with 2 and 4 processes."""
    _write_csv("training_at_scale_collectives.csv",
               [row for n in (2, 4) for row in run_distributed(measure_collectives, n)[0]])


def write_alpha_beta() -> None:
    """``training_at_scale_alpha_beta.csv``: rank 0's all-reduce timings with 2 processes."""
    stamp = {"machine": machine(), "date": datetime.date.today().isoformat()}
    _write_csv("training_at_scale_alpha_beta.csv",
               [{**stamp, **row} for row in run_distributed(measure_all_reduce, 2)[0]])


def _write_csv(name: str, rows: list[dict]) -> None:
    with open(DATA_DIR / name, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
