"""The ring collectives simulated on arrays: ``N`` ranks in a ring, each vector cut into ``N`` chunks.

Book: Training at scale, "Collectives" (and problem set ps10-parallel).

Row ``r`` of a ``(N, n)`` array (or of ``N`` equal-length lists) is rank ``r``'s buffer; chunk ``c`` is
``np.array_split``'s ``c``-th piece of ``range(n)`` (:func:`chunk_slices`). In every step each rank sends one
chunk to its right neighbour ``(r + 1) % N``, all ranks at once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["chunk_slices", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce", "ring_bytes_sent"]


def chunk_slices(n: int, world_size: int) -> list[slice]:
    """The ``world_size`` chunks of ``range(n)`` as slices, the first ``n % world_size`` one longer."""
    bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), world_size)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _ring_steps(buffers: np.ndarray, chunk_of, combine) -> np.ndarray:
    out = np.array(buffers, dtype=float)  # an array or nested lists; a copy either way
    if out.ndim != 2:
        raise ValueError(f"buffers must have shape (N, n) (one row per rank), got {out.shape}")
    world_size = out.shape[0]
    slices = chunk_slices(out.shape[1], world_size)
    for step in range(world_size - 1):
        sent = [(r, chunk_of(r, step) % world_size) for r in range(world_size)]
        payloads = [out[r, slices[c]].copy() for r, c in sent]  # everyone sends before anyone receives
        for (r, c), payload in zip(sent, payloads):
            combine(out[(r + 1) % world_size], slices[c], payload)
    return out


def _add(row, where, payload):
    row[where] += payload


def _overwrite(row, where, payload):
    row[where] = payload


def ring_reduce_scatter(buffers: np.ndarray) -> np.ndarray:
    """Reduce-scatter: in step ``s = 0 .. N-2`` rank ``r`` sends chunk ``(r - s) % N`` to rank ``r + 1``, which
    adds it to its own. Afterwards rank ``r`` holds the sum over all ranks of chunk ``(r + 1) % N`` (its other
    chunks hold partial sums). ``(N, n) -> (N, n)``.

    >>> ring_reduce_scatter(np.array([[1., 2.], [10., 20.]])).tolist()
    [[1.0, 22.0], [11.0, 20.0]]
    """
    return _ring_steps(buffers, lambda r, s: r - s, _add)


def ring_all_gather(buffers: np.ndarray) -> np.ndarray:
    """All-gather after :func:`ring_reduce_scatter`: rank ``r`` owns chunk ``(r + 1) % N``; in step ``s`` it sends
    chunk ``(r + 1 - s) % N`` to rank ``r + 1``, which overwrites its copy. Afterwards every rank holds every
    owner's chunk. ``(N, n) -> (N, n)``."""
    return _ring_steps(buffers, lambda r, s: r + 1 - s, _overwrite)


def ring_all_reduce(buffers: np.ndarray) -> np.ndarray:
    """All-reduce = reduce-scatter then all-gather: every row becomes the sum of the rows."""
    return ring_all_gather(ring_reduce_scatter(buffers))


def ring_bytes_sent(n_bytes: float, world_size: int, op: str) -> float:
    """Bytes each rank sends for a message of ``n_bytes``: ``(N - 1) / N * n_bytes`` for ``reduce_scatter`` and
    ``all_gather`` (``N - 1`` steps of one chunk), twice that for ``all_reduce``."""
    if op not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(f"op must be 'all_reduce', 'reduce_scatter' or 'all_gather', got {op!r}")
    one_pass = (world_size - 1) / world_size * n_bytes
    return 2 * one_pass if op == "all_reduce" else one_pass
