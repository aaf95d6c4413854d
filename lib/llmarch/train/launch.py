"""``python -m llmarch.train``: train the course's GPT on one process or several, with any strategy.

Book: Training at scale, "A worked run".

- no arguments: retrain the tiny pretrained GPT and overwrite its committed checkpoint (``make experiments``);
- ``--nproc N --strategy {none,ddp,zero1,fsdp}``: start ``N`` local processes (gloo on CPU, NCCL on GPU)
  and train a GPT on the synthetic corpus (or ``--data FILE``, a raw uint16 token file read with
  ``np.memmap``), printing and writing the loss curve (``--out DIR/losses.csv``);
- under ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) the processes are torchrun's, so the same
  command runs on several machines: on each of ``M`` nodes,
  ``torchrun --nnodes M --nproc-per-node G --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:29500
  -m llmarch.train --strategy fsdp ...``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.model import GPT, GPTConfig
from llmarch.optim import AdamW, cosine_schedule
from llmarch.parallel import DDP, FSDP, ShardedOptimizer, run_distributed
from llmarch.train.loop import write_tiny_gpt_checkpoint
from llmarch.train.precision import LossScaler
from llmarch.train.stack import MemmapBatches, save_checkpoint, train_step, weight_decay_groups, write_token_file

__all__ = ["parse_args", "train_gpt", "main"]

STRATEGIES = ("none", "ddp", "zero1", "fsdp")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options of ``python -m llmarch.train`` (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m llmarch.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=1, help="local processes (ignored under torchrun)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="none")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per step, all ranks together")
    parser.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation per step")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-lr", type=float, default=3e-3)
    parser.add_argument("--min-lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--tokens", type=int, default=200_000, help="synthetic corpus size without --data")
    parser.add_argument("--data", type=Path, help="raw uint16 token file (write_token_file)")
    parser.add_argument("--vocab-size", type=int, help="vocabulary of --data (default: the synthetic one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="directory for losses.csv, tokens.bin and checkpoint.pt")
    args = parser.parse_args(argv)
    if args.global_batch % args.micro_batches:
        parser.error(f"--global-batch {args.global_batch} is not divisible by --micro-batches {args.micro_batches}")
    if not 0 <= args.warmup <= args.steps:
        parser.error(f"--warmup {args.warmup} must lie in [0, --steps {args.steps}]")
    if args.data is not None and args.vocab_size is None:
        parser.error("--data needs --vocab-size")
    return args


def _token_file(args: argparse.Namespace) -> tuple[Path, int]:
    if args.data is not None:
        return args.data, args.vocab_size
    out = args.out or Path(os.environ.get("TMPDIR", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"synthetic-{args.tokens}-{args.seed}.bin"
    if not path.exists():  # every rank may get here: write under a private name, then rename atomically
        private = path.with_suffix(f".{os.getpid()}.tmp")
        write_token_file(private, synthetic_corpus(args.tokens, seed=args.seed).numpy())
        os.replace(private, path)
    return path, default_grammar().vocab_size


def train_gpt(rank: int, world_size: int, args: argparse.Namespace) -> list[dict]:
    """Train a GPT with ``args`` on this rank (inside a process group unless ``strategy`` is ``none``) and
    return the curve: per step ``step``, ``lr``, ``loss`` (mean over all ranks) and ``grad_norm``."""
    path, vocab_size = _token_file(args)
    if args.global_batch % (world_size * args.micro_batches):
        raise ValueError(f"--global-batch {args.global_batch} must split into {world_size} ranks x "
                         f"{args.micro_batches} micro-batches")
    batches = MemmapBatches(path, args.global_batch, args.context, seed=args.seed, rank=rank, world_size=world_size)
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, context_length=args.context, d_model=args.d_model,
                          n_layers=args.layers, n_heads=args.heads))
    groups = weight_decay_groups(model, args.weight_decay)
    if args.strategy == "fsdp":  # a shard "x.weight_shard" replaces "x.weight" and keeps its group
        decayed = set(groups[0]["names"])
        model = FSDP(model, compute_dtype={"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision])
        named = [(n.removeprefix("module.").replace(".weight_shard", ".weight"), p)
                 for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": args.weight_decay},
                  {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    elif args.strategy in ("ddp", "zero1"):
        model = DDP(model)
    optimizer = (ShardedOptimizer(groups, AdamW, lr=args.max_lr, betas=(0.9, 0.95)) if args.strategy == "zero1"
                 else AdamW(groups, lr=args.max_lr, betas=(0.9, 0.95)))
    scaler = LossScaler() if args.precision == "fp16" else None
    precision = "fp32" if args.strategy == "fsdp" else args.precision  # FSDP casts itself
    curve = []
    for step in range(args.steps):
        lr = cosine_schedule(step, args.max_lr, args.min_lr, args.warmup, args.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = next(batches)
        result = train_step(model, optimizer, list(zip(x.chunk(args.micro_batches), y.chunk(args.micro_batches))),
                            precision=precision, scaler=scaler)
        loss = torch.tensor(result.loss)
        if world_size > 1:
            dist.all_reduce(loss)
            loss /= world_size
        curve.append({"step": step, "lr": lr, "loss": loss.item(), "grad_norm": result.grad_norm})
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:5d}  lr {lr:.2e}  loss {loss.item():.4f}  grad norm {result.grad_norm:.3f}")
    if rank == 0 and args.out is not None and args.strategy in ("none", "ddp"):
        save_checkpoint(args.out / "checkpoint.pt", model, optimizer, args.steps, batches=batches.state_dict())
    return curve


def _write_curve(curve: list[dict], out: Path | None) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "losses.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    print(f"wrote {out / 'losses.csv'}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m llmarch.train`` (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        write_tiny_gpt_checkpoint()
        return
    args = parse_args(argv)
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        try:
            curve = train_gpt(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) == 0:
            _write_curve(curve, args.out)
        return
    if args.nproc < 1:
        raise SystemExit(f"--nproc must be >= 1, got {args.nproc}")
    if args.strategy == "none" and args.nproc > 1:
        raise SystemExit("--nproc > 1 needs a strategy: --strategy ddp, zero1 or fsdp")
    if args.strategy == "none":
        curve = train_gpt(0, 1, args)
    else:
        curve = run_distributed(train_gpt, args.nproc, args, threads=max(1, (os.cpu_count() or 1) // args.nproc))[0]
    _write_curve(curve, args.out)
