"""Trusted checks of ps2-positions: fresh inputs for every hidden test cell, and llmarch as the reference.

The keys of ``CHECKS`` are the ``grade_id`` of the test cells in ``solutions/ps2-positions/ps2-positions.ipynb``.
"""

from __future__ import annotations

import numpy as np
import torch

from autograder.checks import Case, Check, FailureClass
from llmarch.positional import alibi_slopes, apply_rope, sinusoidal_encoding, t5_relative_bucket

NOTEBOOK = "ps2-positions.ipynb"
TRUSTED_CALLABLES: dict = {}


def ref_sinusoidal(n_positions, d, base=10000.0):
    return sinusoidal_encoding(int(n_positions), int(d), float(base)).double().numpy()


def ref_alibi(n_heads):
    return alibi_slopes(int(n_heads)).numpy()


def ref_t5(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    return t5_relative_bucket(torch.as_tensor(relative_position), bool(bidirectional), int(num_buckets),
                              int(max_distance)).numpy()


def ref_rope(x, positions, base=10000.0):
    return apply_rope(torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(positions), float(base)).numpy()


# Every `cases` function below starts with deterministic edge cases (the same for every seed), built so that each
# known wrong variant of tests/test_wrong_variants.py fails them every time; random cases come in addition.


def _sinusoidal_small(rng):
    return [Case((3, 4), note="the worked example: 3 positions, d = 4"), Case((1, 2), note="one position, d = 2"),
            Case((int(rng.integers(2, 6)), 2), note="a few positions, d = 2"),
            Case((int(rng.integers(2, 6)), 4), note="a few positions, d = 4")]


def _sinusoidal_values(rng):
    return [Case((5, 6), {"base": 100.0}, note="base 100, d = 6"), Case((12, 8), note="12 positions, d = 8"),
            Case((int(rng.integers(5, 40)), int(rng.choice([6, 8, 16, 64]))), note="random length and width"),
            Case((int(rng.integers(5, 20)), int(rng.choice([4, 10]))), {"base": float(rng.uniform(50, 500))},
                 note="a random base")]


def _alibi_power_of_two(rng):
    return [Case((n,), note=f"{n} head{'s' * (n > 1)}, a power of two")
            for n in (1, 2, int(rng.choice([4, 16, 32])))]


def _alibi_other(rng):
    others = rng.choice([5, 7, 10, 12, 20, 24, 40], size=2, replace=False)
    return ([Case((6,), note="6 heads, not a power of two"), Case((3,), note="3 heads, not a power of two")]
            + [Case((int(n),), note=f"{int(n)} heads, not a power of two") for n in others])


def _t5_exact(rng):
    nb = int(rng.choice([8, 16, 32]))
    return [Case((-np.arange(nb // 2),), {"bidirectional": False, "num_buckets": nb, "max_distance": 4 * nb},
                 note="small distances to past keys, one bucket each (causal)"),
            Case((np.arange(1, 6),), {"bidirectional": False, "num_buckets": nb, "max_distance": 4 * nb},
                 note="keys in the future, causal")]


def _t5_log(rng):
    nb, md = int(rng.choice([8, 16, 32])), int(rng.choice([20, 64, 128]))
    return [Case((-np.array([5, 6, 10, 12, 16, 1000]),),  # 16 = max_distance; 5 = the first log bucket
                 {"bidirectional": False, "num_buckets": 8, "max_distance": 16},
                 note="distances at the log buckets' edges, at max_distance and beyond, causal"),
            Case((-np.arange(0, 100),), {"bidirectional": False, "num_buckets": 16, "max_distance": 40},  # not 128
                 note="distances 0 to 99 with max_distance 40, causal"),
            Case((-np.arange(0, 300),), {"bidirectional": False, "num_buckets": nb, "max_distance": md},
                 note="distances 0 to 299, random bucket count and max_distance"),
            Case((-rng.integers(0, 2000, size=(4, 5)),), {"bidirectional": False, "num_buckets": 32, "max_distance": 128},
                 note="a (4, 5) array of random distances, causal")]


def _t5_bidirectional(rng):
    nb, md = int(rng.choice([8, 16, 32])), int(rng.choice([20, 64, 128]))
    return [Case((np.arange(-3, 4),), {"bidirectional": True, "num_buckets": 8, "max_distance": 16},
                 note="offsets -3 to 3, both directions"),
            Case((np.arange(-50, 51),), {"bidirectional": True, "num_buckets": 16, "max_distance": 24},
                 note="offsets -50 to 50, past max_distance on both sides"),
            Case((np.arange(-200, 201),), {"bidirectional": True, "num_buckets": nb, "max_distance": md},
                 note="offsets -200 to 200, random bucket count and max_distance")]


def _rope_small(rng):
    d = int(rng.choice([2, 4, 6]))
    return [Case((rng.normal(size=(4, 4)), np.arange(4)), note="d = 4: two pairs, so the pair layout matters"),
            Case((rng.normal(size=(1, 6)), np.array([3])), note="one token at position 3"),
            Case((rng.normal(size=(4, d)), np.arange(4)), note="four tokens, a random even d")]


def _rope_properties(rng):
    t = int(rng.integers(3, 8))
    return [Case((rng.normal(size=(2, 3, t, 8)), np.arange(t)), note="batch and head axes (B, H, T, d)"),
            Case((rng.normal(size=(t, 16)), rng.integers(1000, 5000, size=t)), {"base": 500000.0},
                 note="random positions from 1000 to 5000, base 500000")]


CHECKS = {
    "test_sinusoidal_small": Check("sinusoidal_encoding", _sinusoidal_small, ref_sinusoidal),
    "test_sinusoidal_values": Check("sinusoidal_encoding", _sinusoidal_values, ref_sinusoidal),
    "test_alibi_power_of_two": Check("alibi_slopes", _alibi_power_of_two, ref_alibi),
    "test_alibi_other": Check("alibi_slopes", _alibi_other, ref_alibi),
    "test_t5_exact": Check("t5_bucket", _t5_exact, ref_t5, rtol=0, atol=0),
    "test_t5_log": Check("t5_bucket", _t5_log, ref_t5, rtol=0, atol=0),
    "test_t5_bidirectional": Check("t5_bucket", _t5_bidirectional, ref_t5, rtol=0, atol=0),
    "test_rope_small": Check("apply_rope", _rope_small, ref_rope),
    # positions up to 5000: the angle is computed in float64 on both sides, so 1e-9 is plenty
    "test_rope_properties": Check("apply_rope", _rope_properties, ref_rope, rtol=1e-7, atol=1e-9),
}


# Failure classes: every draw of the hidden cases meets each one (tests/test_failure_classes.py).


def _t5_args(case):
    """(relative positions, bidirectional, num_buckets, max_distance) of a T5 case, defaults filled in."""
    kw = case.kwargs
    return (np.asarray(case.args[0]), kw.get("bidirectional", True), kw.get("num_buckets", 32),
            kw.get("max_distance", 128))


def _t5_log_rounds_up(case):
    """Some distance in the log range whose bucket, before flooring, has a fractional part of at least 1/2."""
    r, bidirectional, n, max_distance = _t5_args(case)
    n = n // 2 if bidirectional else n
    exact = n // 2
    a = np.abs(r) if bidirectional else -r
    a = a[(a >= exact) & (a < max_distance)]
    value = np.log(a / exact) / np.log(max_distance / exact) * (n - exact)
    return bool((value % 1 >= 0.5).any())


def _alibi_extra(n):
    """How many slopes come from the 2p sequence (0 for a power of two)."""
    return n - 2 ** int(np.floor(np.log2(n)))


FAILURE_CLASSES = [
    FailureClass("one position", "test_sinusoidal_small", lambda case: case.args[0] == 1),
    FailureClass("d = 2 (one frequency)", "test_sinusoidal_small", lambda case: case.args[1] == 2 and case.args[0] > 1),
    FailureClass("d = 4 (two frequencies: the exponent 2i/d matters)", "test_sinusoidal_small",
                 lambda case: case.args[1] == 4 and case.args[0] > 1),
    FailureClass("a base other than 10000", "test_sinusoidal_values",
                 lambda case: case.kwargs.get("base", 10000.0) != 10000.0),
    FailureClass("d of 8 or more (many frequencies)", "test_sinusoidal_values", lambda case: case.args[1] >= 8),
    FailureClass("one head", "test_alibi_power_of_two", lambda case: case.args[0] == 1),
    FailureClass("several heads, a power of two", "test_alibi_power_of_two",
                 lambda case: case.args[0] > 1 and _alibi_extra(case.args[0]) == 0),
    FailureClass("one slope from the 2p sequence", "test_alibi_other", lambda case: _alibi_extra(case.args[0]) == 1),
    FailureClass("several slopes from the 2p sequence (which of them, and how many)", "test_alibi_other",
                 lambda case: _alibi_extra(case.args[0]) >= 2),
    FailureClass("small distances to past keys (the exact buckets), causal", "test_t5_exact",
                 lambda case: not _t5_args(case)[1] and (_t5_args(case)[0] < 0).any()),
    FailureClass("keys in the future, causal (bucket 0)", "test_t5_exact",
                 lambda case: not _t5_args(case)[1] and (_t5_args(case)[0] > 0).any()),
    FailureClass("distances at and beyond max_distance (the clamp at n - 1)", "test_t5_log",
                 lambda case: (-_t5_args(case)[0] >= _t5_args(case)[3]).any()),
    FailureClass("a max_distance other than 128", "test_t5_log", lambda case: _t5_args(case)[3] != 128),
    FailureClass("a distance equal to n // 2 (the first log bucket)", "test_t5_log",
                 lambda case: (-_t5_args(case)[0] == _t5_args(case)[2] // 2).any()),
    FailureClass("a log bucket whose fractional part is at least 1/2 (floor, not round)", "test_t5_log",
                 _t5_log_rounds_up),
    FailureClass("offsets 0 and +1, both directions (which half a bucket is in)", "test_t5_bidirectional",
                 lambda case: _t5_args(case)[1] and {0, 1} <= set(_t5_args(case)[0].ravel().tolist())),
    FailureClass("offsets beyond max_distance on both sides, both directions", "test_t5_bidirectional",
                 lambda case: _t5_args(case)[1] and _t5_args(case)[0].min() <= -_t5_args(case)[3]
                 and _t5_args(case)[0].max() >= _t5_args(case)[3]),
    FailureClass("d = 4 (two pairs: the pair layout and frequencies matter)", "test_rope_small",
                 lambda case: case.args[0].shape[-1] == 4),
    FailureClass("a position that is not the token's index", "test_rope_small",
                 lambda case: not np.array_equal(case.args[1], np.arange(len(case.args[1])))),
    FailureClass("batch and head axes (B, H, T, d)", "test_rope_properties", lambda case: case.args[0].ndim == 4),
    FailureClass("a base other than 10000, positions above 1000", "test_rope_properties",
                 lambda case: case.kwargs.get("base", 10000.0) != 10000.0 and case.args[1].min() >= 1000),
]
