"""The pieces of a training loop written from scratch: clipping, parameter groups, batches from a memory-mapped
token file, checkpoints that resume bit for bit, and one optimiser step with gradient accumulation, mixed
precision and a loss-spike guard.

Book: Training at scale, "A training stack from scratch".
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from llmarch._checks import check_int

__all__ = [
    "clip_grad_norm",
    "weight_decay_groups",
    "write_token_file",
    "MemmapBatches",
    "save_checkpoint",
    "load_checkpoint",
    "StepResult",
    "train_step",
]

log = logging.getLogger("llmarch.train")


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale every gradient by ``min(1, max_norm / (||g|| + 1e-6))``, where ``||g||`` is the L2 norm of all the
    gradients concatenated; returns ``||g||`` (before clipping) as a 0-d float tensor.

    Book: Training at scale, "A training stack from scratch".

    Same rule and return value as ``torch.nn.utils.clip_grad_norm_`` (the 1e-6 guards a zero norm), also
    when the norm is not finite (``error_if_nonfinite=False``): an infinite norm gives the coefficient 0
    (finite gradients become 0, infinite ones NaN), a NaN norm makes every gradient NaN. The caller skips
    such a step on the returned norm.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach(), 2.0) for g in grads]), 2.0)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(coefficient.to(g.dtype))
    return total


def _is_embedding_like(module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two optimiser parameter groups: ``decay`` (matrices of linear layers, with ``weight_decay``) and
    ``no_decay`` (biases, norm gains and shifts, embedding tables, weight 0). Each group carries the
    parameters' dotted ``names``; a tied weight appears once, under the name of its first owner.

    Book: Training at scale, "A training stack from scratch".

    Why: decay pulls weights towards 0. A norm gain of 0 silences a feature and an embedding row that
    is rarely seen would be shrunk at every step without a gradient to pull it back.
    """
    embedding_ids = {id(m.weight) for m in model.modules() if _is_embedding_like(m)}
    decay, no_decay, seen = ([], []), ([], []), set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        target = decay if p.dim() >= 2 and id(p) not in embedding_ids else no_decay
        target[0].append(name)
        target[1].append(p)
    return [
        {"name": "decay", "names": decay[0], "params": decay[1], "weight_decay": weight_decay},
        {"name": "no_decay", "names": no_decay[0], "params": no_decay[1], "weight_decay": 0.0},
    ]


