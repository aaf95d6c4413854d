"""``python -m llmarch.train``: train the course's GPT on one process or several, with any strategy, on CPUs
or GPUs.

Book: Training at scale, "A worked run".

- no arguments: retrain the tiny pretrained GPT and overwrite its committed checkpoint (``make experiments``);
- ``--nproc N --strategy {none,ddp,zero1,fsdp}``: start ``N`` local processes and train a GPT on the
  synthetic corpus (or ``--data FILE``, a raw uint16 token file read with ``np.memmap``), printing and
  writing the loss curve (``--out DIR/losses.csv``). With CUDA and at least ``N`` GPUs (``--device auto``)
  the ranks use NCCL, rank ``r`` on GPU ``r``; otherwise gloo on the CPU (``--device cpu`` forces it);
- under ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) the processes are torchrun's, so the same
  command runs on several machines: on each of ``M`` nodes,
  ``torchrun --nnodes M --nproc-per-node G --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:29500
  -m llmarch.train --strategy fsdp ...``; each process takes GPU ``LOCAL_RANK`` (``torch.cuda.set_device``)
  and NCCL when CUDA is there, and its model, batches and every collective buffer live on that GPU.

Checkpoints: ``--checkpoint-every K`` (and the end of a run with ``--out``) writes ``DIR/step-SSSSSS/``
holding ``rank0.pt`` for ``none`` and ``ddp`` (the replicated model and optimiser) or ``rank{r}.pt`` per rank
for ``zero1`` and ``fsdp`` (each rank's shard of the optimiser state, and FSDP's weight shards: one file per
rank, resumed on the same number of ranks). ``--resume DIR/step-SSSSSS`` continues from there, bit for bit
the run that was not interrupted: model, optimiser, loss scaler, data position and RNG states are restored.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.model import GPT, GPTConfig
from llmarch.optim import AdamW, cosine_schedule
from llmarch.parallel import DDP, FSDP, ShardedOptimizer, run_distributed
from llmarch.train.loop import write_tiny_gpt_checkpoint
from llmarch.train.precision import LossScaler
from llmarch.train.stack import (
    MemmapBatches,
    load_checkpoint,
    save_checkpoint,
    train_step,
    weight_decay_groups,
    write_token_file,
)

__all__ = ["parse_args", "train_gpt", "choose_backend", "threads_per_process", "main"]

STRATEGIES = ("none", "ddp", "zero1", "fsdp")
SHARDED = ("zero1", "fsdp")  # one checkpoint file per rank


def _steps(text: str) -> frozenset[int]:
    return frozenset(int(s) for s in text.split(",") if s)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options of ``python -m llmarch.train`` (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m llmarch.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=1, help="local processes (ignored under torchrun)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="none")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CUDA (NCCL) when there is a GPU per process, else the CPU (gloo)")
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
    parser.add_argument("--out", type=Path, help="directory for losses.csv, tokens.bin and the checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                        help="write a checkpoint every K steps into --out (0: at the end only)")
    parser.add_argument("--resume", type=Path, metavar="DIR", help="a checkpoint directory (--out/step-SSSSSS)")
    parser.add_argument("--inject-overflow", type=_steps, default=frozenset(), metavar="S1,S2",
                        help="fault injection: the last rank's logits become infinite at these steps")
    args = parser.parse_args(argv)
    if args.global_batch % args.micro_batches:
        parser.error(f"--global-batch {args.global_batch} is not divisible by --micro-batches {args.micro_batches}")
    if not 0 <= args.warmup <= args.steps:
        parser.error(f"--warmup {args.warmup} must lie in [0, --steps {args.steps}]")
    if args.data is not None and args.vocab_size is None:
        parser.error("--data needs --vocab-size")
    if args.checkpoint_every < 0 or (args.checkpoint_every and args.out is None):
        parser.error("--checkpoint-every K needs K >= 0 and --out")
    return args


def choose_backend(device: str, processes_per_node: int) -> str:
    """``"nccl"`` when the ranks will run on GPUs (``device`` ``cuda``, or ``auto`` with CUDA and at least one
    GPU per local process), else ``"gloo"`` (the CPU)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" and gpus < processes_per_node:
        raise SystemExit(f"--device cuda needs a GPU per process: {processes_per_node} processes, {gpus} GPU(s)")
    return "nccl" if device == "cuda" or (device == "auto" and gpus >= processes_per_node) else "gloo"


