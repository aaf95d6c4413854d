"""Trusted checks of ps12-flash (capstone: FlashAttention-2 in Triton, forward and backward kernels).

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps12-flash/ps12-flash.ipynb``. The
functions the checks call are the read-only wrappers of the notebook's "grader-calls" cell: they cast the arrays
``(B, H, T, d)`` to float32 and launch the student's kernels (the launchers refuse anything but a Triton kernel),
in triton's interpreter in the sandbox (the notebook sets ``TRITON_INTERPRET=1`` when there is no GPU) with the
tile sizes of the case. References, in float64: ``torch.nn.functional.scaled_dot_product_attention`` for the
output and its autograd gradients, and ``torch.logsumexp`` of the scaled scores for the log-sum-exp. The inputs
are float32 values (stored as float64), so kernel and reference see the same numbers; the kernels compute in
float32, hence the tolerances (``rtol=1e-4, atol=1e-5``; the errors of a correct kernel are about 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from autograder.checks import Case, Check, FailureClass

NOTEBOOK = "ps12-flash.ipynb"
TRUSTED_CALLABLES: dict = {}
GPU_BENCHMARK = True  # where the grader has CUDA, the feedback adds the kernels' TFLOP/s (gpu_benchmark.py)
HEAD_SIZES = (16, 32, 64)  # the text: D is a power of two >= 16 (the smallest tl.dot takes); the tests use these
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

# Every `cases` function starts with deterministic edge cases (the same shapes and kinds for every seed), built
# so that each failure class of FAILURE_CLASSES, and each known wrong variant of tests/test_wrong_variants_flash.py,
# fails them every time; random cases come in addition. The shapes stay tiny: the interpreter runs each program in
# NumPy, one after another.


def _f32(x) -> np.ndarray:
    """``x`` rounded to float32, kept as float64: the numbers the kernels see, so the references see them too."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def rising(t: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v (1, 1, t, 16) whose scores grow along the keys (key j scores 8 j / (t - 1) for every query): every
    tile of keys raises the running maximum, so a sum or accumulator that is not rescaled shows."""
    q = np.full((1, 1, t, 16), 0.25)
    k = _f32(np.broadcast_to(np.linspace(0.0, 8.0, t)[None, None, :, None], (1, 1, t, 16)))
    return q, k, _f32(rng.normal(size=(1, 1, t, 16)))


def far(t: int, sign: int, rng, n: int = 3) -> list[np.ndarray]:
    """q, k (1, 1, t, 16) of multiples of 1/8 within 1/4 of 5 (sign 1) or 43/8 (sign -1), q times ``sign``: every
    score q.k / 4 lies in [90.25, 110.25] or [-126.6, -105.1], exact in float32, where e^S overflows (above 88.8) or
    is 0 (below -104) unless the running maximum is subtracted first. Then ``n - 2`` random arrays of size 1/8 (v;
    dO): at such scores float32 moves P by up to about 1e-5 of itself in any correct kernel (the rounding of a
    score, or of the log-sum-exp that the backward's launchers pass), and the errors of the results scale with v
    and dO, so small ones keep them within the absolute tolerance."""
    centre = 5.0 if sign > 0 else 43 / 8
    q, k = (centre + rng.integers(-2, 3, size=(1, 1, t, 16)) / 8 for _ in range(2))
    return [sign * q, k] + [_f32(rng.normal(size=(1, 1, t, 16)) / 8) for _ in range(n - 2)]


def _random_qkv(rng, n=3, t=None, d=None, heads=None) -> list[np.ndarray]:
    """``n`` arrays (B, H, T, d) of float32 values: random B, H in 1..2, T in 17..48 and d unless given."""
    b, h = heads or (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    t = int(rng.integers(17, 49)) if t is None else t
    d = HEAD_SIZES[int(rng.integers(len(HEAD_SIZES)))] if d is None else d
    return [_f32(rng.normal(size=(b, h, t, d)) * float(rng.uniform(0.5, 2.0))) for _ in range(n)]


def _tiles(rng):
    return TILES[int(rng.integers(len(TILES)))]


def _tile_note(tiles):
    return f"tiles of {tiles[0]} queries and {tiles[1]} keys"


FAR_NOTES = {1: "every score between +90 and +111", -1: "every score between -127 and -105"}


def _forward(rng):
    fixed = [Case((*rising(40, rng), *tiles), note=f"scores rising along the keys, {_tile_note(tiles)}")
             for tiles in TILES]
    fixed += [Case((*_random_qkv(rng, t=37, d=16, heads=(1, 2)), 16, 16), note="37 tokens: a partial last tile"),
              Case((*_random_qkv(rng, t=24, d=32, heads=(1, 2)), 16, 32),
                   note=f"head size 32, 24 tokens, {_tile_note((16, 32))}"),
              Case((*_random_qkv(rng, t=21, d=64, heads=(1, 2)), 32, 16),
                   note=f"head size 64, 21 tokens, {_tile_note((32, 16))}"),
              Case((*far(24, 1, rng), 16, 16), note=f"{FAR_NOTES[1]}, 24 tokens, {_tile_note((16, 16))}"),
              Case((*far(24, -1, rng), 16, 32), note=f"{FAR_NOTES[-1]}, 24 tokens, {_tile_note((16, 32))}")]
    return fixed + [Case((*_random_qkv(rng), *_tiles(rng)), note="random q, k, v, head size and tiles"),
                    Case((*_random_qkv(rng, t=int(rng.integers(1, 16))), 16, 16), note="fewer tokens than one tile")]


def _causal(rng):
    fixed = [Case((*_random_qkv(rng, t=45, d=16, heads=(1, 2)), *tiles), note=f"45 tokens, {_tile_note(tiles)}")
             for tiles in TILES]
    fixed += [Case((*rising(40, rng), 16, 32), note=f"scores rising along the keys, {_tile_note((16, 32))}"),
              Case((*_random_qkv(rng, t=24, d=64, heads=(1, 2)), 16, 32),
                   note=f"head size 64, 24 tokens, {_tile_note((16, 32))}"),
              Case((*_random_qkv(rng, t=21, d=32, heads=(1, 2)), 32, 16),
                   note=f"head size 32, 21 tokens, {_tile_note((32, 16))}"),
              Case((*far(24, 1, rng), 32, 16), note=f"{FAR_NOTES[1]}, 24 tokens, {_tile_note((32, 16))}"),
              Case((*far(24, -1, rng), 16, 16), note=f"{FAR_NOTES[-1]}, 24 tokens, {_tile_note((16, 16))}")]
    return fixed + [Case((*_random_qkv(rng), *_tiles(rng)), note="random q, k, v, head size and tiles")]


def _causality(causal) -> str:
    return "causal" if causal else "not causal"


def _backward(rng):
    fixed = [Case((*_random_qkv(rng, n=4, t=37, d=16, heads=(1, 2)), causal, *tiles),
                  note=f"37 tokens, {_causality(causal)}, {_tile_note(tiles)}")
             for causal in (False, True) for tiles in TILES]
    sizes = [(32, False, 21, (32, 16)), (64, True, 24, (16, 32))]
    fixed += [Case((*_random_qkv(rng, n=4, t=t, d=d, heads=(1, 2)), causal, *tiles),
                   note=f"head size {d}, {t} tokens, {_causality(causal)}, {_tile_note(tiles)}")
              for d, causal, t, tiles in sizes]
    fixed += [Case((*far(24, sign, rng, n=4), causal, *tiles),
                   note=f"{FAR_NOTES[sign]}, 24 tokens, {_causality(causal)}, {_tile_note(tiles)}")
              for sign, causal, tiles in [(1, False, (16, 32)), (-1, True, (32, 16))]]
    return fixed + [Case((*_random_qkv(rng, n=4), bool(rng.integers(2)), *_tiles(rng)),
                         note="random q, k, v, head size, tiles and causality")]


# depends_on names other checks' functions (grade.py compares it with the functions that fail): the causal output
# and the log-sum-exp come from the same forward kernel as the plain output, so its failure is named first. The
# backward's launchers compute the log-sum-exp themselves, so its checks depend on no other.
CHECKS = {
    "test_forward": Check("flash_output", _forward, ref_output, rtol=RTOL, atol=ATOL),
    "test_forward_lse": Check("flash_lse", _forward, ref_lse, rtol=RTOL, atol=ATOL, depends_on=("flash_output",)),
    "test_causal": Check("flash_causal", _causal, ref_causal, rtol=RTOL, atol=ATOL,
                         depends_on=("flash_output", "flash_lse")),
    "test_dkdv": Check("flash_dkdv", _backward, ref_dkdv, rtol=RTOL, atol=ATOL),
    "test_dq": Check("flash_dq", _backward, ref_dq, rtol=RTOL, atol=ATOL),
}


# --- failure classes ----------------------------------------------------------------------------------------


def _case_scores(case: Case) -> np.ndarray:
    """The scaled scores q k^T / sqrt(d) (B, H, T, T) of a case, all of them (the causal mask ignored)."""
    q, k = case.args[0], case.args[1]
    return q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])


def _shape(case: Case) -> dict:
    """T, d, the number of (batch, head) pairs, the tiles and (backward only) the causality of a case."""
    q, args = case.args[0], case.args
    return {"t": q.shape[2], "d": q.shape[3], "heads": q.shape[0] * q.shape[1], "bm": args[-2], "bn": args[-1],
            "causal": bool(args[4]) if len(args) == 7 else None}


def _rises(case: Case) -> bool:
    s, c = _case_scores(case), _shape(case)
    return c["t"] > c["bn"] and bool(np.all(np.diff(s, axis=-1) > 0))


SHARED_CLASSES = [  # (name, meets) for every check
    ("every score above +89 (e^S overflows float32)", lambda case: _case_scores(case).min() > 89),
    ("every score below -104 (e^S is 0 in float32)", lambda case: _case_scores(case).max() < -104),
    ("head size 32", lambda case: _shape(case)["d"] == 32),
    ("head size 64", lambda case: _shape(case)["d"] == 64),
    ("T above BLOCK_N and not a multiple of it (padding keys)",
     lambda case: (c := _shape(case))["t"] > c["bn"] and c["t"] % c["bn"] != 0),
    ("T above BLOCK_M and not a multiple of it (padding queries)",
     lambda case: (c := _shape(case))["t"] > c["bm"] and c["t"] % c["bm"] != 0),
    ("BLOCK_M > BLOCK_N", lambda case: (c := _shape(case))["bm"] > c["bn"]),
    ("BLOCK_M < BLOCK_N", lambda case: (c := _shape(case))["bm"] < c["bn"]),
    ("two (batch, head) pairs (the offset of a head)", lambda case: _shape(case)["heads"] > 1),
]
FORWARD_CLASSES = [
    ("scores rising along the keys (each key tile raises the running maximum)", _rises),
]
ONLY = {
    "test_forward": FORWARD_CLASSES + [("fewer tokens than one tile",
                                        lambda case: (c := _shape(case))["t"] < min(c["bm"], c["bn"]))],
    "test_causal": FORWARD_CLASSES,
    "test_dkdv": [("not causal", lambda case: _shape(case)["causal"] is False),
                  ("causal", lambda case: _shape(case)["causal"] is True),
                  ("causal, BLOCK_M > BLOCK_N", lambda case: (c := _shape(case))["causal"] and c["bm"] > c["bn"])],
}
ONLY["test_forward_lse"], ONLY["test_dq"] = ONLY["test_forward"], ONLY["test_dkdv"]

# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py). Each check has
# the shared classes and its own, named after its function ("flash_dq: head size 64").
FAILURE_CLASSES = [FailureClass(f"{check.function}: {name}", gid, meets)
                   for gid, check in CHECKS.items() for name, meets in SHARED_CLASSES + ONLY[gid]]