def write_token_file(path: str | Path, ids, dtype=np.uint16) -> np.memmap:
    """Write token ids (any 1-d integer sequence) to a raw binary file and return it as a read-only
    ``np.memmap``. ``uint16`` holds vocabularies up to 65,536 (GPT-2's 50,257 fits)."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-d, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(dtype).max):
        raise ValueError(f"ids lie in [{ids.min()}, {ids.max()}], which {np.dtype(dtype).name} cannot hold")
    ids.astype(dtype).tofile(path)
    return np.memmap(path, dtype=dtype, mode="r")


class MemmapBatches:
    """Random windows of a token file too large for memory: batch ``i`` is ``global_batch`` windows of
    ``context_length + 1`` tokens whose starts come from ``np.random.default_rng([seed, i])``, so the
    batch depends on ``(seed, i)`` only; the data position is ``i``.

    Book: Training at scale, "A training stack from scratch".

    ``tokens`` is a path to a raw file of ``dtype`` ids (read with ``np.memmap``, nothing loaded up front) or
    an array. Rank ``r`` of ``world_size`` gets rows ``r*b .. (r+1)*b - 1`` of each global batch, with
    ``b = global_batch / world_size``: the ranks together see exactly the batch one process would see.
    ``next(batches)`` returns ``x, y`` of shape ``(b, context_length)`` (long), ``y`` shifted by one token.
    """

    def __init__(self, tokens, global_batch: int, context_length: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, dtype=np.uint16):
        check_int("global_batch", global_batch, low=1)
        check_int("context_length", context_length, low=1)
        check_int("world_size", world_size, low=1)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, {world_size}), got {rank}")
        if global_batch % world_size:
            raise ValueError(f"global_batch {global_batch} is not divisible by world_size {world_size}")
        if isinstance(tokens, (str, Path)):
            if not Path(tokens).exists():
                raise FileNotFoundError(f"token file {tokens} does not exist (write one with write_token_file)")
            tokens = np.memmap(tokens, dtype=dtype, mode="r")
        if np.ndim(tokens) != 1:
            raise ValueError(f"tokens must be 1-d, got shape {np.shape(tokens)}")
        if len(tokens) <= context_length:
            raise ValueError(f"{len(tokens)} tokens cannot hold a window of context_length + 1 = "
                             f"{context_length + 1}")
        self.tokens, self.global_batch, self.context_length = tokens, global_batch, context_length
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.position = 0

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` (this rank's rows), without moving the position."""
        starts = np.random.default_rng([self.seed, index]).integers(
            0, len(self.tokens) - self.context_length, size=self.global_batch)
        per_rank = self.global_batch // self.world_size
        mine = starts[self.rank * per_rank:(self.rank + 1) * per_rank]
        windows = np.stack([np.asarray(self.tokens[s:s + self.context_length + 1]) for s in mine])
        windows = torch.from_numpy(windows.astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batch(self.position)
        self.position += 1
        return x, y

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.seed = int(state["position"]), int(state["seed"])


def _rng_states() -> dict:
    """Every generator a step may draw from, as tensors and plain Python values (``weights_only`` loads them)."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position,
                                                        has_gauss, gauss], "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states:
        if not torch.cuda.is_available():
            raise RuntimeError("the checkpoint holds CUDA RNG states but CUDA is not available here")
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(path_or_file, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, **extra) -> None:
    """Save what a run needs to continue bit for bit: the model's and optimiser's state dicts, ``step``, the
    torch, numpy and Python RNG states (and every CUDA device's, once CUDA is in use), and ``extra`` (e.g. ``batches=batches.state_dict()``,
    ``scaler=scaler.state_dict()``). ``path_or_file``: a path or a binary file object.

    Book: Training at scale, "A training stack from scratch".
    """
    check_int("step", step)
    torch.save({"model": getattr(model, "module", model).state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, "rng": _rng_states(), "extra": extra}, path_or_file)


def load_checkpoint(path_or_file, model: nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict | None = None) -> int:
    """Restore a :func:`save_checkpoint` file into ``model`` and ``optimizer``, reset the RNG states, and
    return the step. When ``extra`` is a dict it receives the saved extras (e.g. the data position).

    Book: Training at scale, "A training stack from scratch".

    The file is read with ``weights_only=True`` (no arbitrary objects are unpickled): the RNG states are
    stored as tensors and plain values, so nothing needs allow-listing. Tensors are read onto the CPU;
    ``load_state_dict`` copies them to the model's and optimiser's devices.
    """
    if isinstance(path_or_file, (str, Path)) and not Path(path_or_file).exists():
        raise FileNotFoundError(f"checkpoint {path_or_file} does not exist")
    state = torch.load(path_or_file, map_location="cpu", weights_only=True)
    missing = {"model", "optimizer", "step", "rng"} - set(state)
    if missing:
        raise ValueError(f"{path_or_file} is not a checkpoint of save_checkpoint: it lacks {sorted(missing)}")
    getattr(model, "module", model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_states(state["rng"])
    if extra is not None:
        extra.update(state["extra"])
    return int(state["step"])


def _any_rank(flag: bool, device: torch.device) -> bool:
    """``flag`` or-ed over the ranks of the default process group."""
    value = torch.tensor(float(flag), device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


@dataclass
class StepResult:
    """What one optimiser step did: mean micro-batch ``loss``, global ``grad_norm`` before clipping, and
    ``skipped`` (``""`` when the step was taken, else why not: ``"non-finite loss"``,
    ``"non-finite grad norm"``, or ``"fp16 overflow"`` when the loss scaler backed off)."""

    loss: float
    grad_norm: float
    skipped: str = ""


def _autocast(precision: str, device_type: str):
    if precision == "fp32":
        return nullcontext()
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"precision must be 'fp32', 'bf16' or 'fp16', got {precision!r}")
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, grad_clip: float | None = 1.0,
               precision: str = "fp32", scaler=None) -> StepResult:
    """One optimiser step on ``micro_batches`` (a list of ``(x, y)`` pairs): gradient accumulation of
    ``L = (1/M) sum_m L_m`` over the ``M`` micro-batches, which equals the step on their concatenation when
    they have the same size. Master weights stay float32; ``precision`` ``bf16`` or ``fp16`` runs the
    forward under autocast (``fp16`` needs a ``scaler``: :class:`llmarch.train.LossScaler`).

    Book: Training at scale, "A training stack from scratch" and "Mixed precision".

    A model or optimiser with ``finish_gradient_synchronization`` (``llmarch.parallel``: DDP, FSDP,
    ZeRO-1) is synchronised before the step, and one with ``clip_grad_norm`` (sharded gradients) clips
    itself. The loss-spike guard: a step whose loss or gradient norm is not finite is skipped, its gradients
    dropped, and a warning is logged on the ``llmarch.train`` logger; the returned :class:`StepResult` says
    why. With a ``scaler`` the step always completes the scaler's cycle (``unscale_``, ``step``, ``update``):
    an overflow, in the gradients or a loss that is not finite, backs the scale off. Under a distributed
    wrapper every rank takes the same decision: the overflow flag and a loss that is not finite on one rank
    are all-reduced, so no rank steps (or waits in the optimiser's collectives) alone.
    """
    if not micro_batches:
        raise ValueError("micro_batches is empty: give at least one (x, y) pair")
    if precision == "fp16" and scaler is None:
        raise ValueError("precision 'fp16' needs a loss scaler (llmarch.train.LossScaler): fp16 gradients "
                         "underflow without one")
    device_type = next(model.parameters()).device.type
    total = 0.0
    for index, (x, y) in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        # a data-parallel wrapper communicates once, after the last micro-batch
        with nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            with _autocast(precision, device_type):
                logits = model(x)
            if logits.dtype in (torch.float16, torch.bfloat16):  # the loss in fp32: 16 bits lose digits
                logits = logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) / len(micro_batches)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.item()
    distributed = [w for w in (model, optimizer) if hasattr(w, "finish_gradient_synchronization")]
    for wrapper in distributed:  # DDP and FSDP average in the model, ZeRO-1 reduce-scatters in the optimiser
        wrapper.finish_gradient_synchronization()
    bad_loss = not math.isfinite(total)
    if scaler is not None:
        scaler.unscale_(optimizer, found_inf=bad_loss)  # agreed by every rank
    elif distributed:
        bad_loss = _any_rank(bad_loss, next(model.parameters()).device)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clip = (getattr(model, "clip_grad_norm", None) or getattr(optimizer, "clip_grad_norm", None)
            or (lambda max_norm: clip_grad_norm(params, max_norm)))
    grad_norm = float(clip(grad_clip if grad_clip else math.inf))
    skipped = ""
    if scaler is not None:  # the scaler's cycle is completed on every step, a skipped one too
        if not scaler.step(optimizer):
            skipped = "non-finite loss" if bad_loss else "fp16 overflow"
        scaler.update()
    else:
        skipped = "non-finite loss" if bad_loss else "" if math.isfinite(grad_norm) else "non-finite grad norm"
        if not skipped:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if skipped:
        log.warning("step skipped (%s): loss %s, grad norm %s", skipped, total, grad_norm)
    return StepResult(total, grad_norm, skipped)
