"""Trusted checks of ps12-flash (capstone: FlashAttention-2 in Triton, forward and backward kernels).

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps12-flash/ps12-flash.ipynb``. The
functions the checks call are the read-only wrappers of the notebook's "grader-calls" cell: they cast the arrays
``(B, H, T, 16)`` to float32 and launch the student's kernels, in triton's interpreter in the sandbox (the
notebook sets ``TRITON_INTERPRET=1`` when there is no GPU) with the tile sizes of the case. References, in
float64: ``torch.nn.functional.scaled_dot_product_attention`` for the output and its autograd gradients, and
``torch.logsumexp`` of the scaled scores for the log-sum-exp. The kernels compute in float32 from inputs rounded
to float32, hence the tolerances (``rtol=1e-4, atol=1e-5``; the errors of a correct kernel are about 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks import Case, Check

NOTEBOOK = "ps12-flash.ipynb"
TRUSTED_CALLABLES: dict = {}
GPU_BENCHMARK = True  # where the grader has CUDA, the feedback adds the kernels' TFLOP/s (gpu_benchmark.py)
D_HEAD = 16  # the smallest head dimension tl.dot takes
TILES = ((16, 16), (32, 16), (16, 32))  # (block_m, block_n): equal, more queries, more keys
RTOL, ATOL = 1e-4, 1e-5


def _t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


def _scores(q, k, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return s


# --- references ---------------------------------------------------------------------------------------------


@torch.no_grad()
def ref_output(q, k, v, block_m, block_n):
    return F.scaled_dot_product_attention(_t(q), _t(k), _t(v)).numpy()


@torch.no_grad()
def ref_lse(q, k, v, block_m, block_n):
    return torch.logsumexp(_scores(_t(q), _t(k), False), dim=-1).numpy()


@torch.no_grad()
def ref_causal(q, k, v, block_m, block_n):
    out = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=True)
    return out.numpy(), torch.logsumexp(_scores(_t(q), _t(k), True), dim=-1).numpy()


def _gradients(q, k, v, d_out, is_causal):
    q, k, v = _t(q, True), _t(k, True), _t(v, True)
    F.scaled_dot_product_attention(q, k, v, is_causal=bool(is_causal)).backward(_t(d_out))
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def ref_dkdv(q, k, v, d_out, is_causal, block_m, block_n):
    return _gradients(q, k, v, d_out, is_causal)[1:]


def ref_dq(q, k, v, d_out, is_causal, block_m, block_n):
    return _gradients(q, k, v, d_out, is_causal)[0]


# --- fresh inputs -------------------------------------------------------------------------------------------

# Every `cases` function starts with deterministic edge cases (the same for every seed), built so that each known
# wrong variant of tests/test_wrong_variants_flash.py fails them every time; random cases come in addition. The
# shapes stay tiny: the interpreter runs each program in NumPy.


def rising(t: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (1, 1, t, 16) whose scores grow along the keys (key j scores 8 j / (t - 1) for every query): every
    tile of keys raises the running maximum, so a sum or accumulator that is not rescaled shows."""
    q = np.full((1, 1, t, D_HEAD), 0.25)
    k = np.broadcast_to(np.linspace(0.0, 8.0, t)[None, None, :, None], (1, 1, t, D_HEAD)).copy()
    return q, k, rng.normal(size=(1, 1, t, D_HEAD))


def _random_qkv(rng, n=3, t=None):
    b, h = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    t = int(rng.integers(17, 49)) if t is None else t
    return [rng.normal(size=(b, h, t, D_HEAD)) * float(rng.uniform(0.5, 2.0)) for _ in range(n)]


def _tiles(rng):
    return TILES[int(rng.integers(len(TILES)))]


def _tile_note(tiles):
    return f"tiles of {tiles[0]} queries and {tiles[1]} keys"


def _forward(rng):
    fixed = [Case((*rising(40, rng), *tiles), note=f"scores rising along the keys, {_tile_note(tiles)}")
             for tiles in TILES]
    return fixed + [Case((*_random_qkv(rng, t=37), 16, 16), note="37 tokens: a partial last tile"),
                    Case((*_random_qkv(rng), *_tiles(rng)), note="random q, k, v and tiles"),
                    Case((*_random_qkv(rng, t=int(rng.integers(1, 16))), 16, 16), note="fewer tokens than one tile")]


def _causal(rng):
    fixed = [Case((*_random_qkv(rng, t=45), *tiles), note=f"45 tokens, {_tile_note(tiles)}") for tiles in TILES] + [
        Case((*rising(40, rng), 16, 32), note="scores rising along the keys, tiles of 16 queries and 32 keys")]
    return fixed + [Case((*_random_qkv(rng), *_tiles(rng)), note="random q, k, v and tiles")]


def _backward(rng):
    fixed = [Case((*_random_qkv(rng, n=4, t=37), causal, *tiles),
                  note=f"37 tokens, {'causal' if causal else 'not causal'}, {_tile_note(tiles)}")
             for causal in (False, True) for tiles in TILES]
    return fixed + [Case((*_random_qkv(rng, n=4), bool(rng.integers(2)), *_tiles(rng)),
                         note="random q, k, v, tiles and causality")]


CHECKS = {
    "test_forward": Check("flash_output", _forward, ref_output, rtol=RTOL, atol=ATOL,
                          depends_on=("flash_fwd_kernel",)),
    "test_forward_lse": Check("flash_lse", _forward, ref_lse, rtol=RTOL, atol=ATOL, depends_on=("flash_fwd_kernel",)),
    "test_causal": Check("flash_causal", _causal, ref_causal, rtol=RTOL, atol=ATOL, depends_on=("flash_fwd_kernel",)),
    "test_dkdv": Check("flash_dkdv", _backward, ref_dkdv, rtol=RTOL, atol=ATOL,
                       depends_on=("flash_bwd_dkdv_kernel",)),
    "test_dq": Check("flash_dq", _backward, ref_dq, rtol=RTOL, atol=ATOL, depends_on=("flash_bwd_dq_kernel",)),
}
