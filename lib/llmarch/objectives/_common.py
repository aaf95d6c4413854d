"""Shared by the objectives: the ignored label, and the checks of their arguments (each names the argument
and what is wrong with it).
"""

from __future__ import annotations

import math
import numbers

import torch

from llmarch._checks import check_tensor, shape_str


IGNORE_INDEX = -100
"""The label of a position that is not predicted (``ignore_index`` of ``torch.nn.functional.cross_entropy``)."""


# ----------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------

def _check_ids(name: str, ids, vocab_size: int | None = None, dims: int | None = None) -> None:
    check_tensor(name, ids, dims=dims, min_dim=1 if dims is None else None)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"{name} holds a negative token id ({int(ids.min())})")
    if vocab_size is not None and ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(f"{name} holds token id {int(ids.max())}, outside the vocabulary [0, {vocab_size})")


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_probability(name: str, p) -> float:
    if not _is_number(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    return float(p)


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low or \
            (high is not None and value >= high):
        bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return int(value)


def _check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def _check_special_mask(special_mask, ids) -> torch.Tensor:
    if special_mask is None:
        return torch.zeros_like(ids, dtype=torch.bool)
    check_tensor("special_mask", special_mask)
    if special_mask.dtype != torch.bool:
        raise ValueError(f"special_mask must be a boolean tensor (True = never selected), "
                         f"got dtype {special_mask.dtype}")
    if special_mask.shape != ids.shape:
        raise ValueError(f"special_mask has shape {shape_str(special_mask.shape)} but ids has shape "
                         f"{shape_str(ids.shape)}: they must match")
    return special_mask


def _ceil_budget(fraction: float, n: int) -> int:
    """``ceil(fraction * n)`` without the floating-point excess that turns ``0.15 * 20`` into 4 tokens."""
    return math.ceil(fraction * n - 1e-9)


def _runs(flags: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of every maximal run of True in a 1-D bool tensor."""
    padded = torch.cat([torch.zeros(1, dtype=torch.int8), flags.to(torch.int8), torch.zeros(1, dtype=torch.int8)])
    edges = torch.diff(padded)
    return list(zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()))