def threads_per_process(nproc: int) -> int:
    """CPU threads each of ``nproc`` local processes uses: the cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // nproc)


def _rank_device(args: argparse.Namespace) -> torch.device:
    """This rank's device: its GPU under NCCL (set by the launcher), the CPU under gloo; one process follows
    ``--device``."""
    if dist.is_initialized():
        on_gpu = dist.get_backend() == "nccl"
    else:
        on_gpu = choose_backend(args.device, 1) == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")


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


def _build(args: argparse.Namespace, vocab_size: int, device: torch.device):
    """The model (wrapped for the strategy), its optimiser and the loss scaler, on ``device``."""
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, context_length=args.context, d_model=args.d_model,
                          n_layers=args.layers, n_heads=args.heads)).to(device)
    groups = weight_decay_groups(model, args.weight_decay)
    if args.strategy == "fsdp":  # a shard "x.weight_shard" replaces "x.weight" and keeps its group
        decayed = set(groups[0]["names"])
        model = FSDP(model, compute_dtype={"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision])
        named = [(n.removeprefix("module.").replace(".weight_shard", ".weight"), p)
                 for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": args.weight_decay},
                  {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    elif args.strategy == "ddp":
        model = DDP(model)
    # ZeRO-1 runs on the bare model: its optimiser reduce-scatters the gradients and all-gathers the weights
    optimizer = (ShardedOptimizer(groups, AdamW, lr=args.max_lr, betas=(0.9, 0.95)) if args.strategy == "zero1"
                 else AdamW(groups, lr=args.max_lr, betas=(0.9, 0.95)))
    return model, optimizer, LossScaler() if args.precision == "fp16" else None


def _checkpoint_file(directory: Path, strategy: str, rank: int) -> Path:
    return directory / f"rank{rank if strategy in SHARDED else 0}.pt"


def train_gpt(rank: int, world_size: int, args: argparse.Namespace) -> list[dict]:
    """Train a GPT with ``args`` on this rank (inside a process group unless ``strategy`` is ``none``) and
    return the curve: per step ``step``, ``lr``, ``loss`` (mean over all ranks), ``grad_norm``, ``skipped``
    (why the step was skipped, ``""`` when taken) and ``seconds`` (the step's wall time on this rank: the
    process start-up, data set-up and checkpoints are not in it, so throughput and MFU are per step)."""
    path, vocab_size = _token_file(args)
    if args.global_batch % (world_size * args.micro_batches):
        raise ValueError(f"--global-batch {args.global_batch} must split into {world_size} ranks x "
                         f"{args.micro_batches} micro-batches")
    device = _rank_device(args)
    batches = MemmapBatches(path, args.global_batch, args.context, seed=args.seed, rank=rank, world_size=world_size)
    model, optimizer, scaler = _build(args, vocab_size, device)
    start = 0
    if args.resume is not None:
        extra = {}
        start = load_checkpoint(_checkpoint_file(args.resume, args.strategy, rank), model, optimizer, extra)
        if (extra.get("strategy"), extra.get("world_size")) != (args.strategy, world_size):
            raise ValueError(f"{args.resume} was written by --strategy {extra.get('strategy')} on "
                             f"{extra.get('world_size')} ranks, not {args.strategy} on {world_size}")
        batches.load_state_dict(extra["batches"])
        if scaler is not None:
            scaler.load_state_dict(extra["scaler"])
    precision = "fp32" if args.strategy == "fsdp" else args.precision  # FSDP casts itself
    poisoned = [False]  # --inject-overflow: the last rank's logits become infinite (a forward overflow)
    if rank == world_size - 1 and args.inject_overflow:
        getattr(model, "module", model).register_forward_hook(
            lambda module, inputs, logits: logits * math.inf if poisoned[0] else None)
    curve = []
    for step in range(start, args.steps):
        began = time.perf_counter()
        lr = cosine_schedule(step, args.max_lr, args.min_lr, args.warmup, args.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = (t.to(device) for t in next(batches))
        poisoned[0] = step in args.inject_overflow
        result = train_step(model, optimizer, list(zip(x.chunk(args.micro_batches), y.chunk(args.micro_batches))),
                            precision=precision, scaler=scaler)
        loss = torch.tensor(result.loss, device=device)
        if world_size > 1:
            dist.all_reduce(loss)
            loss /= world_size
        loss = loss.item()  # waits for the device: the step's time is complete
        curve.append({"step": step, "lr": lr, "loss": loss, "grad_norm": result.grad_norm,
                      "skipped": result.skipped, "seconds": time.perf_counter() - began})
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:5d}  lr {lr:.2e}  loss {loss:.4f}  grad norm {result.grad_norm:.3f}")
        done = step + 1
        if args.out is not None and (done == args.steps or args.checkpoint_every and done % args.checkpoint_every == 0):
            _save(args, rank, world_size, done, model, optimizer, scaler, batches)
    return curve


def _save(args, rank, world_size, step, model, optimizer, scaler, batches) -> None:
    directory = args.out / f"step-{step:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    if args.strategy in SHARDED or rank == 0:
        extra = {"scaler": scaler.state_dict()} if scaler is not None else {}
        save_checkpoint(_checkpoint_file(directory, args.strategy, rank), model, optimizer, step,
                        batches=batches.state_dict(), strategy=args.strategy, world_size=world_size, **extra)


def _write_curve(curve: list[dict], out: Path | None) -> None:
    if out is None or not curve:
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
        backend = choose_backend(args.device, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
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
        curve = run_distributed(train_gpt, args.nproc, args, backend=choose_backend(args.device, args.nproc),
                                threads=threads_per_process(args.nproc))[0]
    _write_curve(curve, args.out)
