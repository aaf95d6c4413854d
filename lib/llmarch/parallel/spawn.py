"""Run a function on ``N`` local processes joined in a ``torch.distributed`` process group (gloo on
loopback, or NCCL with a GPU per process), and collect what each returns: how the tests and the book's
experiments use several processes without ``torchrun``.

Book: Training at scale, "Collectives".
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_distributed"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world_size, port, backend, threads, out_dir, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    if backend == "nccl":  # local rank r on GPU r
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def run_distributed(fn, world_size: int, *args, backend: str = "gloo", threads: int = 1) -> list:
    """Start ``world_size`` processes (``torch.multiprocessing.spawn``), each calling
    ``fn(rank, world_size, *args)`` inside an initialised process group, and return their results in rank
    order. ``fn`` must be importable (a module-level function) and its result picklable. An exception in
    any rank is raised here with that rank's traceback (the other ranks are stopped). ``backend="nccl"``
    puts rank ``r`` on GPU ``r`` (``torch.cuda.set_device``) before the group is made."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_entry, args=(fn, world_size, free_port(), backend, threads, out_dir, args), nprocs=world_size)
        return [pickle.loads(Path(out_dir, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
